// The worker engine (gpu_worker/engine/zenflow_optimizer, CPU backend) against a
// real zenflowd over loopback gRPC, compared with an independent simulation
// of the rules (tests/testing/zenflow_sim.h) and with local AdamW.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/device_buffer.h"
#include "gpu_worker/engine/zenflow_optimizer.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_driver.h"
#include "tests/testing/harness.h"
#include "common/status_macros.h"
#include "tests/testing/status_macros.h"

namespace zenflow::testing {
namespace {

// A chooser of round lengths that cycles through `s` by round number.
IntervalChooser Cycle(std::vector<int32_t> s) {
  return [s](int64_t round, int64_t) { return s[round % static_cast<int64_t>(s.size())]; };
}

class WorkerEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new DaemonProcess();
    const absl::Status s = daemon_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    EXPECT_TRUE(daemon_->Stop().ok());
    delete daemon_;
  }
  EngineJob Job(const std::string& id) {
    EngineJob j;
    j.target = daemon_->target();
    j.job_id = id;
    return j;
  }
  // update_interval auto with S_max 4, reselecting every 8 steps, 2 ranks,
  // apply delay `delay`, round lengths cycling through `chooser`.
  EngineJob AutoJob(const std::string& id, int delay, std::vector<int32_t> chooser) {
    EngineJob j = Job(id);
    j.cfg.world = 2;
    j.cfg.S = 4;
    j.cfg.R = 8;
    j.cfg.delay = delay;
    j.cfg.auto_interval = true;
    j.cfg.interval_chooser = Cycle(std::move(chooser));
    return j;
  }
  // The predicted step's jobs: S = 1, delay 1, reselecting every 4 steps.
  EngineJob PredictedJob(const std::string& id, int world, int steps) {
    EngineJob j = Job(id);
    j.cfg.world = world;
    j.cfg.S = 1;
    j.cfg.R = 4;
    j.cfg.delay = 1;
    j.steps = steps;
    return j;
  }
  static DaemonProcess* daemon_;
};

DaemonProcess* WorkerEngineTest::daemon_ = nullptr;

// The round lengths S(r) chosen from the first step on, as every step sees
// them: each round's S repeated S times, cut at `steps`.
std::vector<int32_t> PerStep(const std::vector<int32_t>& chosen, int64_t steps) {
  std::vector<int32_t> out;
  for (int32_t s : chosen) out.insert(out.end(), s, s);
  out.resize(steps, -1);
  return out;
}

// `chosen`, if not empty: the round lengths the job must run with (auto
// update interval), worked out by hand; checked on every rank's steps and
// on the simulator's rounds (a partial last round closes with the steps it
// has).
void ExpectMatchesSim(const EngineJob& job, const std::vector<int32_t>& chosen = {}) {
  std::vector<std::vector<int32_t>> intervals;
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> ranks =
      RunEngineRanks(job, &intervals);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  if (!chosen.empty()) {
    const std::vector<int32_t> per_step = PerStep(chosen, job.steps);
    for (size_t r = 0; r < intervals.size(); ++r) {
      EXPECT_EQ(intervals[r], per_step) << "rank " << r << "'s update_interval per step";
    }
  }
  for (size_t r = 1; r < ranks->size(); ++r) {
    for (size_t t = 0; t < (*ranks)[0].size(); ++t) {
      ASSERT_EQ(std::memcmp((*ranks)[r][t].data(), (*ranks)[0][t].data(), (*ranks)[0][t].size() * 4), 0)
          << "rank " << r << " differs from rank 0 in tensor " << t;
    }
  }
  std::vector<int32_t> sim_rounds;
  std::vector<std::vector<float>> sim = RunSim(job, &sim_rounds);
  if (!chosen.empty()) {
    std::vector<int32_t> closed = chosen;
    int64_t before = 0;
    for (size_t i = 0; i + 1 < closed.size(); ++i) before += closed[i];
    closed.back() = static_cast<int32_t>(std::min<int64_t>(closed.back(), job.steps - before));
    EXPECT_EQ(sim_rounds, closed) << "the simulator's rounds";
  }
  std::string where;
  const double e = Mismatch((*ranks)[0], sim, 2e-5, 1e-4, &where);
  EXPECT_LE(e, 1.0) << "engine vs simulator: " << where;
  // The comparison can tell the rules apart: the same job with another
  // apply delay (or, for zero_offload, with zenflow's split) does not match.
  EngineJob other = job;
  if (job.cfg.zero_offload) {
    other.cfg.zero_offload = false;
  } else {
    other.cfg.delay = job.cfg.delay == 1 ? 0 : 1;
  }
  EXPECT_GT(Mismatch((*ranks)[0], RunSim(other), 2e-5, 1e-4, &where), 1.0)
      << "the engine also matches a simulation with other rules";
  if (job.cfg.auto_interval) {  // nor with a fixed update interval
    other = job;
    other.cfg.auto_interval = false;
    EXPECT_GT(Mismatch((*ranks)[0], RunSim(other), 2e-5, 1e-4, &where), 1.0)
        << "the engine also matches a simulation with a fixed update interval";
  }
  // And the run really moved the parameters.
  std::vector<std::vector<float>> init;
  for (const SimTensor& t : EngineModel()) init.push_back(t.w);
  EXPECT_GT(Mismatch(sim, init, 1e-3, 0, &where), 1.0);
}

