// The Python extension module `_zenflow`: the worker engine
// (gpu_worker/engine/zenflow_optimizer.h) and the client library, for the `zenflow`
// package (python/zenflow). The worker-side rules live in the engine; this
// file only converts: Python values in, absl::Status out as
// zenflow.ZenFlowError(code, message).
//
//   w = _zenflow.Worker(spec_json, rank, target, transport, daemon_wait_s,
//                       connect_timeout_s, threads,
//                       [(name, shape, param_ptr, grad_ptr), ...], token="",
//                       tls_ca="", tls_cert="", tls_key="", tls_server_name="")
//   w.step(step, lr); w.finish(); w.last_step(); w.totals()
//   w.end_job(keep=False); w.close()                    # the run's end
//   w.drain(); w.local_state(); w.get_state(tensor)     # state_dict
//   w.set_state(state)                                  # load_state_dict
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/engine/zenflow_optimizer.h"
#include "google/protobuf/util/json_util.h"
#include "zenflow/v1/zenflow.pb.h"

namespace py = pybind11;

namespace zenflow {
namespace {

// A failed absl::Status on its way to Python.
struct StatusError {
  std::string code;
  std::string message;
};

void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError{absl::StatusCodeToString(s.code()), std::string(s.message())};
}

template <typename T>
T Take(absl::StatusOr<T> v) {
  Check(v.status());
  return std::move(*v);
}

// (name, shape, param data pointer, grad data pointer, param dtype "fp32",
// "bf16" or "fp16"): contiguous, in host memory, the gradient fp32; the
// zenflow package checks that before it gets here.
using PyParam = std::tuple<std::string, std::vector<int64_t>, uintptr_t, uintptr_t, std::string>;

class Worker {
 public:
  Worker(const std::string& spec_json, int rank, const std::string& target,
         const std::string& transport, double daemon_wait_s, double connect_timeout_s,
         int threads, const std::vector<PyParam>& params, const std::string& token,
         const std::string& tls_ca, const std::string& tls_cert, const std::string& tls_key,
         const std::string& tls_server_name) {
    v1::JobSpec want;
    google::protobuf::util::JsonParseOptions json;
    json.ignore_unknown_fields = false;
    const auto parsed = google::protobuf::util::JsonStringToMessage(spec_json, &want, json);
    if (!parsed.ok()) {
      Check(absl::InvalidArgumentError(
          absl::StrCat("the job settings do not make a JobSpec: ",
                       std::string(parsed.message().data(), parsed.message().size()))));
    }
    for (const PyParam& p : params) {
      ParamSpec s;
      s.name = std::get<0>(p);
      s.shape = std::get<1>(p);
      s.param = reinterpret_cast<void*>(std::get<2>(p));
      s.grad = reinterpret_cast<float*>(std::get<3>(p));
      const std::string& dt = std::get<4>(p);
      if (dt == "fp32") {
        s.dtype = DType::kF32;
      } else if (dt == "bf16") {
        s.dtype = DType::kBF16;
      } else if (dt == "fp16") {
        s.dtype = DType::kF16;
      } else {
        Check(absl::InvalidArgumentError(absl::StrCat("parameter '", s.name, "' has dtype '", dt,
                                                      "'; fp32, bf16 or fp16")));
      }
      specs_.push_back(std::move(s));
    }
    ClientOptions co;
    co.target = target;
    co.token = token;
    co.tls_ca = tls_ca;
    co.tls_cert = tls_cert;
    co.tls_key = tls_key;
    co.tls_server_name = tls_server_name;
    co.transport = Take(ParseTransport(transport));
    co.daemon_wait = absl::Seconds(daemon_wait_s);
    co.connect_timeout = absl::Seconds(connect_timeout_s);
    rank_ = rank;
    py::gil_scoped_release unlocked;
    backend_ = worker::MakeCpuBackend(threads);
    client_ = Take(Client::Connect(co));
    spec_ = Take(JoinOrCreateJob(client_.get(), want, rank, backend_.get(), specs_));
    opt_ = Take(ZenFlowOptimizer::Create(backend_.get(), client_.get(), spec_, rank, specs_));
  }

