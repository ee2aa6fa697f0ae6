// Rules 12 (the scaled round step) and 13 (the local step) through the
// worker engine (CPU backend) and a real zenflowd over loopback, compared
// with the independent simulation (tests/testing/zenflow_sim.h): with both
// on (the defaults) across reselections, for S = 2 and 4, apply delays 0, 1
// and S, one and two ranks, a bf16 wire; and not with either rule off in the
// simulation, so the comparison can fail.
//
// fp32 parameters match to fp32 rounding, not bit for bit: the daemon's
// SIMD AdamW contracts multiply-adds the simulator rounds twice, so its
// master and v (and so the factored moment) may differ in their last bits.
// 16-bit parameters are compared bit for bit (their rounding hides those
// bits; ExpectMatchesSim16 in worker_engine_test says the same).
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_worker/engine/zenflow_optimizer.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_driver.h"
#include "tests/testing/harness.h"

namespace zenflow::testing {
namespace {

struct RulesCase {
  int S;
  int delay;  // -1: S
  int world;
};

std::string CaseName(const ::testing::TestParamInfo<RulesCase>& info) {
  const RulesCase& c = info.param;
  return absl::StrCat("S", c.S, "_d", c.delay < 0 ? std::string("S") : absl::StrCat(c.delay),
                      "_world", c.world);
}

DaemonProcess* daemon = nullptr;

class WorkerRulesTest : public ::testing::TestWithParam<RulesCase> {
 protected:
  static void SetUpTestSuite() {
    daemon = new DaemonProcess();
    const absl::Status s = daemon->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    EXPECT_TRUE(daemon->Stop().ok());
    delete daemon;
    daemon = nullptr;
  }
};

// S steps a round, reselecting every 2S steps (selections at 0, 2S, 4S),
// 6S steps, a bf16 wire, both rules on.
EngineJob RulesJob(const std::string& id, int S, int delay, int world) {
  EngineJob j;
  j.target = daemon->target();
  j.job_id = id;
  j.cfg.world = world;
  j.cfg.S = S;
  j.cfg.R = 2 * S;
  j.cfg.delay = delay < 0 ? S : delay;
  j.cfg.bf16_wire = true;
  j.cfg.scale_round_step = true;  // both rules are off by default
  j.cfg.local_step = true;
  j.steps = 6 * S;
  return j;
}

// Every rank's parameters are identical; returns rank 0's.
std::vector<std::vector<float>> IdenticalRanks(
    const std::vector<std::vector<std::vector<float>>>& ranks) {
  for (size_t r = 1; r < ranks.size(); ++r) {
    for (size_t t = 0; t < ranks[0].size(); ++t) {
      EXPECT_EQ(std::memcmp(ranks[r][t].data(), ranks[0][t].data(), ranks[0][t].size() * 4), 0)
          << "rank " << r << " differs from rank 0 in tensor " << t;
    }
  }
  return ranks[0];
}

TEST_P(WorkerRulesTest, BothRulesMatchTheSimulatorAndEachRuleMatters) {
  const RulesCase& c = GetParam();
  EngineJob j = RulesJob(absl::StrCat("rules-", CaseName(::testing::TestParamInfo<RulesCase>(c, 0))), c.S, c.delay, c.world);
  std::vector<OptimizerTotals> totals;
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> ranks =
      RunEngineRanks(j, nullptr, &totals);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  const std::vector<std::vector<float>> got = IdenticalRanks(*ranks);
  int sim_local = 0;
  const std::vector<std::vector<float>> sim = RunSim(j, nullptr, &sim_local);
  std::string where;
  EXPECT_LE(Mismatch(got, sim, 2e-5, 1e-4, &where), 1.0) << "engine vs simulator: " << where;
  // The local step ran where the simulation's did: every step but the
  // selection steps, those before the first round of a selection is
  // applied, and (sync) those that close a round.
  EXPECT_GT(sim_local, 0);
  for (size_t r = 0; r < totals.size(); ++r) {
    EXPECT_EQ(totals[r].local_steps, sim_local) << "rank " << r;
  }
  // Each rule matters: the simulation without it ends elsewhere.
  EngineJob other = j;
  other.cfg.scale_round_step = false;
  EXPECT_GT(Mismatch(got, RunSim(other), 2e-5, 1e-4, &where), 1.0)
      << "the engine also matches a simulation without the scaled round step";
  other = j;
  other.cfg.local_step = false;
  EXPECT_GT(Mismatch(got, RunSim(other), 2e-5, 1e-4, &where), 1.0)
      << "the engine also matches a simulation without the local step";
}

INSTANTIATE_TEST_SUITE_P(Rules, WorkerRulesTest,
                         ::testing::Values(RulesCase{2, 0, 1}, RulesCase{2, 1, 1},
                                           RulesCase{2, -1, 1}, RulesCase{4, 0, 1},
                                           RulesCase{4, 1, 1}, RulesCase{4, -1, 1},
                                           RulesCase{2, 0, 2}, RulesCase{2, 1, 2},
                                           RulesCase{2, -1, 2}, RulesCase{4, 0, 2},
                                           RulesCase{4, 1, 2}, RulesCase{4, -1, 2}),
                         CaseName);

class WorkerRulesOffTest : public WorkerRulesTest {};

// With both rules off the engine is the rules 1-11 engine: it matches the
// simulation with them off, not the one with them on, and takes no local
// step.
TEST_F(WorkerRulesOffTest, BothOffMatchTheSimulatorWithoutThem) {
  EngineJob j = RulesJob("rules-off", 4, 1, 2);
  j.cfg.scale_round_step = false;
  j.cfg.local_step = false;
  std::vector<OptimizerTotals> totals;
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> ranks =
      RunEngineRanks(j, nullptr, &totals);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  const std::vector<std::vector<float>> got = IdenticalRanks(*ranks);
  std::string where;
  EXPECT_LE(Mismatch(got, RunSim(j), 2e-5, 1e-4, &where), 1.0) << where;
  EngineJob on = j;
  on.cfg.scale_round_step = true;
  on.cfg.local_step = true;
  EXPECT_GT(Mismatch(got, RunSim(on), 2e-5, 1e-4, &where), 1.0);
  for (const OptimizerTotals& t : totals) EXPECT_EQ(t.local_steps, 0);
}

// bf16 parameters: the local step reads them, steps in fp32 and rounds to
// nearest even; with both rules on every parameter equals the simulator's
// bit for bit (two ranks, delay 1, across reselections).
TEST_F(WorkerRulesOffTest, Bf16ParamsWithBothRulesMatchBitForBit) {
  EngineJob j = RulesJob("rules-bf16", 4, 1, 2);
  j.cfg.param_dtype = SimParamDType::kBF16;
  std::vector<OptimizerTotals> totals;
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> ranks =
      RunEngineRanks(j, nullptr, &totals);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  const std::vector<std::vector<float>> got = IdenticalRanks(*ranks);
  int sim_local = 0;
  const std::vector<std::vector<float>> sim = RunSim(j, nullptr, &sim_local);
  int64_t differ = 0;
  for (size_t t = 0; t < got.size(); ++t) {
    for (size_t i = 0; i < got[t].size(); ++i) {
      differ += std::memcmp(&got[t][i], &sim[t][i], 4) != 0 ? 1 : 0;
    }
  }
  EXPECT_EQ(differ, 0) << "parameters differ from the simulator's";
  EXPECT_GT(sim_local, 0);
  EXPECT_EQ(totals[0].local_steps, sim_local);
  EngineJob off = j;
  off.cfg.local_step = false;
  std::string where;
  EXPECT_GT(Mismatch(got, RunSim(off), 1e-9, 0, &where), 1.0)
      << "the engine also matches a simulation without the local step";
}

}  // namespace
}  // namespace zenflow::testing