// bf16 / fp16 parameters: every rank's parameters are values of the dtype,
// bit-identical across ranks, and equal the simulator's bit for bit. The
// fp32 masters (the workers' of the important columns, the daemon's of the
// rest) agree with the simulator's to fp32 rounding only (SIMD AdamW may
// contract a multiply-add that the simulator rounds twice), so a master
// lying within that rounding of a midpoint between two 16-bit values
// could round the other way; the equality below shows none did, and any
// element that ever differs must still be a neighbour (one unit in the
// last place) of the simulator's.
void ExpectMatchesSim16(const EngineJob& job) {
  ASSERT_NE(job.cfg.param_dtype, SimParamDType::kF32);
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> ranks = RunEngineRanks(job);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  const std::vector<std::vector<float>>& got = (*ranks)[0];
  for (size_t r = 1; r < ranks->size(); ++r) {
    for (size_t t = 0; t < got.size(); ++t) {
      ASSERT_EQ(std::memcmp((*ranks)[r][t].data(), got[t].data(), got[t].size() * 4), 0)
          << "rank " << r << " differs from rank 0 in tensor " << t;
    }
  }
  const bool bf16 = job.cfg.param_dtype == SimParamDType::kBF16;
  auto round = [bf16](float x) { return bf16 ? RoundToBf16(x) : RoundToF16(x); };
  const std::vector<std::vector<float>> sim = RunSim(job);
  int64_t differ = 0, total = 0;
  std::string first;
  for (size_t t = 0; t < got.size(); ++t) {
    for (size_t i = 0; i < got[t].size(); ++i) {
      ASSERT_EQ(round(got[t][i]), got[t][i]) << "tensor " << t << " element " << i
                                              << " is not a value of the parameter dtype";
      ++total;
      if (std::memcmp(&got[t][i], &sim[t][i], 4) == 0) continue;
      ++differ;
      if (first.empty()) first = absl::StrCat("tensor ", t, " element ", i, ": ", got[t][i], " vs ", sim[t][i]);
      // A neighbour: the value halfway to it rounds to one of the two.
      const float mid = 0.5f * (got[t][i] + sim[t][i]);
      EXPECT_TRUE(round(mid) == got[t][i] || round(mid) == sim[t][i])
          << "tensor " << t << " element " << i << ": " << got[t][i] << " vs " << sim[t][i]
          << " are more than one unit in the last place apart";
    }
  }
  EXPECT_EQ(differ, 0) << differ << " of " << total
                       << " parameters differ from the simulator's; first: " << first;
  // The comparison can tell the rules apart: other apply delays do not
  // match, and neither does the same job with fp32 parameters.
  std::string where;
  EngineJob other = job;
  other.cfg.delay = job.cfg.delay == 1 ? 0 : 1;
  EXPECT_GT(Mismatch(got, RunSim(other), 1e-4, 1e-3, &where), 1.0)
      << "the engine also matches a simulation with another apply delay";
  other = job;
  other.cfg.param_dtype = SimParamDType::kF32;
  EXPECT_GT(Mismatch(got, RunSim(other), 1e-9, 0, &where), 1.0)
      << "the engine also matches a simulation with fp32 parameters";
  std::vector<std::vector<float>> init;
  for (const SimTensor& t : EngineModel()) init.push_back(t.w);
  EXPECT_GT(Mismatch(sim, init, 1e-3, 0, &where), 1.0);
}

TEST_F(WorkerEngineTest, Bf16ParamsOneRankMatchSimulatorBitForBitAcrossReselections) {
  EngineJob j = Job("sim-bf16-1");
  j.cfg.world = 1;
  j.cfg.S = 2;
  j.cfg.R = 4;  // selections at steps 0, 4, 8, 12: columns leave and join
  j.cfg.delay = 1;
  j.cfg.param_dtype = SimParamDType::kBF16;
  j.steps = 16;
  ExpectMatchesSim16(j);
}

TEST_F(WorkerEngineTest, Bf16ParamsTwoRanksMatchSimulatorBitForBitAcrossReselections) {
  EngineJob j = Job("sim-bf16-2");
  j.cfg.world = 2;
  j.cfg.S = 2;
  j.cfg.R = 4;
  j.cfg.delay = 0;
  j.cfg.bf16_wire = true;
  j.cfg.param_dtype = SimParamDType::kBF16;
  j.steps = 16;
  ExpectMatchesSim16(j);
}