  void Step(int64_t step, float lr) {
    Live();
    py::gil_scoped_release unlocked;
    Check(opt_->Step(step, lr));
  }

  void Finish() {
    Live();
    py::gil_scoped_release unlocked;
    Check(opt_->Finish());
  }

  void Drain() {
    Live();
    py::gil_scoped_release unlocked;
    Check(opt_->Drain());
  }

  // The engine's columns: [{tensor, columns, values, m, v, update_counts}],
  // arrays as bytes (int32, float32, int64).
  py::list LocalState() {
    Live();
    std::vector<v1::ColumnState> states;
    {
      py::gil_scoped_release unlocked;
      states = Take(opt_->LocalState());
    }
    py::list out;
    for (const v1::ColumnState& cs : states) out.append(ToDict(cs));
    return out;
  }

  // The daemon's columns of `tensor` (those it updates now), as above.
  py::dict GetState(const std::string& tensor) {
    Live();
    v1::ColumnState cs;
    int64_t version = 0;
    {
      py::gil_scoped_release unlocked;
      cs = Take(client_->GetState(spec_.job_id(), tensor, &version));
    }
    py::dict d = ToDict(cs);
    d["selection_version"] = version;
    return d;
  }

  void SetState(const py::dict& state) {
    Live();
    const v1::ColumnState cs = FromDict(state);
    py::gil_scoped_release unlocked;
    Check(client_->SetState(spec_.job_id(), cs));
  }

  // This rank is done with the job: the daemon deletes it once every rank
  // is, unless one asked to keep it (docs/protocol.md, "When a job ends").
  // Returns {"ranks_finished", "deleted", "kept"}.
  py::dict EndJob(bool keep) {
    Live();
    v1::DeleteJobResponse r;
    {
      py::gil_scoped_release unlocked;
      r = Take(client_->FinishJob(spec_.job_id(), rank_, keep));
    }
    py::dict d;
    d["ranks_finished"] = r.ranks_finished();
    d["deleted"] = r.deleted();
    d["kept"] = r.kept();
    return d;
  }

  // Ends the engine and the connection (the job's end is EndJob's).
  void Close() {
    py::gil_scoped_release unlocked;
    opt_.reset();
    client_.reset();
    backend_.reset();
  }

  std::string SpecJson() const {
    std::string out;
    google::protobuf::util::JsonPrintOptions o;
    o.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(spec_, &out, o);
    return out;
  }

  py::dict LastStep() const {
    Live();
    const StepStats& s = opt_->last_step();
    py::dict d = Times(s);
    d["step"] = s.step;
    d["max_staleness_steps"] = s.max_staleness_steps;
    d["reselected"] = s.reselected;
    d["update_interval"] = s.update_interval;  // S of the step's round
    return d;
  }

  py::dict Totals() const {
    Live();
    const OptimizerTotals& t = opt_->totals();
    py::dict d = Times(t);
    d["steps"] = t.steps;
    d["reselections"] = t.reselections;
    d["rounds_closed"] = t.rounds_closed;
    d["round_steps"] = t.round_steps;  // / rounds_closed: the mean S
    // The mean update divergence of the measured rounds (docs/design.md
    // rule 14); None when none was measured.
    if (t.divergence_rounds > 0) {
      d["divergence"] = t.divergence_sum / static_cast<double>(t.divergence_rounds);
    } else {
      d["divergence"] = py::none();
    }
    d["reconnects"] = client_->stats().reconnects;
    d["selection_version"] = opt_->selection_version();
    return d;
  }

 private:
  void Live() const {
    if (opt_ == nullptr) {
      throw StatusError{"FAILED_PRECONDITION", "the optimizer was closed"};
    }
  }

  // The figures a step and the totals share (StepStats, OptimizerTotals).
  template <typename T>
  static py::dict Times(const T& s) {
    py::dict d;
    d["stall_seconds"] = s.stall_seconds;
    d["send_blocked_seconds"] = s.send_blocked_seconds;
    d["step_seconds"] = s.step_seconds;
    d["bytes_sent"] = s.bytes_sent;
    d["bytes_received"] = s.bytes_received;
    d["rounds_applied"] = s.rounds_applied;
    return d;
  }

