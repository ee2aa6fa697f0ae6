// The Python extension module `_zenflow`: the framework-neutral worker
// (gpu_worker/engine/array_worker.h: the engine, its backend and the client
// library), for the `zenflow` package (python/zenflow). The worker-side
// rules live in the engine; this file only converts: Python values in,
// absl::Status out as zenflow.ZenFlowError(code, message). No framework is
// linked: parameters and gradients are any objects that expose
// `__cuda_array_interface__` (device memory: the CUDA backend) or
// `__array_interface__` (host memory: the CPU backend), and `stream` is the
// producer's CUDA stream as an integer (torch.cuda.current_stream().cuda_stream).
//
//   w = _zenflow.Worker(spec_json, rank, target, transport, daemon_wait_s,
//                       connect_timeout_s, threads,
//                       [(name, param_array, grad_array), ...], stream=0, token="",
//                       tls_ca="", tls_cert="", tls_key="", tls_server_name="")
//   w.step(step, lr, stream=None); w.finish(stream=None); w.last_step(); w.totals()
//   w.end_job(keep=False); w.close()                    # the run's end
//   w.drain(stream=None); w.local_state(stream=None); w.get_state(tensor)   # state_dict
//   w.set_state(state)                                  # load_state_dict
//   w.backend(), w.device()                             # "cpu" / "cuda", its device
// (stream=None: the stream given when the worker was made.)
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gpu_worker/engine/array_worker.h"
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

// (name, parameter array, gradient array): objects with an array interface.
using PyParam = std::tuple<std::string, py::object, py::object>;

// The first field's name of an interface's descr ("bfloat16" marks bf16).
std::string DescrName(const py::dict& d) {
  if (!d.contains("descr") || d["descr"].is_none()) return "";
  py::list descr = d["descr"].cast<py::list>();
  if (descr.size() == 0) return "";
  py::tuple field = descr[0].cast<py::tuple>();
  return field.size() > 0 ? field[0].cast<std::string>() : "";
}

// One array from its __cuda_array_interface__ (device) or
// __array_interface__ (host), as NumPy's and Numba's protocols define them.
ArrayRef FromInterface(const std::string& name, const char* what, const py::handle& obj) {
  const std::string who = absl::StrCat(what, " of parameter '", name, "'");
  auto bad = [&](const std::string& why) {
    return StatusError{"INVALID_ARGUMENT", absl::StrCat(who, ": ", why)};
  };
  ArrayRef a;
  py::object iface;
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    iface = obj.attr("__cuda_array_interface__");
    a.device = true;
  } else if (py::hasattr(obj, "__array_interface__")) {
    iface = obj.attr("__array_interface__");
  } else {
    throw bad(absl::StrCat("a ", std::string(py::str(py::type::of(obj).attr("__name__"))),
                           " exposes neither __cuda_array_interface__ nor __array_interface__ "
                           "(pass a torch tensor's data, a CuPy or NumPy array)"));
  }
  if (!py::isinstance<py::dict>(iface)) throw bad("its array interface is not a dict");
  const py::dict d = iface.cast<py::dict>();
  try {
    if (d.contains("mask") && !d["mask"].is_none()) throw bad("masked arrays are not supported");
    if (!d.contains("data") || !py::isinstance<py::tuple>(d["data"])) {
      throw bad("the interface's data must be a (pointer, read-only) pair");
    }
    const py::tuple data = d["data"].cast<py::tuple>();
    if (data.size() != 2) throw bad("the interface's data must be a (pointer, read-only) pair");
    a.data = data[0].is_none() ? 0 : data[0].cast<uintptr_t>();
    a.readonly = data[1].cast<bool>();
    a.shape = d["shape"].cast<std::vector<int64_t>>();
    a.typestr = d["typestr"].cast<std::string>();
    if (d.contains("strides") && !d["strides"].is_none()) {
      a.strides = d["strides"].cast<std::vector<int64_t>>();
    }
    a.elem = ElemTypeOf(a.typestr, DescrName(d));
  } catch (const py::error_already_set& e) {
    throw bad(absl::StrCat("its array interface cannot be read: ", e.what()));
  } catch (const py::cast_error& e) {
    throw bad(absl::StrCat("its array interface cannot be read: ", e.what()));
  }
  return a;
}

class Worker {
 public:
  Worker(const std::string& spec_json, int rank, const std::string& target,
         const std::string& transport, double daemon_wait_s, double connect_timeout_s,
         int threads, const std::vector<PyParam>& params, uintptr_t stream,
         const std::string& token, const std::string& tls_ca, const std::string& tls_cert,
         const std::string& tls_key, const std::string& tls_server_name)
      : stream_(stream) {
    ArrayWorkerOptions o;
    google::protobuf::util::JsonParseOptions json;
    json.ignore_unknown_fields = false;
    const auto parsed = google::protobuf::util::JsonStringToMessage(spec_json, &o.want, json);
    if (!parsed.ok()) {
      Check(absl::InvalidArgumentError(
          absl::StrCat("the job settings do not make a JobSpec: ",
                       std::string(parsed.message().data(), parsed.message().size()))));
    }
    std::vector<ArrayParam> arrays;
    for (const PyParam& p : params) {
      ArrayParam a;
      a.name = std::get<0>(p);
      a.param = FromInterface(a.name, "parameter", std::get<1>(p));
      a.grad = FromInterface(a.name, "the gradient", std::get<2>(p));
      arrays.push_back(std::move(a));
    }
    o.rank = rank;
    o.threads = threads;
    o.stream = stream;
    o.client.target = target;
    o.client.token = token;
    o.client.tls_ca = tls_ca;
    o.client.tls_cert = tls_cert;
    o.client.tls_key = tls_key;
    o.client.tls_server_name = tls_server_name;
    o.client.transport = Take(ParseTransport(transport));
    o.client.daemon_wait = absl::Seconds(daemon_wait_s);
    o.client.connect_timeout = absl::Seconds(connect_timeout_s);
    py::gil_scoped_release unlocked;
    w_ = Take(ArrayWorker::Create(o, arrays));
  }