TEST_F(WorkerEngineTest, Fp16ParamsWithWarmupMatchSimulatorBitForBit) {
  EngineJob j = Job("sim-fp16");
  j.cfg.world = 2;
  j.cfg.S = 2;
  j.cfg.R = 6;
  j.cfg.warmup_rounds = 1;  // selections at 2, 6, 12
  j.cfg.delay = 1;
  j.cfg.param_dtype = SimParamDType::kF16;
  j.steps = 16;
  ExpectMatchesSim16(j);
}

// The daemon sends a bf16 tensor's columns as bf16: half the bytes down.
TEST_F(WorkerEngineTest, Bf16ParamsHalveTheDeltaBytes) {
  EngineJob j = Job("bytes-fp32");
  j.cfg.world = 1;
  j.cfg.zero_offload = true;  // every column comes back every step
  j.steps = 8;
  OptimizerTotals fp32, bf16;
  ASSERT_OK(RunEngineRank(j, 0, &fp32).status());
  j.job_id = "bytes-bf16";
  j.cfg.param_dtype = SimParamDType::kBF16;
  ASSERT_OK(RunEngineRank(j, 0, &bf16).status());
  ASSERT_GT(fp32.bytes_received, 0);
  const double ratio = static_cast<double>(bf16.bytes_received) / fp32.bytes_received;
  EXPECT_LT(ratio, 0.6) << "bytes down: fp32 params " << fp32.bytes_received << ", bf16 "
                        << bf16.bytes_received;
  EXPECT_GT(ratio, 0.4);
}

TEST_F(WorkerEngineTest, ZenFlowSyncMatchesSimulatorAcrossReselections) {
  EngineJob j = Job("sim-sync");
  j.cfg.world = 2;
  j.cfg.S = 2;
  j.cfg.R = 4;  // selections at steps 0, 4, 8, 12
  j.cfg.delay = 0;
  j.steps = 16;
  ExpectMatchesSim(j);
}

// The important gradients reduced by an in-process collective (as ranks on
// GPUs would with NCCL) instead of the daemon's AllReduce: the same rank-order
// mean, so the same bits.
TEST_F(WorkerEngineTest, ALocalReducerGivesTheDaemonAllReducesBits) {
  EngineJob j = Job("reduce-daemon");
  j.cfg.world = 2;
  j.cfg.S = 2;
  j.cfg.R = 4;
  j.cfg.delay = 1;
  j.steps = 12;
  j.rank_ordered_sums = true;  // or the daemon's sums would depend on arrival order
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> daemon = RunEngineRanks(j);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  LocalReducer group(2);
  j.job_id = "reduce-local";
  j.reducer = &group;
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> local = RunEngineRanks(j);
  ASSERT_TRUE(local.ok()) << local.status();
  for (int r = 0; r < 2; ++r) {
    for (size_t t = 0; t < (*daemon)[0].size(); ++t) {
      ASSERT_EQ((*local)[r][t].size(), (*daemon)[r][t].size());
      EXPECT_EQ(std::memcmp((*local)[r][t].data(), (*daemon)[r][t].data(),
                            (*daemon)[r][t].size() * 4), 0)
          << "rank " << r << " tensor " << t;
    }
  }
  // Every step reduced its important columns here (none are empty with
  // k = 0.25 after the first selection at step 0).
  EXPECT_EQ(group.completed(), j.steps);
}

// Rule 11 (the predicted step): with S = 1 and delay 1 every round is
// followed on the ranks by the daemon's next AdamW step of its columns,
// from the state that came with the round's values and the step's mean
// gradient (step 0 from the zero state). The engine matches a simulation
// of that, not one without it; and with it off matches that one.
TEST_F(WorkerEngineTest, PredictedStepMatchesSimulatorAcrossReselections) {
  // Selections drain: no predicted step at steps 4, 8, 12.
  EngineJob j = PredictedJob("predicted", 2, 16);
  ExpectMatchesSim(j);
  j.job_id = "predicted-again";
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> ranks = RunEngineRanks(j);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EngineJob off = j;
  off.cfg.predicted_step = false;
  std::string where;
  EXPECT_GT(Mismatch((*ranks)[0], RunSim(off), 2e-5, 1e-4, &where), 1.0)
      << "the engine also matches a simulation without the predicted step";
  off.job_id = "predicted-off";
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> plain = RunEngineRanks(off);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_LE(Mismatch((*plain)[0], RunSim(off), 2e-5, 1e-4, &where), 1.0)
      << "predicted_step false vs its simulation: " << where;
  EXPECT_GT(Mismatch((*plain)[0], RunSim(j), 2e-5, 1e-4, &where), 1.0);
  // Which steps were predicted: all but the selection steps 4, 8 and 12
  // (step 0 from the zero state), and none with it off.
  OptimizerTotals totals;
  EngineJob one = j;
  one.cfg.world = 1;
  one.job_id = "predicted-count";
  ASSERT_OK(RunEngineRank(one, 0, &totals, nullptr).status());
  EXPECT_EQ(totals.predicted_steps, 16 - 3);
  one.cfg.predicted_step = false;
  one.job_id = "predicted-count-off";
  ASSERT_OK(RunEngineRank(one, 0, &totals, nullptr).status());
  EXPECT_EQ(totals.predicted_steps, 0);
}