  template <typename T>
  static py::bytes Bytes(const google::protobuf::RepeatedField<T>& f) {
    return py::bytes(reinterpret_cast<const char*>(f.data()), f.size() * sizeof(T));
  }

  template <typename T>
  static void Fill(const py::dict& d, const char* key, google::protobuf::RepeatedField<T>* f) {
    if (!d.contains(key)) {
      throw StatusError{"INVALID_ARGUMENT", std::string("the state has no '") + key + "'"};
    }
    const std::string b = d[key].cast<std::string>();
    if (b.size() % sizeof(T) != 0) {
      throw StatusError{"INVALID_ARGUMENT",
                        std::string("'") + key + "' is not a whole number of values"};
    }
    f->Resize(static_cast<int>(b.size() / sizeof(T)), T{});
    if (!b.empty()) std::memcpy(f->mutable_data(), b.data(), b.size());
  }

  static py::dict ToDict(const v1::ColumnState& cs) {
    py::dict d;
    d["tensor"] = cs.tensor();
    d["columns"] = Bytes(cs.columns());
    d["values"] = Bytes(cs.values());
    d["m"] = Bytes(cs.m());
    d["v"] = Bytes(cs.v());
    d["update_counts"] = Bytes(cs.update_counts());
    return d;
  }

  static v1::ColumnState FromDict(const py::dict& d) {
    v1::ColumnState cs;
    if (!d.contains("tensor")) throw StatusError{"INVALID_ARGUMENT", "the state has no 'tensor'"};
    cs.set_tensor(d["tensor"].cast<std::string>());
    Fill(d, "columns", cs.mutable_columns());
    Fill(d, "values", cs.mutable_values());
    Fill(d, "m", cs.mutable_m());
    Fill(d, "v", cs.mutable_v());
    Fill(d, "update_counts", cs.mutable_update_counts());
    return cs;
  }

  std::vector<ParamSpec> specs_;
  int rank_ = 0;
  std::unique_ptr<worker::Backend> backend_;
  std::unique_ptr<Client> client_;
  v1::JobSpec spec_;
  std::unique_ptr<ZenFlowOptimizer> opt_;
};

}  // namespace
}  // namespace zenflow

PYBIND11_MODULE(_zenflow, m) {
  using zenflow::StatusError;
  using zenflow::Worker;
  m.doc() = "zenflowd's worker engine and client (use the zenflow package)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object cls = py::module_::import("zenflow.errors").attr("ZenFlowError");
      py::object err = cls(e.code, e.message);
      PyErr_SetObject(cls.ptr(), err.ptr());
    }
  });
  py::class_<Worker>(m, "Worker")
      .def(py::init<const std::string&, int, const std::string&, const std::string&, double,
                    double, int, const std::vector<zenflow::PyParam>&, const std::string&,
                    const std::string&, const std::string&, const std::string&,
                    const std::string&>(),
           py::arg("spec_json"), py::arg("rank"), py::arg("target"), py::arg("transport"),
           py::arg("daemon_wait_s"), py::arg("connect_timeout_s"), py::arg("threads"),
           py::arg("params"), py::arg("token") = "", py::arg("tls_ca") = "",
           py::arg("tls_cert") = "", py::arg("tls_key") = "", py::arg("tls_server_name") = "")
      .def("step", &Worker::Step, py::arg("step"), py::arg("lr"))
      .def("finish", &Worker::Finish)
      .def("drain", &Worker::Drain)
      .def("local_state", &Worker::LocalState)
      .def("get_state", &Worker::GetState, py::arg("tensor"))
      .def("set_state", &Worker::SetState, py::arg("state"))

      .def("end_job", &Worker::EndJob, py::arg("keep") = false)
      .def("close", &Worker::Close)
      .def("spec_json", &Worker::SpecJson)
      .def("last_step", &Worker::LastStep)
      .def("totals", &Worker::Totals);
}
