// Test support: the small job specs the daemon's unit tests start from.
#ifndef ZENFLOW_SERVER_TEST_SPECS_H_
#define ZENFLOW_SERVER_TEST_SPECS_H_

#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Job "unit": one 2 x 3 fp32 tensor "w", `world` ranks, update interval
// `interval`.
inline v1::JobSpec OneTensorSpec(int world, int interval) {
  v1::JobSpec spec;
  spec.set_job_id("unit");
  auto* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(2);
  t->add_shape(3);
  spec.set_world_size(world);
  spec.set_wire_dtype(v1::DTYPE_FP32);
  spec.mutable_zenflow()->set_update_interval(interval);
  return spec;
}

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_TEST_SPECS_H_