TEST_F(WorkerEngineTest, PredictedStepBf16ParamsTwoRanksMatchSimulatorBitForBit) {
  EngineJob j = PredictedJob("predicted-bf16", 2, 12);
  j.cfg.bf16_wire = true;
  j.cfg.param_dtype = SimParamDType::kBF16;
  ExpectMatchesSim16(j);
}

TEST_F(WorkerEngineTest, PredictedStepFp16ParamsWithWarmupMatchSimulatorBitForBit) {
  EngineJob j = PredictedJob("predicted-fp16", 1, 12);
  j.cfg.warmup_rounds = 2;  // steps 0 and 1: every column through the daemon
  j.cfg.param_dtype = SimParamDType::kF16;
  ExpectMatchesSim16(j);
}

// The predicted step's gradients are reduced with the important ones: a
// device-side reducer gives the daemon's AllReduce's bits.
TEST_F(WorkerEngineTest, PredictedStepALocalReducerGivesTheDaemonAllReducesBits) {
  EngineJob j = PredictedJob("predicted-reduce-daemon", 2, 10);
  j.rank_ordered_sums = true;
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> daemon = RunEngineRanks(j);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  LocalReducer group(2);
  j.job_id = "predicted-reduce-local";
  j.reducer = &group;
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> local = RunEngineRanks(j);
  ASSERT_TRUE(local.ok()) << local.status();
  for (int r = 0; r < 2; ++r) {
    for (size_t t = 0; t < (*daemon)[0].size(); ++t) {
      EXPECT_EQ(std::memcmp((*local)[r][t].data(), (*daemon)[r][t].data(),
                            (*daemon)[r][t].size() * 4), 0)
          << "rank " << r << " tensor " << t;
    }
  }
  std::string where;
  EXPECT_LE(Mismatch((*local)[0], RunSim(j), 2e-5, 1e-4, &where), 1.0) << where;
}

TEST_F(WorkerEngineTest, ZenFlowDelayOneMatchesSimulatorAcrossReselections) {
  EngineJob j = Job("sim-d1");
  j.cfg.world = 2;
  j.cfg.S = 2;
  j.cfg.R = 4;
  j.cfg.delay = 1;
  j.steps = 16;
  ExpectMatchesSim(j);
}

TEST_F(WorkerEngineTest, ZenFlowDelaySMatchesSimulatorAcrossReselections) {
  EngineJob j = Job("sim-dS");
  j.cfg.world = 2;
  j.cfg.S = 4;
  j.cfg.R = 8;  // selections at 0, 8, 16, 24
  j.cfg.delay = 4;
  j.steps = 32;
  ExpectMatchesSim(j);
}

TEST_F(WorkerEngineTest, WarmupRoundsAndBf16WireMatchSimulator) {
  EngineJob j = Job("sim-warm-bf16");
  j.cfg.world = 1;
  j.cfg.S = 2;
  j.cfg.R = 6;
  j.cfg.warmup_rounds = 2;  // selections at 4, 6, 12
  j.cfg.delay = 1;
  j.cfg.bf16_wire = true;
  j.steps = 16;
  ExpectMatchesSim(j);
}

TEST_F(WorkerEngineTest, Int8WireWithPerColumnScalesMatchesSimulator) {
  EngineJob j = Job("sim-int8");
  j.cfg.world = 2;
  j.cfg.S = 2;
  j.cfg.R = 4;
  j.cfg.delay = 1;
  j.cfg.int8_wire = true;
  j.steps = 16;
  ExpectMatchesSim(j);
}

// The staging ring's size changes when Step() returns, never the bits:
// two 4 MiB buffers (the least), and ten.
TEST_F(WorkerEngineTest, AnyStagingSizeMatchesSimulator) {
  for (size_t bytes : {size_t{0}, size_t{40} << 20}) {
    SCOPED_TRACE(bytes);
    EngineJob j = Job(bytes == 0 ? "sim-staging-min" : "sim-staging-big");
    j.cfg.world = 2;
    j.cfg.S = 2;
    j.cfg.R = 4;
    j.cfg.delay = 1;
    j.cfg.int8_wire = bytes == 0;
    j.engine.staging_bytes = bytes;
    j.steps = 12;
    ExpectMatchesSim(j);
  }
}

