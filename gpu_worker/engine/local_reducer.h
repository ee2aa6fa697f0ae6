// A GradientReducer for ranks that are threads of one process (for example
// one thread per GPU, or the benchmarks' emulated ranks): every rank's call
// for a step waits for the others', then each part becomes the mean over
// the ranks, summed in rank order and scaled by 1/world, exactly as the
// daemon's AllReduce computes it (so a job gives the same bits either way).
//
//   LocalReducer group(/*world=*/2);
//   opt0->set_gradient_reducer(group.ForRank(0));   // in rank 0's thread
//   opt1->set_gradient_reducer(group.ForRank(1));   // in rank 1's thread
//
// The parts are read and written through plain pointers: the backend's
// memory must be host memory (the CPU backend; the EMULATED one, with
// Arithmetic::kNone, whose memory holds no numerics: then the call is the
// rendezvous alone, standing for a device collective whose cost the host
// does not pay).
#ifndef ZENFLOW_GPU_WORKER_ENGINE_LOCAL_REDUCER_H_
#define ZENFLOW_GPU_WORKER_ENGINE_LOCAL_REDUCER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "gpu_worker/engine/zenflow_optimizer.h"

namespace zenflow {

// Thread-safe: one thread per rank calls its ForRank() reducer.
class LocalReducer {
 public:
  enum class Arithmetic { kMean, kNone };
  // A rank that does not arrive within `timeout` fails the step on the
  // others (DEADLINE_EXCEEDED) and every later call.
  explicit LocalReducer(int world, Arithmetic arithmetic = Arithmetic::kMean,
                        absl::Duration timeout = absl::Minutes(10));
  LocalReducer(const LocalReducer&) = delete;
  LocalReducer& operator=(const LocalReducer&) = delete;

  // Rank `rank`'s reducer; it refers to this object, which must outlive it.
  GradientReducer ForRank(int rank);
  // Rendezvous completed so far.
  int64_t completed();

 private:
  absl::Status Reduce(int rank, int64_t step, const std::vector<ReducePart>& parts);
  // Every rank is in: checks that they sent the same parts and reduces.
  absl::Status CombineLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int world_;
  const Arithmetic arithmetic_;
  const absl::Duration timeout_;
  Mutex mu_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // completed rendezvous
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t step_ ABSL_GUARDED_BY(mu_) = -1;  // of the rendezvous being gathered
  std::vector<const std::vector<ReducePart>*> parts_ ABSL_GUARDED_BY(mu_);
  absl::Status result_ ABSL_GUARDED_BY(mu_);  // of the last rendezvous
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // set for good by a timeout
};

}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_ENGINE_LOCAL_REDUCER_H_
