// Test support: the independent simulation of docs/design.md rules 1-13
// (tests/testing/zenflow_sim.h) as a Python module, `_zenflow_sim`, so that
// python/tests can compare zenflow.torch.ZenFlowOptimizer with it step by
// step. Not part of the zenflow package.
//
//   sim = _zenflow_sim.Sim(dict(S=2, R=4, delay=0, k=0.25),   # intervals=[1, 2]: auto S
//                          [(name, rows, cols, one_d, initial_values), ...])
//   sim.step(t, lr, grads)   # grads[rank][tensor]: row-major lists
//   sim.params(ti)
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "tests/testing/zenflow_sim.h"

namespace py = pybind11;

namespace {

using zenflow::testing::SimConfig;
using zenflow::testing::SimTensor;
using zenflow::testing::ZenFlowSim;

using PyTensor = std::tuple<std::string, int64_t, int64_t, bool, std::vector<float>>;

ZenFlowSim* Make(const py::dict& cfg, const std::vector<PyTensor>& tensors) {
  SimConfig c;
  for (auto item : cfg) {
    const std::string key = py::str(item.first);
    py::handle v = item.second;
    if (key == "world") c.world = v.cast<int>();
    else if (key == "S") c.S = v.cast<int>();
    else if (key == "R") c.R = v.cast<int>();
    else if (key == "warmup_rounds") c.warmup_rounds = v.cast<int>();
    else if (key == "delay") c.delay = v.cast<int>();
    else if (key == "k") c.k = v.cast<float>();
    else if (key == "zero_offload") c.zero_offload = v.cast<bool>();
    else if (key == "bf16_wire") c.bf16_wire = v.cast<bool>();
    else if (key == "intervals") {
      // update_interval auto with S = S_max: round r asks for
      // intervals[r % len] steps (clamped and cut as the engine's are).
      const std::vector<int32_t> s = v.cast<std::vector<int32_t>>();
      if (s.empty()) throw py::value_error("intervals must not be empty");
      c.auto_interval = true;
      c.interval_chooser = [s](int64_t round, int64_t) {
        return s[round % static_cast<int64_t>(s.size())];
      };
    }
    else if (key == "param_dtype") {
      const std::string d = v.cast<std::string>();
      if (d == "fp32") c.param_dtype = zenflow::testing::SimParamDType::kF32;
      else if (d == "bf16") c.param_dtype = zenflow::testing::SimParamDType::kBF16;
      else if (d == "fp16") c.param_dtype = zenflow::testing::SimParamDType::kF16;
      else throw py::value_error("param_dtype must be fp32, bf16 or fp16, got '" + d + "'");
    }
    else if (key == "predicted_step") c.predicted_step = v.cast<bool>();
    else if (key == "scale_round_step") c.scale_round_step = v.cast<bool>();
    else if (key == "local_step") c.local_step = v.cast<bool>();
    else if (key == "beta1") c.beta1 = v.cast<float>();
    else if (key == "beta2") c.beta2 = v.cast<float>();
    else if (key == "eps") c.eps = v.cast<float>();
    else if (key == "wd") c.wd = v.cast<float>();
    else throw py::key_error("unknown simulator setting '" + key + "'");
  }
  std::vector<SimTensor> ts;
  for (const PyTensor& t : tensors) {
    ts.push_back({std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t), std::get<4>(t)});
  }
  return new ZenFlowSim(c, std::move(ts));
}

}  // namespace

PYBIND11_MODULE(_zenflow_sim, m) {
  py::class_<ZenFlowSim>(m, "Sim")
      .def(py::init(&Make), py::arg("config"), py::arg("tensors"))
      .def("step", &ZenFlowSim::Step, py::arg("t"), py::arg("lr"), py::arg("grads"))
      .def("finish", &ZenFlowSim::Finish)
      .def("params", &ZenFlowSim::params, py::arg("tensor"))
      .def("important", &ZenFlowSim::important, py::arg("tensor"))
      .def("reselections", &ZenFlowSim::reselections)
      .def("local_steps", &ZenFlowSim::local_steps)
      .def("round_steps", &ZenFlowSim::round_steps);
}