TEST_F(WorkerEngineTest, ZeroOffloadEqualsLocalAdamW) {
  EngineJob j = Job("zero-offload");
  j.cfg.world = 1;
  j.cfg.zero_offload = true;
  j.steps = 8;
  // The simulator in zero_offload mode is plain AdamW on every column, every step.
  ExpectMatchesSim(j);
}

// k = 1: every column is important and updated on the worker; the result
// must equal the backend's own AdamW over all columns, bit for bit.
TEST_F(WorkerEngineTest, K1EqualsLocalAdamWBitForBit) {
  EngineJob j = Job("k1");
  j.cfg.world = 1;
  j.cfg.k = 1.0f;
  j.cfg.S = 2;
  j.cfg.R = 4;
  j.steps = 8;
  absl::StatusOr<std::vector<std::vector<float>>> got = RunEngineRank(j, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  // Local AdamW with the same backend kernel.
  std::unique_ptr<worker::Backend> be = worker::MakeCpuBackend(1);
  std::vector<SimTensor> model = EngineModel();
  std::vector<std::vector<float>> w;
  for (const SimTensor& t : model) w.push_back(t.w);
  std::vector<std::vector<float>> m, v;
  for (const SimTensor& t : model) {
    m.emplace_back(t.w.size(), 0.0f);
    v.emplace_back(t.w.size(), 0.0f);
  }
  for (int64_t step = 0; step < j.steps; ++step) {
    std::vector<std::vector<float>> g = EngineGrad(w, 0, step, j.cfg.R);
    for (size_t ti = 0; ti < model.size(); ++ti) {
      const int64_t rows = model[ti].rows, cols = model[ti].cols;
      std::vector<int32_t> all(cols);
      for (int64_t c = 0; c < cols; ++c) all[c] = static_cast<int32_t>(c);
      std::vector<int64_t> steps(cols, step + 1);
      std::vector<float> gc(rows * cols);
      ASSERT_OK(be->PackColumns(g[ti].data(), rows, cols, all.data(), cols, worker::PackDType::kF32,
                                gc.data(), nullptr));
      AdamWHyper h;
      h.lr = EngineLr(step);
      ASSERT_OK(be->SelectiveAdamW(h, 1.0f, w[ti].data(), rows, cols, all.data(), cols, steps.data(),
                                   gc.data(), m[ti].data(), v[ti].data()));
    }
  }
  for (size_t ti = 0; ti < model.size(); ++ti) {
    EXPECT_EQ(std::memcmp((*got)[ti].data(), w[ti].data(), w[ti].size() * 4), 0)
        << "tensor " << model[ti].name << " differs from local AdamW";
  }
}

// update_interval auto (docs/design.md rule 10) with rounds of changing length: the
// chooser's 1, 3, 2, 4, 1, ... (S_max = 4), each round cut to end before
// the next selection step (8, 16, 24).
TEST_F(WorkerEngineTest, AutoIntervalSyncMatchesSimulatorAcrossReselections) {
  EngineJob j = AutoJob("auto-sync", 0, {1, 3, 2, 4, 1});
  j.steps = 32;
  ExpectMatchesSim(j, {1, 3, 2, 2, 1, 1, 3, 2, 1, 1, 1, 3, 2, 1, 1, 1, 3, 2, 1});
}

// d = 1, and a partial last round (step 29 only, of the 2 chosen) that
// Finish() closes with the one step it has.
TEST_F(WorkerEngineTest, AutoIntervalDelayOneMatchesSimulatorWithAPartialLastRound) {
  EngineJob j = AutoJob("auto-d1", 1, {1, 3, 2, 4, 1});
  j.steps = 30;
  ExpectMatchesSim(j, {1, 3, 2, 2, 1, 1, 3, 2, 1, 1, 1, 3, 2, 1, 1, 1, 3, 2});
}

// d = 2: a round the chooser makes shorter than the previous round's apply
// delay is raised to it, so that round is applied before the next starts
// (the daemon accumulates two rounds at a time). The chooser's 4, 1, 1
// become 4, 2, 2.
TEST_F(WorkerEngineTest, AutoIntervalRaisesShortRoundsToTheApplyDelay) {
  EngineJob j = AutoJob("auto-d2", 2, {4, 1, 1});
  j.steps = 24;
  ExpectMatchesSim(j, {4, 2, 2, 4, 2, 2, 4, 2, 2});
}

// Warm-up rounds have S_max steps (warm-up ends at step 4, a selection);
// the chooser takes over from round 1.
TEST_F(WorkerEngineTest, AutoIntervalWithWarmupMatchesSimulator) {
  EngineJob j = AutoJob("auto-warm", 1, {1, 3, 2, 4, 1});
  j.cfg.warmup_rounds = 1;  // selections at 4, 8, 16
  j.steps = 24;
  ExpectMatchesSim(j, {4, 3, 1, 4, 1, 1, 2, 2, 4, 1, 1});
}

// A chooser's answer outside [1, S_max] is clamped to it (0 and -3 to 1, 9
// and 100 to 4), not refused: training goes on with the nearest length.
TEST_F(WorkerEngineTest, AutoIntervalClampsTheChoosersAnswer) {
  EngineJob j = AutoJob("auto-clamp", 0, {0, 9, -3, 4, 100});
  j.steps = 16;
  ExpectMatchesSim(j, {1, 4, 1, 2, 4, 1, 3});
}

// The totals count closed rounds and their steps (S_mean = round_steps /
// rounds_closed), the partial last one included.
TEST_F(WorkerEngineTest, AutoIntervalTotalsCountRoundsAndSteps) {
  EngineJob j = AutoJob("auto-totals", 1, {1, 3, 2, 4, 1});
  j.cfg.world = 1;
  j.steps = 30;
  OptimizerTotals totals;
  std::vector<int32_t> intervals;
  ASSERT_OK(RunEngineRank(j, 0, &totals, &intervals).status());
  EXPECT_EQ(totals.rounds_closed, 18);
  EXPECT_EQ(totals.round_steps, 30);
  EXPECT_EQ(intervals, PerStep({1, 3, 2, 2, 1, 1, 3, 2, 1, 1, 1, 3, 2, 1, 1, 1, 3, 2}, 30));
  // A fixed update interval: every step reports it.
  j.job_id = "fixed-totals";
  j.cfg.auto_interval = false;
  ASSERT_OK(RunEngineRank(j, 0, &totals, &intervals).status());
  EXPECT_EQ(totals.rounds_closed, 8);  // 7 of 4 steps, the last of 2
  EXPECT_EQ(totals.round_steps, 30);
  EXPECT_EQ(intervals, std::vector<int32_t>(30, 4));
}

// Without a chooser the ranks choose S from the daemon's measured round
// time (timing-dependent), the same on every rank: parameters and the
// lengths chosen are identical, each in [1, S_max], and S_max until a
// measurement exists.
// Without the predicted step, rounds start at S_max until a measurement
// exists; with it (the default) at one step (see the next test).
void ExpectMeasuredIntervalsIdentical(EngineJob j, bool predicted_step) {
  j.cfg.world = 2;
  j.cfg.S = 4;
  j.cfg.R = 8;
  j.cfg.auto_interval = true;
  j.cfg.predicted_step = predicted_step;
  j.adaptive = true;
  j.steps = 32;
  std::vector<std::vector<int32_t>> intervals;
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> ranks =
      RunEngineRanks(j, &intervals);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  for (size_t t = 0; t < (*ranks)[0].size(); ++t) {
    EXPECT_EQ(std::memcmp((*ranks)[1][t].data(), (*ranks)[0][t].data(), (*ranks)[0][t].size() * 4), 0);
  }
  ASSERT_EQ(intervals.size(), 2u);
  EXPECT_EQ(intervals[0], intervals[1]);
  ASSERT_EQ(intervals[0].size(), 32u);
  for (int32_t s : intervals[0]) {
    EXPECT_GE(s, 1);
    EXPECT_LE(s, 4);
  }
  if (predicted_step) {
    // Rounds 0 (step 0) and 1 (step 1) of one step: round 0's RoundDone is
    // applied at step 1's end, the first measurement.
    EXPECT_EQ(intervals[0][0], 1);
    EXPECT_EQ(intervals[0][1], 1);
    return;
  }
  // Round 0 and round 1 (no measurement before round 1's update is applied
  // at the earliest during round 2).
  for (int t = 0; t < 8; ++t) EXPECT_EQ(intervals[0][t], 4) << "step " << t;
}

TEST_F(WorkerEngineTest, AutoIntervalFromMeasuredRoundTimeIsIdenticalOnAllRanks) {
  ExpectMeasuredIntervalsIdentical(Job("auto-measured"), /*predicted_step=*/false);
}

TEST_F(WorkerEngineTest, AutoIntervalWithThePredictedStepStartsAtOneStep) {
  ExpectMeasuredIntervalsIdentical(Job("auto-measured-predicted"), /*predicted_step=*/true);
}

TEST_F(WorkerEngineTest, AdaptiveDelayIsIdenticalOnAllRanks) {
  EngineJob j = Job("adaptive");
  j.cfg.world = 2;
  j.cfg.S = 2;
  j.cfg.R = 4;
  j.adaptive = true;
  j.steps = 12;
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> ranks = RunEngineRanks(j);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  for (size_t t = 0; t < (*ranks)[0].size(); ++t) {
    EXPECT_EQ(std::memcmp((*ranks)[1][t].data(), (*ranks)[0][t].data(), (*ranks)[0][t].size() * 4), 0);
  }
}

std::string WorkerRankBinary() {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/", ws != nullptr ? ws : "zenflow",
                      "/tests/worker_rank");
}

