// Fuzz target "all_reduce": AllReduce calls (and their cancellation) against
// a real job's rendezvous (Job::AllReduce, server/all_reduce_barrier.h).
//
// Input: a config byte (world size 1 + config % 3), then records:
//   tag % 4 == 0: a v1.AllReduceRequest's bytes (its own rank)
//   tag % 4 == 1: the same, its rank replaced by (tag / 4) % world
//   tag % 4 == 2: withdraw (cancel) call number body[0] % calls made
//   tag % 4 == 3: delete the job (later calls are refused)
// Properties checked: every call is answered at most once, and exactly once
// by the job's deletion unless it was withdrawn while waiting (then never);
// a call's success answers its parts' names and sizes, and every waiter of
// one step gets the same bits, which (in inputs without replays) are the
// mean of the calls waiting, summed in rank order; with one rank the mean is
// the part itself.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <memory>
#include <vector>

#include "fuzz/check.h"
#include "fuzz/fuzz_job.h"
#include "fuzz/input.h"

namespace zenflow {
namespace fuzz {
namespace {

struct Call {
  v1::AllReduceRequest req;
  int answers = 0;
  bool withdrawn = false;  // while still waiting
  absl::StatusOr<v1::AllReduceResponse> answer = absl::UnknownError("unanswered");
};

struct Calls {
  std::vector<std::unique_ptr<Call>> all;
  std::vector<Call*> answered_now;  // during one AllReduce call
  // The model: by step, by rank, the parts of the rank's waiting call. Kept
  // while the input has no replay and no deletion (both drop or keep parts
  // by rules of their own).
  bool modelled = true;
  std::map<int64_t, std::map<int32_t, const v1::AllReduceRequest*>> held;
};

// The mean of `parts` (one request per rank, in rank order) as the daemon
// defines it: summed in rank order from 0, then times 1/world.
std::vector<std::string> RankOrderMean(const std::map<int32_t, const v1::AllReduceRequest*>& parts,
                                       int world) {
  std::vector<std::string> out;
  const v1::AllReduceRequest& shape = *parts.begin()->second;
  const float inv = 1.0f / static_cast<float>(world);
  for (int i = 0; i < shape.parts_size(); ++i) {
    const size_t n = shape.parts(i).payload().size() / 4;
    std::vector<float> sum(n, 0.0f);
    for (const auto& [rank, req] : parts) {
      for (size_t k = 0; k < n; ++k) {
        float x;
        std::memcpy(&x, req->parts(i).payload().data() + 4 * k, 4);
        sum[k] += x;
      }
    }
    for (float& x : sum) x *= inv;
    out.emplace_back(reinterpret_cast<const char*>(sum.data()), n * 4);
  }
  return out;
}

// A successful answer to a call (not a replay) has the call's parts' names
// and sizes; with one rank, their values.
void CheckAnswer(const Call& c, int world) {
  if (!c.answer.ok() || c.req.replay()) return;
  const v1::AllReduceResponse& resp = *c.answer;
  FUZZ_CHECK(resp.parts_size() == c.req.parts_size(), "all-reduce of ", c.req.parts_size(),
             " parts answered with ", resp.parts_size());
  for (int i = 0; i < resp.parts_size(); ++i) {
    FUZZ_CHECK(resp.parts(i).name() == c.req.parts(i).name() &&
                   resp.parts(i).payload().size() == c.req.parts(i).payload().size(),
               "all-reduce part ", i, " answered with another name or size");
    if (world != 1) continue;
    // The mean of one rank's values is the values (-0 may come back as +0).
    const std::string& got = resp.parts(i).payload();
    const std::string& sent = c.req.parts(i).payload();
    for (size_t k = 0; k + 4 <= got.size(); k += 4) {
      float a, b;
      std::memcpy(&a, got.data() + k, 4);
      std::memcpy(&b, sent.data() + k, 4);
      FUZZ_CHECK(a == b, "one-rank all-reduce of ", b, " gives ", a);
    }
  }
}

}  // namespace
}  // namespace fuzz
}  // namespace zenflow

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zenflow;
  using namespace zenflow::fuzz;
  FuzzInput in(data, size);
  const int world = 1 + in.Byte() % 3;
  v1::JobSpec spec;
  spec.set_job_id("allreduce");
  v1::TensorSpec* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(2);
  t->add_shape(2);
  spec.set_world_size(world);
  absl::StatusOr<FuzzJob> job = CreateFuzzJob(spec);
  FUZZ_CHECK(job.ok(), job.status().ToString());
  const absl::Status up = UploadAndJoin(*job);
  FUZZ_CHECK(up.ok(), up.ToString());

  Calls calls;
  while (std::optional<FuzzRecord> r = in.Record()) {
    const int kind = r->tag % 4;
    calls.answered_now.clear();
    if (kind == 0 || kind == 1) {
      auto c = std::make_unique<Call>();
      if (!ParseRequest(r->body, &c->req).ok()) continue;
      if (kind == 1) c->req.set_rank(static_cast<int32_t>((r->tag / 4) % world));
      Call* raw = c.get();
      if (raw->req.replay()) calls.modelled = false;
      calls.all.push_back(std::move(c));
      Calls* all = &calls;
      job->job->AllReduce(raw->req, calls.all.size(),
                          [raw, all](absl::StatusOr<v1::AllReduceResponse> a) {
                            FUZZ_CHECK(raw->answers == 0, "an all-reduce call answered twice");
                            FUZZ_CHECK(!raw->withdrawn, "a withdrawn all-reduce call was answered");
                            ++raw->answers;
                            raw->answer = std::move(a);
                            all->answered_now.push_back(raw);
                          });
      // The waiters of one step are answered together, inside the call that
      // completed it: with the same bits.
      const std::string* mean = nullptr;
      std::string first;
      for (Call* a : calls.answered_now) {
        CheckAnswer(*a, world);
        if (!a->answer.ok() || a->req.replay()) continue;
        const std::string bits = a->answer->SerializeAsString();
        if (mean == nullptr) {
          first = bits;
          mean = &first;
        }
        FUZZ_CHECK(bits == *mean, "the waiters of one all-reduce got different means");
      }
      // Rejected: answered now, with an error. Otherwise it waits (its
      // parts replace the rank's earlier call of the step), or it was the
      // last rank in and the step's mean is every held part's.
      const bool rejected = raw->answers == 1 && !raw->answer.ok();
      if (calls.modelled && !rejected) {
        auto& step = calls.held[raw->req.step()];
        step[raw->req.rank()] = &raw->req;
        if (raw->answers == 1) {
          FUZZ_CHECK(static_cast<int>(step.size()) == world, "all-reduce of step ",
                     raw->req.step(), " completed with ", step.size(), " of ", world,
                     " ranks' calls waiting");
          const std::vector<std::string> want = RankOrderMean(step, world);
          for (int i = 0; i < raw->answer->parts_size(); ++i) {
            FUZZ_CHECK(raw->answer->parts(i).payload() == want[i], "all-reduce part ", i,
                       " of step ", raw->req.step(), " is not the rank-order mean");
          }
          calls.held.erase(raw->req.step());
        }
      }
    } else if (kind == 2) {
      if (calls.all.empty() || r->body.empty()) continue;
      const size_t i = static_cast<uint8_t>(r->body[0]) % calls.all.size();
      Call* c = calls.all[i].get();
      if (c->answers == 0) {
        c->withdrawn = true;
        auto step = calls.held.find(c->req.step());
        if (step != calls.held.end() && step->second.count(c->req.rank()) > 0 &&
            step->second[c->req.rank()] == &c->req) {
          step->second.erase(c->req.rank());
        }
      }
      job->job->WithdrawAllReduce(c->req.rank(), i + 1);
    } else {
      DeleteAllJobs();
      calls.modelled = false;
    }
  }
  DeleteAllJobs();
  for (const auto& c : calls.all) {
    FUZZ_CHECK(c->answers == (c->withdrawn ? 0 : 1), "all-reduce call of rank ",
               c->req.rank(), " step ", c->req.step(), " answered ", c->answers,
               " times (withdrawn: ", c->withdrawn, ")");
  }
  return 0;
}