  void Step(int64_t step, float lr, std::optional<uintptr_t> stream) {
    Live();
    py::gil_scoped_release unlocked;
    Check(w_->Step(step, lr, stream.value_or(stream_)));
  }

  void Finish(std::optional<uintptr_t> stream) {
    Live();
    py::gil_scoped_release unlocked;
    Check(w_->Finish(stream.value_or(stream_)));
  }

  void Drain(std::optional<uintptr_t> stream) {
    Live();
    py::gil_scoped_release unlocked;
    Check(w_->Drain(stream.value_or(stream_)));
  }

  // The engine's columns: [{tensor, columns, values, m, v, update_counts}],
  // arrays as bytes (int32, float32, int64).
  py::list LocalState(std::optional<uintptr_t> stream) {
    Live();
    std::vector<v1::ColumnState> states;
    {
      py::gil_scoped_release unlocked;
      states = Take(w_->LocalState(stream.value_or(stream_)));
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
      cs = Take(w_->GetState(tensor, &version));
    }
    py::dict d = ToDict(cs);
    d["selection_version"] = version;
    return d;
  }

  void SetState(const py::dict& state) {
    Live();
    const v1::ColumnState cs = FromDict(state);
    py::gil_scoped_release unlocked;
    Check(w_->SetState(cs));
  }

  // This rank is done with the job: the daemon deletes it once every rank
  // is, unless one asked to keep it (docs/protocol.md, "When a job ends").
  // Returns {"ranks_finished", "deleted", "kept"}.
  py::dict EndJob(bool keep) {
    Live();
    v1::DeleteJobResponse r;
    {
      py::gil_scoped_release unlocked;
      r = Take(w_->EndJob(keep));
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
    if (w_ != nullptr) w_->Close();
  }

  // "cpu" (host arrays) or "cuda" (device arrays), and the CUDA device (-1: none).
  std::string Backend() const { return w_->backend_name(); }
  int Device() const { return w_->device(); }

  std::string SpecJson() const {
    std::string out;
    google::protobuf::util::JsonPrintOptions o;
    o.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(w_->spec(), &out, o);
    return out;
  }

  py::dict LastStep() const {
    Live();
    const StepStats& s = w_->optimizer().last_step();
    py::dict d = Times(s);
    d["step"] = s.step;
    d["max_staleness_steps"] = s.max_staleness_steps;
    d["reselected"] = s.reselected;
    d["update_interval"] = s.update_interval;  // S of the step's round
    return d;
  }

  py::dict Totals() const {
    Live();
    const OptimizerTotals& t = w_->optimizer().totals();
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
    d["reconnects"] = w_->client().stats().reconnects;
    d["selection_version"] = w_->optimizer().selection_version();
    return d;
  }

 private:
  void Live() const {
    if (w_ == nullptr || w_->closed()) {
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
  const uintptr_t stream_;
  std::unique_ptr<ArrayWorker> w_;
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
                    double, int, const std::vector<zenflow::PyParam>&, uintptr_t,
                    const std::string&, const std::string&, const std::string&,
                    const std::string&, const std::string&>(),
           py::arg("spec_json"), py::arg("rank"), py::arg("target"), py::arg("transport"),
           py::arg("daemon_wait_s"), py::arg("connect_timeout_s"), py::arg("threads"),
           py::arg("params"), py::arg("stream") = 0, py::arg("token") = "",
           py::arg("tls_ca") = "", py::arg("tls_cert") = "", py::arg("tls_key") = "",
           py::arg("tls_server_name") = "")
      .def("step", &Worker::Step, py::arg("step"), py::arg("lr"), py::arg("stream") = py::none())
      .def("finish", &Worker::Finish, py::arg("stream") = py::none())
      .def("drain", &Worker::Drain, py::arg("stream") = py::none())
      .def("local_state", &Worker::LocalState, py::arg("stream") = py::none())
      .def("get_state", &Worker::GetState, py::arg("tensor"))
      .def("set_state", &Worker::SetState, py::arg("state"))
      .def("end_job", &Worker::EndJob, py::arg("keep") = false)
      .def("close", &Worker::Close)
      .def("backend", &Worker::Backend)
      .def("device", &Worker::Device)
      .def("spec_json", &Worker::SpecJson)
      .def("last_step", &Worker::LastStep)
      .def("totals", &Worker::Totals);
}