std::string TestDir() {
  const char* tmp = getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

// Starts tests/worker_rank as its own process (fork, then exec at once).
pid_t SpawnRank(const std::string& target, const std::string& job, int rank, int world,
                int steps) {
  return SpawnProcess({WorkerRankBinary(), "--target=" + target, "--job=" + job,
                       absl::StrCat("--rank=", rank), absl::StrCat("--world=", world),
                       absl::StrCat("--steps=", steps),
                       absl::StrCat("--out=", TestDir(), "/", job, rank, ".bin")});
}

// Waits for `pid` to exit; kills it after `seconds`. Returns its wait status
// (-1 if it had to be killed).
int WaitRank(pid_t pid, int seconds) {
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

TEST_F(WorkerEngineTest, TwoRanksInTwoProcessesEndBitIdentical) {
  const std::string dir = TestDir();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pid_t pid = SpawnRank(daemon_->target(), "procs", r, 2, 16);
    ASSERT_GE(pid, 0);
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    const int status = WaitRank(pid, 120);
    ASSERT_NE(status, -1) << "a rank process did not finish within 120 s";
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank process failed: " << status;
  }
  auto read = [&](int r) {
    std::ifstream in(absl::StrCat(dir, "/procs", r, ".bin"), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string a = read(0), b = read(1);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b) << "the two rank processes ended with different parameters";
  // And they equal the simulator of the same job.
  EngineJob j = Job("procs");
  j.cfg.world = 2;
  j.cfg.S = 2;
  j.cfg.R = 4;
  j.cfg.delay = 1;
  j.steps = 16;
  std::vector<std::vector<float>> sim = RunSim(j);
  std::vector<std::vector<float>> got;
  size_t off = 0;
  for (const auto& t : sim) {
    got.emplace_back(t.size());
    std::memcpy(got.back().data(), a.data() + off, t.size() * 4);
    off += t.size() * 4;
  }
  std::string where;
  EXPECT_LE(Mismatch(got, sim, 2e-5, 1e-4, &where), 1.0) << where;
}

// The engine model's tensors in backend buffers: parameters of `dtype` (not
// filled), fp32 gradients; two buffers per tensor in *bufs.
absl::Status ModelParams(worker::Backend* be, DType dtype, std::vector<worker::DeviceBuffer>* bufs,
                         std::vector<ParamSpec>* specs) {
  const std::vector<SimTensor> model = EngineModel();
  *bufs = std::vector<worker::DeviceBuffer>(2 * model.size());  // (not movable: made in place)
  for (size_t i = 0; i < model.size(); ++i) {
    ZF_RETURN_IF_ERROR((*bufs)[2 * i].Reserve(be, model[i].w.size() * DTypeSize(dtype)));
    ZF_RETURN_IF_ERROR((*bufs)[2 * i + 1].Reserve(be, model[i].w.size() * 4));
    ParamSpec ps;
    ps.name = model[i].name;
    ps.shape = model[i].one_d ? std::vector<int64_t>{model[i].cols}
                              : std::vector<int64_t>{model[i].rows, model[i].cols};
    ps.param = (*bufs)[2 * i].p();
    ps.grad = (*bufs)[2 * i + 1].f32();
    ps.dtype = dtype;
    specs->push_back(ps);
  }
  return absl::OkStatus();
}

TEST_F(WorkerEngineTest, BadCallerInputIsRejected) {
  std::unique_ptr<worker::Backend> be = worker::MakeCpuBackend(1);
  EngineJob j = Job("bad-caller");
  j.cfg.world = 1;
  ClientOptions co = TestClientOptions(daemon_->target());
  auto client = Client::Connect(co);
  ASSERT_OK(client.status());
  std::vector<worker::DeviceBuffer> bufs;
  std::vector<ParamSpec> specs;
  ASSERT_OK(ModelParams(be.get(), DType::kF32, &bufs, &specs));
  absl::StatusOr<v1::JobSpec> spec = JoinOrCreateJob(client->get(), EngineSpec(j), 0, be.get(), specs);
  ASSERT_OK(spec.status());
  // Shapes that disagree with the job.
  std::vector<ParamSpec> wrong = specs;
  wrong[0].shape = {24, 8};
  auto bad = ZenFlowOptimizer::Create(be.get(), client->get(), *spec, 0, wrong);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("shape [24, 8] disagrees with the job's [8, 24]"),
            std::string::npos)
      << bad.status();
  // A rank out of range.
  auto bad_rank = ZenFlowOptimizer::Create(be.get(), client->get(), *spec, 3, specs);
  EXPECT_EQ(bad_rank.status().code(), absl::StatusCode::kOutOfRange) << bad_rank.status();
  // A step twice, or out of order.
  auto opt = ZenFlowOptimizer::Create(be.get(), client->get(), *spec, 0, specs);
  ASSERT_OK(opt.status());
  ASSERT_OK((*opt)->Step(0, 1e-3f));
  absl::Status twice = (*opt)->Step(0, 1e-3f);
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition) << twice;
  absl::Status ahead = (*opt)->Step(5, 1e-3f);
  EXPECT_EQ(ahead.code(), absl::StatusCode::kOutOfRange) << ahead;
  // The engine still works after the rejections.
  ASSERT_OK((*opt)->Step(1, 1e-3f));
  ASSERT_OK((*opt)->Step(2, 1e-3f));
  ASSERT_OK((*opt)->Step(3, 1e-3f));
  ASSERT_OK((*opt)->Finish());
  EXPECT_EQ((*opt)->totals().steps, 4);
}

