// zfctl stats --json: 64-bit counts as JSON numbers, zeros written (rank 0's
// rank), withheld figures as null, maps as objects.
#include "tools/zfctl/stats_json.h"

#include <string>

#include "gtest/gtest.h"

namespace zenflow::ctl {
namespace {

v1::GetStatsResponse Sample() {
  v1::GetStatsResponse s;
  s.set_memory_budget_bytes(int64_t{5} << 40);
  s.set_max_jobs(64);
  (*s.mutable_rejected())["INVALID_ARGUMENT"] = 3;
  v1::JobStats* j = s.add_jobs();
  j->set_job_id("j");
  j->set_rounds_updated(int64_t{1} << 40);
  j->add_ranks()->set_rank(0);
  j->add_ranks()->set_rank(1);
  return s;
}

TEST(StatsJsonTest, CountsAreNumbersAndZerosAreWritten) {
  const std::string out = StatsJson(Sample());
  EXPECT_NE(out.find("\"memory_budget_bytes\": 5497558138880"), std::string::npos) << out;
  EXPECT_NE(out.find("\"rounds_updated\": 1099511627776"), std::string::npos) << out;
  EXPECT_NE(out.find("\"rank\": 0"), std::string::npos) << out;
  EXPECT_NE(out.find("\"rank\": 1"), std::string::npos) << out;
  EXPECT_NE(out.find("\"INVALID_ARGUMENT\": 3"), std::string::npos) << out;
  EXPECT_NE(out.find("\"daemon_wide_withheld\": false"), std::string::npos) << out;
  // Unset optional fields and messages stay out.
  EXPECT_EQ(out.find("update_divergence"), std::string::npos) << out;
  EXPECT_EQ(out.find("\"partition\""), std::string::npos) << out;
}

TEST(StatsJsonTest, WithheldFiguresAreNull) {
  v1::GetStatsResponse s = Sample();
  s.set_daemon_wide_withheld(true);
  const std::string out = StatsJson(s);
  EXPECT_NE(out.find("\"memory_budget_bytes\": null"), std::string::npos) << out;
  EXPECT_NE(out.find("\"max_jobs\": null"), std::string::npos) << out;
  EXPECT_NE(out.find("\"ucx\": null"), std::string::npos) << out;
  EXPECT_NE(out.find("\"rounds_updated\": 1099511627776"), std::string::npos) << out;
}

TEST(StatsJsonTest, SeveralDaemons) {
  const std::string out = StatsJson(std::vector<v1::GetStatsResponse>{Sample(), Sample()});
  EXPECT_EQ(out.rfind("{", 0), 0u) << out;
  EXPECT_NE(out.find("\"daemons\""), std::string::npos) << out;
}

}  // namespace
}  // namespace zenflow::ctl
