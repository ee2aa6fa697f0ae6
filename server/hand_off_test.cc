// The hand-off check and ledger without a network.
#include "server/hand_off.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

TEST(ColumnsChangingHandsTest, LeavingAndJoiningAreTheTwoDifferences) {
  std::vector<int32_t> leaving, joining;
  ColumnsChangingHands({1, 3, 5, 7}, {3, 4, 7, 9}, &leaving, &joining);
  EXPECT_EQ(leaving, (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(joining, (std::vector<int32_t>{4, 9}));
  ColumnsChangingHands({}, {2}, &leaving, &joining);
  EXPECT_TRUE(leaving.empty());
  EXPECT_EQ(joining, (std::vector<int32_t>{2}));
}

class PlanHandOffTest : public ::testing::Test {
 protected:
  PlanHandOffTest() {
    tensors_.push_back({"w", 2, {1, 5}, {4}});
    tensors_.push_back({"b", 1, {}, {0}});
  }
  absl::StatusOr<HandOffPlan> Plan(const v1::HandOffRequest& req) {
    return PlanHandOff(req, tensors_, [this](const std::string& name) -> absl::StatusOr<int> {
      for (size_t i = 0; i < tensors_.size(); ++i) {
        if (tensors_[i].name == name) return static_cast<int>(i);
      }
      return absl::NotFoundError("no tensor '" + name + "'");
    });
  }
  // A complete leaving state of "w" (columns 1 and 5, two rows each).
  static v1::ColumnState WState() {
    v1::ColumnState cs;
    cs.set_tensor("w");
    for (int c : {1, 5}) {
      cs.add_columns(c);
      cs.add_update_counts(3);
      for (int r = 0; r < 2; ++r) {
        cs.add_values(0.5f * c + r);
        cs.add_m(0.01f);
        cs.add_v(0.001f);
      }
    }
    return cs;
  }
  static void ExpectInvalid(const absl::StatusOr<HandOffPlan>& p, const std::string& text) {
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
    EXPECT_NE(p.status().message().find(text), absl::string_view::npos) << p.status();
  }
  std::vector<HandOffTensor> tensors_;
};

TEST_F(PlanHandOffTest, AWholeCallCoversEveryTensor) {
  v1::HandOffRequest req;
  *req.add_leaving() = WState();
  absl::StatusOr<HandOffPlan> p = Plan(req);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->in_call, (std::vector<bool>{true, true}));
  EXPECT_EQ(p->given[0], &req.leaving(0));
  EXPECT_EQ(p->given[1], nullptr);  // no column of "b" leaves
}

TEST_F(PlanHandOffTest, ACallMayCoverSomeTensors) {
  v1::HandOffRequest req;
  req.add_tensors("b");
  absl::StatusOr<HandOffPlan> p = Plan(req);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->in_call, (std::vector<bool>{false, true}));
}

TEST_F(PlanHandOffTest, RejectsWhatDoesNotFit) {
  {
    v1::HandOffRequest req;
    req.add_tensors("b");
    req.add_tensors("b");
    ExpectInvalid(Plan(req), "listed twice");
  }
  {
    v1::HandOffRequest req;
    req.add_tensors("nope");
    EXPECT_EQ(Plan(req).status().code(), absl::StatusCode::kNotFound);
  }
  {
    v1::HandOffRequest req;
    *req.add_leaving() = WState();
    *req.add_leaving() = WState();
    ExpectInvalid(Plan(req), "given twice");
  }
  {
    v1::HandOffRequest req;
    req.add_tensors("b");
    *req.add_leaving() = WState();
    ExpectInvalid(Plan(req), "not among this call's tensors");
  }
  {
    v1::HandOffRequest req;  // "w" covered, its state missing
    ExpectInvalid(Plan(req), "expected the state of 2 leaving columns [1, 5], got 0");
  }
  {
    v1::HandOffRequest req;
    v1::ColumnState cs = WState();
    cs.set_columns(1, 6);
    *req.add_leaving() = cs;
    ExpectInvalid(Plan(req), "leaving columns [1, 5]");
  }
  {
    v1::HandOffRequest req;
    v1::ColumnState cs = WState();
    cs.mutable_m()->RemoveLast();
    *req.add_leaving() = cs;
    ExpectInvalid(Plan(req), "needs 4 values, m and v and 2 update counts; got 4, 3, 4 and 2");
  }
  {
    v1::HandOffRequest req;
    v1::ColumnState cs = WState();
    cs.set_v(2, std::nanf(""));
    *req.add_leaving() = cs;
    ExpectInvalid(Plan(req), "non-finite");
  }
  {
    v1::HandOffRequest req;
    v1::ColumnState cs = WState();
    cs.set_update_counts(1, -1);
    *req.add_leaving() = cs;
    ExpectInvalid(Plan(req), "negative update count for column 5");
  }
}

TEST(HandOffLedgerTest, ARankHasHandedOffOnceEveryTensorIs) {
  HandOffLedger ledger(/*world=*/2, /*tensors=*/2);
  EXPECT_EQ(ledger.rank_version(0), 0);
  ledger.Record(0, {true, false}, 1);
  EXPECT_EQ(ledger.rank_version(0), 0);
  ledger.Record(0, {false, true}, 1);
  EXPECT_EQ(ledger.rank_version(0), 1);
  EXPECT_EQ(ledger.rank_version(1), 0);
  ledger.Record(1, {true, true}, 1);
  EXPECT_EQ(ledger.rank_version(1), 1);
  EXPECT_FALSE(ledger.applied(0, 1));
  ledger.MarkApplied(0, 1);
  EXPECT_TRUE(ledger.applied(0, 1));
  EXPECT_FALSE(ledger.applied(1, 1));
}

}  // namespace
}  // namespace zenflow