TEST_F(WorkerEngineTest, Bf16ParamsRefuseArithmeticDeltasAndAnotherDType) {
  std::unique_ptr<worker::Backend> be = worker::MakeCpuBackend(1);
  ClientOptions co = TestClientOptions(daemon_->target());
  auto client = Client::Connect(co);
  ASSERT_OK(client.status());
  std::vector<worker::DeviceBuffer> bufs;
  std::vector<ParamSpec> specs;
  ASSERT_OK(ModelParams(be.get(), DType::kBF16, &bufs, &specs));
  EngineJob j = Job("bf16-arith");
  j.cfg.world = 1;
  j.cfg.param_dtype = SimParamDType::kBF16;
  v1::JobSpec want = EngineSpec(j);
  want.set_delta_kind(v1::DELTA_ARITHMETIC);
  // The daemon refuses such a job; the engine refuses such a spec too.
  absl::StatusOr<v1::JobSpec> spec = JoinOrCreateJob(client->get(), want, 0, be.get(), specs);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_NE(spec.status().message().find("DELTA_ARITHMETIC needs fp32 parameters"),
            std::string::npos)
      << spec.status();
  want.set_delta_kind(v1::DELTA_VALUES);
  spec = JoinOrCreateJob(client->get(), want, 0, be.get(), specs);
  ASSERT_OK(spec.status());
  EXPECT_EQ(spec->tensors(0).dtype(), v1::DTYPE_BF16);
  v1::JobSpec arithmetic = *spec;
  arithmetic.set_delta_kind(v1::DELTA_ARITHMETIC);
  auto bad = ZenFlowOptimizer::Create(be.get(), client->get(), arithmetic, 0, specs);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("DELTA_ARITHMETIC is for fp32 parameters only"),
            std::string::npos)
      << bad.status();
  // The job says fp32 where the model holds bf16.
  v1::JobSpec fp32 = *spec;
  fp32.set_delta_kind(v1::DELTA_VALUES);
  fp32.mutable_tensors(0)->set_dtype(v1::DTYPE_FP32);
  bad = ZenFlowOptimizer::Create(be.get(), client->get(), fp32, 0, specs);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("parameters are bf16 but the job's TensorSpec.dtype is fp32"),
            std::string::npos)
      << bad.status();
}

// Fault injection: both ranks of a job are killed (SIGKILL) while they
// stream; the daemon must carry on — stats answer, the job can be deleted,
// and a new two-process job still ends bit-identical.
TEST_F(WorkerEngineTest, DaemonSurvivesRanksKilledMidRun) {
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pid_t pid = SpawnRank(daemon_->target(), "killed", r, 2, 1000000);
    ASSERT_GE(pid, 0);
    pids.push_back(pid);
  }
  ClientOptions co = TestClientOptions(daemon_->target());
  auto admin = Client::Connect(co);
  ASSERT_OK(admin.status());
  int64_t rounds = 0;
  for (int i = 0; i < 3000 && rounds < 3; ++i) {
    absl::StatusOr<v1::GetStatsResponse> st = (*admin)->GetStats("killed");
    if (st.ok() && st->jobs_size() == 1) rounds = st->jobs(0).rounds_updated();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(rounds, 3) << "the ranks never got going";
  for (pid_t pid : pids) kill(pid, SIGKILL);
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  absl::StatusOr<v1::GetStatsResponse> after = (*admin)->GetStats("killed");
  ASSERT_OK(after.status());
  ASSERT_OK((*admin)->DeleteJob("killed"));

  std::vector<pid_t> again;
  for (int r = 0; r < 2; ++r) again.push_back(SpawnRank(daemon_->target(), "after_kill", r, 2, 16));
  for (pid_t pid : again) {
    const int status = WaitRank(pid, 120);
    ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "a rank of the job after the kill failed: " << status;
  }
  auto read = [&](int r) {
    std::ifstream in(absl::StrCat(TestDir(), "/after_kill", r, ".bin"), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_FALSE(read(0).empty());
  EXPECT_EQ(read(0), read(1));
}

}  // namespace
}  // namespace zenflow::testing
