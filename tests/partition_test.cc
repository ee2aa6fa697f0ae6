// One job over several zenflowd processes (docs/several-daemons.md): the
// worker engine (CPU backend, 2 ranks) over 2 and over 3 daemons must end
// with the parameters of the same job on one daemon, bit for bit; the
// daemons refuse bad partition maps; a daemon that goes away fails the job
// with a status that names it. ZF_TEST_TRANSPORT picks gRPC or UCX.
#include <signal.h>
#include <sys/wait.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/parts.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_driver.h"
#include "tests/testing/harness.h"
#include "tests/testing/status_macros.h"

namespace zenflow::testing {
namespace {

class PartitionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (auto& d : daemons_) {
      d = new DaemonProcess();
      const absl::Status s = d->Start();
      ASSERT_TRUE(s.ok()) << s;
    }
  }
  static void TearDownTestSuite() {
    for (auto& d : daemons_) {
      EXPECT_TRUE(d->Stop().ok());
      delete d;
      d = nullptr;
    }
  }
  // The first `n` daemons' targets, comma-separated.
  static std::string Targets(int n) {
    std::vector<std::string> t;
    for (int i = 0; i < n; ++i) t.push_back(daemons_[i]->target());
    return absl::StrJoin(t, ",");
  }
  static EngineJob Job(const std::string& id, int daemons, int delay) {
    EngineJob j;
    j.target = Targets(daemons);
    j.job_id = id;
    j.cfg.world = 2;
    j.cfg.S = 2;
    j.cfg.R = 8;  // reselections at steps 8 and 16: columns move both ways
    j.cfg.delay = delay;
    j.steps = 20;
    j.rank_ordered_sums = true;  // bit-identical reruns with 2 ranks
    return j;
  }
  static DaemonProcess* daemons_[3];
};

DaemonProcess* PartitionTest::daemons_[3] = {nullptr, nullptr, nullptr};

std::unique_ptr<Client> Connect(const std::string& target) {
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(TestClientOptions(target));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

void ExpectSameBits(const std::vector<std::vector<std::vector<float>>>& a,
                    const std::vector<std::vector<std::vector<float>>>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_EQ(a[r].size(), b[r].size());
    for (size_t t = 0; t < a[r].size(); ++t) {
      ASSERT_EQ(a[r][t].size(), b[r][t].size());
      EXPECT_EQ(std::memcmp(a[r][t].data(), b[r][t].data(), a[r][t].size() * 4), 0)
          << what << ": rank " << r << " tensor " << t << " differs from the one-daemon run";
    }
  }
}

// Over 2 and 3 daemons, sync and apply delay 1, the ranks end exactly where
// the same job on one daemon ends; each daemon did its part of the work.
// With `split` > 0 the partitioned runs split tensors of more than `split`
// parameters into column blocks (ClientOptions.split_tensor_params): the
// engine's w1 (8 x 24) and w2 (6 x 20) then lie on several daemons each.
void RunAndCompare(int delay, const std::string& tag, DaemonProcess* const* daemons,
                   const std::function<std::string(int)>& targets,
                   const std::function<EngineJob(const std::string&, int, int)>& job,
                   int64_t split = 0) {
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> one =
      RunEngineRanks(job(tag + "-one", 1, delay));
  ASSERT_TRUE(one.ok()) << one.status();
  // The comparison can tell: another apply delay ends elsewhere.
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> other =
      RunEngineRanks(job(tag + "-other", 1, delay == 0 ? 1 : 0));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(std::memcmp((*one)[0][0].data(), (*other)[0][0].data(), (*one)[0][0].size() * 4), 0);
  for (int n : {2, 3}) {
    const std::string id = absl::StrCat(tag, "-", n);
    EngineJob parted = job(id, n, delay);
    parted.split_tensor_params = split;
    absl::StatusOr<std::vector<std::vector<std::vector<float>>>> got = RunEngineRanks(parted);
    ASSERT_TRUE(got.ok()) << n << " daemons: " << got.status();
    ExpectSameBits(*got, *one, absl::StrCat(n, " daemons"));
    // Every daemon hosts its part of the job and no other.
    std::vector<std::string> tensors_seen;
    for (int i = 0; i < n; ++i) {
      std::unique_ptr<Client> c = Connect(daemons[i]->target());
      ASSERT_NE(c, nullptr);
      absl::StatusOr<v1::GetJobResponse> j = c->GetJob(id);
      ASSERT_TRUE(j.ok()) << j.status();
      ASSERT_TRUE(j->spec().has_partition());
      EXPECT_EQ(j->spec().partition().parts(), n);
      EXPECT_EQ(j->spec().partition().part(), i);
      // Whole tensors: 3 entries. Split at 70 parameters: w1 (192) in
      // min(n, 3) blocks, w2 (120) in 2, and b1.
      const int entries = split == 0 ? 3 : std::min(n, 3) + 1 + 2;
      EXPECT_EQ(j->spec().partition().tensors_size(), entries) << j->spec().partition().DebugString();
      for (const v1::TensorSpec& t : j->spec().tensors()) tensors_seen.push_back(t.name());
      absl::StatusOr<v1::GetStatsResponse> s = c->GetStats(id);
      ASSERT_TRUE(s.ok()) << s.status();
      ASSERT_EQ(s->jobs_size(), 1);
      EXPECT_EQ(s->jobs(0).partition().part(), i);
      // Daemons with a 2-D tensor received its shards and updated rounds.
      if (j->spec().tensors(0).shape_size() == 2) {
        EXPECT_GT(s->jobs(0).shards_received(), 0) << "daemon " << i;
        EXPECT_GT(s->jobs(0).delta_messages_sent(), 0) << "daemon " << i;
      }
      EXPECT_GT(s->jobs(0).rounds_updated(), 0) << "daemon " << i;
    }
    std::sort(tensors_seen.begin(), tensors_seen.end());
    if (split == 0) {
      EXPECT_EQ(tensors_seen, (std::vector<std::string>{"b1", "w1", "w2"}))
          << "each tensor on exactly one daemon";
    } else {
      const std::vector<std::string> want =
          n == 2 ? std::vector<std::string>{"b1", "w1", "w1", "w2", "w2"}
                 : std::vector<std::string>{"b1", "w1", "w1", "w1", "w2", "w2"};
      EXPECT_EQ(tensors_seen, want) << "a block of w1 and of w2 on each of several daemons";
    }
    // Through the list, the client sees the whole job.
    std::unique_ptr<Client> all = Connect(targets(n));
    ASSERT_NE(all, nullptr);
    absl::StatusOr<v1::GetJobResponse> whole = all->GetJob(id);
    ASSERT_TRUE(whole.ok()) << whole.status();
    ASSERT_EQ(whole->spec().tensors_size(), 3);
    EXPECT_EQ(whole->spec().tensors(0).name(), "w1");
    EXPECT_EQ(whole->spec().tensors(1).name(), "b1");
    EXPECT_EQ(whole->spec().tensors(2).name(), "w2");
    EXPECT_EQ(std::vector<int64_t>(whole->spec().tensors(0).shape().begin(),
                                   whole->spec().tensors(0).shape().end()),
              (std::vector<int64_t>{8, 24}))
        << "a split tensor is whole again through the list";
    EXPECT_TRUE(whole->parameters_uploaded());
    // A tensor's daemon-side state through the list (a split one gathered
    // from its blocks) is the one-daemon job's, bit for bit.
    std::unique_ptr<Client> lone = Connect(daemons[0]->target());
    ASSERT_NE(lone, nullptr);
    // A new job over the same daemons, set from that state before it starts
    // (as a resume does), holds it exactly too.
    const std::string resumed = id + "-resumed";
    ClientOptions co = TestClientOptions(targets(n));
    co.split_tensor_params = split;
    absl::StatusOr<std::unique_ptr<Client>> fresh = Client::Connect(co);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    EngineJob rj = parted;
    rj.job_id = resumed;
    rj.cfg.world = 1;
    ASSERT_TRUE((*fresh)->CreateJob(EngineSpec(rj)).ok());
    std::vector<std::vector<float>> zeros;
    std::vector<Client::TensorValues> values;
    for (const SimTensor& t : EngineModel()) zeros.emplace_back(t.rows * t.cols, 0.0f);
    const std::vector<SimTensor> model = EngineModel();
    for (size_t t = 0; t < model.size(); ++t) {
      std::vector<int64_t> shape = model[t].one_d ? std::vector<int64_t>{model[t].cols}
                                                  : std::vector<int64_t>{model[t].rows, model[t].cols};
      values.push_back({model[t].name, shape, zeros[t].data(), DType::kF32});
    }
    absl::StatusOr<v1::UploadParametersResponse> up = (*fresh)->UploadParameters(resumed, values);
    ASSERT_TRUE(up.ok()) << up.status();
    EXPECT_EQ(up->tensors(), 3) << "a split tensor counts once";
    for (const char* t : {"w1", "w2"}) {
      absl::StatusOr<v1::ColumnState> mine = all->GetState(id, t, nullptr);
      absl::StatusOr<v1::ColumnState> ref = lone->GetState(tag + "-one", t, nullptr);
      ASSERT_TRUE(mine.ok()) << mine.status();
      ASSERT_TRUE(ref.ok()) << ref.status();
      EXPECT_GT(mine->columns_size(), 0);
      EXPECT_EQ(mine->SerializeAsString(), ref->SerializeAsString()) << t << " over " << n;
      const absl::Status set = (*fresh)->SetState(resumed, *mine);
      ASSERT_TRUE(set.ok()) << set;
      // Every column is remote before the first selection: read back the
      // columns that were set.
      absl::StatusOr<v1::ColumnState> back = (*fresh)->GetState(resumed, t, nullptr);
      ASSERT_TRUE(back.ok()) << back.status();
      const int64_t rows = mine->values_size() / mine->columns_size();
      for (int k = 0; k < mine->columns_size(); ++k) {
        const int32_t c = mine->columns(k);
        ASSERT_LT(c, back->columns_size());
        EXPECT_EQ(back->columns(c), c);
        EXPECT_EQ(std::memcmp(back->values().data() + c * rows, mine->values().data() + k * rows,
                              rows * 4), 0)
            << t << " column " << c;
        EXPECT_EQ(back->update_counts(c), mine->update_counts(k));
      }
    }
    EXPECT_TRUE((*fresh)->DeleteJob(resumed).ok());
    if (split > 0) {
      // A column the split tensor does not have is refused before any
      // daemon sees it, and the job still answers.
      const absl::Status bad =
          all->PushColumns(0, "w1", 1, {24}, std::vector<float>(8).data(), 8, DType::kF32);
      EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
      EXPECT_NE(bad.message().find("has no column 24"), std::string::npos) << bad;
      EXPECT_TRUE(all->GetJob(id).ok());
    }
    EXPECT_TRUE(all->DeleteJob(id).ok());
  }
}

TEST_F(PartitionTest, SyncOverTwoAndThreeDaemonsEqualsOneDaemonBitForBit) {
  RunAndCompare(0, "sync", daemons_, Targets, Job);
}

TEST_F(PartitionTest, DelayOneOverTwoAndThreeDaemonsEqualsOneDaemonBitForBit) {
  RunAndCompare(1, "delay1", daemons_, Targets, Job);
}

// The same with w1 and w2 split into column blocks over the daemons: top-k
// stays the whole tensor's, so the ranks still end where one daemon takes them.
// Without the local step (rule 13): each block's daemon sends the factored
// moment of its own columns, and the ranks' column-weighted mean of those is
// the whole tensor's to fp32 rounding only (SplitLocalStepKeepsRanksIdenticalAndNearOneDaemon below).
TEST_F(PartitionTest, SyncWithTensorsSplitByColumnsEqualsOneDaemonBitForBit) {
  auto no_local_step = [](const std::string& id, int daemons, int delay) {
    EngineJob j = Job(id, daemons, delay);
    j.cfg.local_step = false;
    return j;
  };
  RunAndCompare(0, "split-sync", daemons_, Targets, no_local_step, /*split=*/70);
}

TEST_F(PartitionTest, DelayOneWithTensorsSplitByColumnsEqualsOneDaemonBitForBit) {
  auto no_local_step = [](const std::string& id, int daemons, int delay) {
    EngineJob j = Job(id, daemons, delay);
    j.cfg.local_step = false;
    return j;
  };
  RunAndCompare(1, "split-delay1", daemons_, Targets, no_local_step, /*split=*/70);
}

// With the local step over split tensors, the ranks combine the blocks'
// moments whatever order their messages arrive in: two ranks end
// bit-identical, and within fp32 rounding of the one-daemon job.
TEST_F(PartitionTest, SplitLocalStepKeepsRanksIdenticalAndNearOneDaemon) {
  // The local step is off by default (docs/design.md rule 13).
  EngineJob one_job = Job("split-local-one", 1, 1);
  one_job.cfg.local_step = true;
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> one = RunEngineRanks(one_job);
  ASSERT_TRUE(one.ok()) << one.status();
  EngineJob j = Job("split-local-3", 3, 1);
  j.cfg.local_step = true;
  j.split_tensor_params = 70;
  std::vector<OptimizerTotals> totals;
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> got =
      RunEngineRanks(j, nullptr, &totals);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t t = 0; t < (*got)[0].size(); ++t) {
    EXPECT_EQ(std::memcmp((*got)[0][t].data(), (*got)[1][t].data(), (*got)[0][t].size() * 4), 0)
        << "tensor " << t << " differs between the ranks";
  }
  EXPECT_GT(totals[0].local_steps, 0);
  std::string where;
  EXPECT_LE(Mismatch((*got)[0], (*one)[0], 2e-5, 1e-4, &where), 1.0) << where;
}

// One-step rounds with the predicted step: each block's daemon sends its
// columns' m and v, the rank predicts block by block with the step's
// gradient (reduced at the tensor's first block's daemon): still one
// daemon's bits.
TEST_F(PartitionTest, PredictedStepWithTensorsSplitByColumnsEqualsOneDaemonBitForBit) {
  auto one_step = [](const std::string& id, int daemons, int delay) {
    EngineJob j = Job(id, daemons, delay);
    j.cfg.S = 1;
    return j;
  };
  RunAndCompare(1, "split-predicted", daemons_, Targets, one_step, /*split=*/70);
}

TEST_F(PartitionTest, ThePlanBalancesHostedParametersAndNeedsATensorPerDaemon) {
  v1::JobSpec spec;
  spec.set_job_id("plan");
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool local = false) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name(name);
    t->mutable_shape()->Add(shape.begin(), shape.end());
    t->set_local(local);
  };
  add("a", {10, 100});  // 1000
  add("bias", {100});   // never on a daemon: weight 0
  add("b", {10, 60});   // 600
  add("c", {10, 50});   // 500
  add("d", {10, 40});   // 400
  add("emb", {10, 1000}, /*local=*/true);
  absl::StatusOr<v1::Partition> p = PlanPartition(spec, 2);
  ASSERT_TRUE(p.ok()) << p.status();
  std::vector<int> part;
  for (const v1::PartitionEntry& e : p->tensors()) part.push_back(e.part());
  // Largest first, each to the lighter daemon: a -> 0 (1000); b -> 1
  // (600); c -> 1 (1100); d -> 0 (1400); then the weightless bias and emb
  // to the lighter one, 1.
  EXPECT_EQ(part, (std::vector<int>{0, 1, 1, 1, 0, 1})) << p->DebugString();
  EXPECT_EQ(p->tensors(0).params(), 1000);
  EXPECT_EQ(p->parts(), 2);
  EXPECT_EQ(p->version(), 1);
  const v1::JobSpec part1 = PartSpec(spec, *p, 1);
  ASSERT_EQ(part1.tensors_size(), 4);
  EXPECT_EQ(part1.tensors(0).name(), "bias");
  EXPECT_EQ(part1.tensors(3).name(), "emb");
  // Ties in load go to the daemon with fewer tensors: four weightless
  // tensors over 2 daemons alternate.
  v1::JobSpec flat;
  for (const char* n : {"n1", "n2", "n3", "n4"}) {
    v1::TensorSpec* t = flat.add_tensors();
    t->set_name(n);
    t->add_shape(8);
  }
  absl::StatusOr<v1::Partition> fp = PlanPartition(flat, 2);
  ASSERT_TRUE(fp.ok()) << fp.status();
  std::vector<int> fparts;
  for (const v1::PartitionEntry& e : fp->tensors()) fparts.push_back(e.part());
  EXPECT_EQ(fparts, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(part1.partition().part(), 1);
  // More daemons than tensors (1-D tensors cannot be split).
  absl::StatusOr<v1::Partition> too_many = PlanPartition(flat, 7);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("4 tensors"), std::string::npos) << too_many.status();
  // A tensor of more than twice a daemon's share is split by columns into
  // blocks of about a share, each on a daemon of its own: over 4 daemons
  // (share 1000 of 4000 hosted) "a" (10 x 300) goes in 3 blocks of 100
  // columns; then the rest onto the lightest daemons.
  v1::JobSpec big;
  auto add_big = [&](const std::string& name, std::vector<int64_t> shape) {
    v1::TensorSpec* t = big.add_tensors();
    t->set_name(name);
    t->mutable_shape()->Add(shape.begin(), shape.end());
  };
  add_big("a", {10, 300});  // 3000
  add_big("b", {10, 60});   // 600
  add_big("c", {10, 40});   // 400
  absl::StatusOr<v1::Partition> bp = PlanPartition(big, 4);
  ASSERT_TRUE(bp.ok()) << bp.status();
  ASSERT_EQ(bp->tensors_size(), 5) << bp->DebugString();
  std::vector<std::tuple<std::string, int, int64_t, int64_t, int64_t>> got;
  for (const v1::PartitionEntry& e : bp->tensors()) {
    got.emplace_back(e.tensor(), e.part(), e.first_column(), e.columns(), e.params());
  }
  // Largest first (the three blocks, then b, then c), each to the lightest
  // daemon that holds no other block of its tensor.
  EXPECT_EQ(got, (std::vector<std::tuple<std::string, int, int64_t, int64_t, int64_t>>{
                     {"a", 0, 0, 100, 1000},
                     {"a", 1, 100, 100, 1000},
                     {"a", 2, 200, 100, 1000},
                     {"b", 3, 0, 0, 600},
                     {"c", 3, 0, 0, 400}}));
  // Each block's daemon gets the tensor with the block's columns.
  const v1::JobSpec big1 = PartSpec(big, *bp, 1);
  ASSERT_EQ(big1.tensors_size(), 1);
  EXPECT_EQ(big1.tensors(0).name(), "a");
  EXPECT_EQ(big1.tensors(0).shape(1), 100);
  // An explicit limit: blocks of at most that many parameters, never more
  // blocks than daemons (uneven columns: the first blocks one wider).
  absl::StatusOr<v1::Partition> lp = PlanPartition(big, 2, 250);
  ASSERT_TRUE(lp.ok()) << lp.status();
  std::vector<std::tuple<std::string, int64_t, int64_t>> blocks;
  for (const v1::PartitionEntry& e : lp->tensors()) {
    blocks.emplace_back(e.tensor(), e.first_column(), e.columns());
  }
  EXPECT_EQ(blocks, (std::vector<std::tuple<std::string, int64_t, int64_t>>{
                        {"a", 0, 150}, {"a", 150, 150}, {"b", 0, 30}, {"b", 30, 30},
                        {"c", 0, 20}, {"c", 20, 20}}));
}

TEST_F(PartitionTest, TargetListsAreChecked) {
  for (const std::string& bad : {std::string("a:1,,b:2"), std::string("a:1,a:1"), std::string(",")}) {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(TestClientOptions(bad));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad << ": " << c.status();
  }
  absl::StatusOr<std::vector<std::string>> ok = SplitTargets("a:1, b:2");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, (std::vector<std::string>{"a:1", "b:2"}));
}

// The daemon's checks of JobSpec.partition: each refusal is
// INVALID_ARGUMENT with the reason, and the next good spec is taken.
TEST_F(PartitionTest, TheDaemonRefusesBadMapsAndThenTakesAGoodOne) {
  std::unique_ptr<Client> c = Connect(daemons_[0]->target());
  ASSERT_NE(c, nullptr);
  auto good = [] {
    v1::JobSpec s;
    s.set_job_id("maps");
    for (const char* n : {"x", "z"}) {
      v1::TensorSpec* t = s.add_tensors();
      t->set_name(n);
      t->add_shape(4);
      t->add_shape(8);
    }
    v1::Partition* p = s.mutable_partition();
    p->set_version(1);
    p->set_parts(2);
    p->set_part(0);
    for (auto [n, part] : {std::pair<const char*, int>{"x", 0}, {"y", 1}, {"z", 0}}) {
      v1::PartitionEntry* e = p->add_tensors();
      e->set_tensor(n);
      e->set_part(part);
      e->set_params(32);
    }
    return s;
  };
  struct Case {
    std::string what, expect;
    std::function<void(v1::JobSpec*)> spoil;
  };
  const std::vector<Case> cases = {
      {"version", "partition.version 2", [](v1::JobSpec* s) { s->mutable_partition()->set_version(2); }},
      {"one part", "partition.parts 1", [](v1::JobSpec* s) { s->mutable_partition()->set_parts(1); }},
      {"too many parts", "partition.parts 65",
       [](v1::JobSpec* s) { s->mutable_partition()->set_parts(65); }},
      {"part out of range", "partition.part 2",
       [](v1::JobSpec* s) { s->mutable_partition()->set_part(2); }},
      {"entry on a part out of range", "is on part 5",
       [](v1::JobSpec* s) { s->mutable_partition()->mutable_tensors(1)->set_part(5); }},
      {"tensor twice", "lists tensor 'x' twice",
       [](v1::JobSpec* s) { s->mutable_partition()->mutable_tensors(1)->set_tensor("x"); }},
      {"a spec tensor elsewhere", "the map has 'z' where the spec has no more tensors",
       [](v1::JobSpec* s) { s->mutable_tensors()->RemoveLast(); }},
      {"spec tensor not in the map", "tensor 'z' of the spec is not on part 0",
       [](v1::JobSpec* s) { s->mutable_partition()->mutable_tensors(2)->set_part(1); }},
      {"order", "in the same order",
       [](v1::JobSpec* s) { s->mutable_tensors()->SwapElements(0, 1); }},
      {"a part with no tensor", "part 2 of 3 hosts no tensor",
       [](v1::JobSpec* s) { s->mutable_partition()->set_parts(3); }},
      {"clipping", "max_grad_norm", [](v1::JobSpec* s) { s->mutable_adamw()->set_max_grad_norm(1); }},
      {"skipping", "skip_nonfinite_rounds", [](v1::JobSpec* s) { s->set_skip_nonfinite_rounds(true); }},
      {"negative params", "params < 0",
       [](v1::JobSpec* s) { s->mutable_partition()->mutable_tensors(0)->set_params(-1); }},
  };
  // A map whose "x" is split into columns [0, 3) here and [3, 8) on part 1.
  auto split = [&](v1::JobSpec* s) {
    s->mutable_tensors(0)->set_shape(1, 3);
    v1::Partition* p = s->mutable_partition();
    p->clear_tensors();
    for (auto [part, first, cols] : {std::tuple<int, int, int>{0, 0, 3}, {1, 3, 5}}) {
      v1::PartitionEntry* e = p->add_tensors();
      e->set_tensor("x");
      e->set_part(part);
      e->set_first_column(first);
      e->set_columns(cols);
      e->set_params(4 * cols);
    }
    v1::PartitionEntry* z = p->add_tensors();
    z->set_tensor("z");
    z->set_part(0);
    z->set_params(32);
  };
  const std::vector<Case> block_cases = {
      {"a gap between blocks", "starts at column 4, not 3",
       [&](v1::JobSpec* s) { split(s); s->mutable_partition()->mutable_tensors(1)->set_first_column(4); }},
      {"not from column 0", "starts at column 1, not 0",
       [&](v1::JobSpec* s) { split(s); s->mutable_partition()->mutable_tensors(0)->set_first_column(1); }},
      {"two blocks on one part", "two blocks of tensor 'x' are on part 0",
       [&](v1::JobSpec* s) { split(s); s->mutable_partition()->mutable_tensors(1)->set_part(0); }},
      {"a single block", "has a single block",
       [&](v1::JobSpec* s) {
         split(s);
         s->mutable_partition()->mutable_tensors()->DeleteSubrange(1, 1);
         s->mutable_partition()->set_parts(2);
       }},
      {"whole and a block", "whole and as a block",
       [&](v1::JobSpec* s) { split(s); s->mutable_partition()->mutable_tensors(0)->set_columns(0); }},
      {"the block's shape", "2-D tensor of its block's 3 columns",
       [&](v1::JobSpec* s) { split(s); s->mutable_tensors(0)->set_shape(1, 8); }},
      {"a local block", ", local)",
       [&](v1::JobSpec* s) { split(s); s->mutable_tensors(0)->set_local(true); }},
      {"negative columns", "need columns in [1, 2^31]",
       [&](v1::JobSpec* s) { split(s); s->mutable_partition()->mutable_tensors(1)->set_columns(-5); }},
      {"past 2^31", "the block inside [0, 2^31]",
       [&](v1::JobSpec* s) {
         split(s);
         s->mutable_partition()->mutable_tensors(1)->set_columns(int64_t{1} << 31);
       }},
      {"a whole tensor off column 0", "has first_column 2 but columns 0",
       [&](v1::JobSpec* s) { split(s); s->mutable_partition()->mutable_tensors(2)->set_first_column(2); }},
  };
  // Each spoiled spec is refused with its reason.
  auto refuse = [&](const std::vector<Case>& all) {
    for (const Case& k : all) {
      v1::JobSpec s = good();
      k.spoil(&s);
      absl::StatusOr<v1::JobSpec> r = c->CreateJob(s);
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << k.what << ": " << r.status();
      EXPECT_NE(r.status().message().find(k.expect), std::string::npos) << k.what << ": " << r.status();
    }
  };
  refuse(block_cases);
  {
    // The split map itself is good.
    v1::JobSpec s = good();
    s.set_job_id("maps-split");
    split(&s);
    absl::StatusOr<v1::JobSpec> r = c->CreateJob(s);
    ASSERT_TRUE(r.ok()) << r.status();
    absl::StatusOr<v1::GetJobResponse> j = c->GetJob("maps-split");
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ(j->spec().partition().SerializeAsString(), s.partition().SerializeAsString());
    EXPECT_TRUE(c->DeleteJob("maps-split").ok());
  }
  refuse(cases);
  absl::StatusOr<v1::JobSpec> r = c->CreateJob(good());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->partition().tensors_size(), 3);
  absl::StatusOr<v1::GetJobResponse> j = c->GetJob("maps");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->spec().partition().SerializeAsString(), good().partition().SerializeAsString());
  EXPECT_TRUE(c->DeleteJob("maps").ok());
}

// The client's side: a spec that brings its own map, daemons listed in
// another order than the job's, a daemon that hosts the job whole.
TEST_F(PartitionTest, TheClientRefusesMismatchedDaemonLists) {
  EngineJob j = Job("lists", 2, 0);
  j.cfg.world = 1;
  v1::JobSpec spec = EngineSpec(j);
  std::unique_ptr<Client> two = Connect(Targets(2));
  ASSERT_NE(two, nullptr);
  v1::JobSpec own = spec;
  own.mutable_partition()->set_version(1);
  EXPECT_EQ(two->CreateJob(own).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::JobSpec> made = two->CreateJob(spec);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->tensors_size(), 3);
  // The same daemons in the other order.
  std::unique_ptr<Client> swapped =
      Connect(absl::StrCat(daemons_[1]->target(), ",", daemons_[0]->target()));
  ASSERT_NE(swapped, nullptr);
  absl::StatusOr<v1::GetJobResponse> g = swapped->GetJob("lists");
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
  EXPECT_NE(g.status().message().find("in the order it was created with"), std::string::npos)
      << g.status();
  // Pushing before the map is known.
  EXPECT_EQ(swapped->PushColumns(0, "w1", 0, {0}, std::vector<float>(8).data(), 8, DType::kF32).code(),
            absl::StatusCode::kFailedPrecondition);
  // A whole job on daemon 2 listed with another daemon.
  std::unique_ptr<Client> single = Connect(daemons_[2]->target());
  ASSERT_NE(single, nullptr);
  v1::JobSpec whole = spec;
  whole.set_job_id("whole");
  ASSERT_TRUE(single->CreateJob(whole).ok());
  std::unique_ptr<Client> wrong =
      Connect(absl::StrCat(daemons_[2]->target(), ",", daemons_[0]->target()));
  ASSERT_NE(wrong, nullptr);
  g = wrong->GetJob("whole");
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
  EXPECT_NE(g.status().message().find("whole (no partition)"), std::string::npos) << g.status();
  // The good list still works after all that.
  absl::StatusOr<v1::GetJobResponse> ok = two->GetJob("lists");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->spec().tensors_size(), 3);
  EXPECT_TRUE(two->DeleteJob("lists").ok());
  EXPECT_TRUE(single->DeleteJob("whole").ok());
}

// Job `id` of two [4, 6] tensors p and q (one round a step, sync, fp32 on
// the wire) over c's daemons, its parameters uploaded and rank 0 joined.
absl::Status StartTwoTensorJob(Client& c, const std::string& id) {
  v1::JobSpec spec;
  spec.set_job_id(id);
  for (const char* n : {"p", "q"}) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name(n);
    t->add_shape(4);
    t->add_shape(6);
  }
  spec.mutable_zenflow()->set_update_interval(1);
  spec.mutable_zenflow()->mutable_apply_delay()->set_sync(true);
  spec.set_wire_dtype(v1::DTYPE_FP32);
  ZF_RETURN_IF_ERROR(c.CreateJob(spec).status());
  std::vector<float> init(24, 0.5f);
  ZF_RETURN_IF_ERROR(
      c.UploadParameters(id, {{"p", {4, 6}, init.data()}, {"q", {4, 6}, init.data()}}).status());
  return c.JoinJob(id, 0).status();
}

// A client of daemons a and b (in that order), riding through a daemon's
// restart for up to daemon_wait (0: not at all).
absl::StatusOr<std::unique_ptr<Client>> ClientOfBoth(
    const DaemonProcess& a, const DaemonProcess& b,
    absl::Duration daemon_wait = absl::ZeroDuration()) {
  ClientOptions co = TestClientOptions(absl::StrCat(a.target(), ",", b.target()));
  co.daemon_wait = daemon_wait;
  return Client::Connect(co);
}

// UNAVAILABLE, naming `gone` as daemon 1 of 2.
void ExpectUnavailableNaming(const absl::Status& s, const std::string& gone) {
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find(absl::StrCat("zenflowd ", gone, " (daemon 1 of 2)")),
            std::string::npos)
      << s;
}

// Rank 0's gradients of every column of p and q for round r (one step),
// and the round closed.
absl::Status PushRound(Client& c, int64_t r) {
  const std::vector<int32_t> cols = {0, 1, 2, 3, 4, 5};
  const std::vector<float> grad(24, 0.25f);
  for (const char* n : {"p", "q"}) {
    ZF_RETURN_IF_ERROR(c.PushColumns(r, n, 0, cols, grad.data(), 4, DType::kF32));
  }
  return c.CloseRound(r, 1e-2f);
}

// A daemon of the job that goes away (and does not come back within
// daemon_wait) fails the rank's next wait with a status naming it.
TEST(PartitionGoneTest, ADaemonThatIsGoneFailsTheJobNamingIt) {
  DaemonProcess a, b;
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(b.Start().ok());
  absl::StatusOr<std::unique_ptr<Client>> made = ClientOfBoth(a, b, absl::Seconds(2));
  ASSERT_TRUE(made.ok()) << made.status();
  Client& c = **made;
  ASSERT_OK(StartTwoTensorJob(c, "gone"));
  auto round = [&](int64_t r) -> absl::StatusOr<RoundUpdate> {
    ZF_RETURN_IF_ERROR(PushRound(c, r));
    return c.WaitRound(r, absl::Seconds(30));
  };
  absl::StatusOr<RoundUpdate> u = round(0);
  ASSERT_TRUE(u.ok()) << u.status();
  // One delta per tensor, one from each daemon.
  ASSERT_EQ(u->deltas.size(), 2u);
  EXPECT_EQ(u->done.delta_messages(), 2);
  const std::string gone = b.target();
  ASSERT_TRUE(b.Stop().ok());
  absl::StatusOr<RoundUpdate> v = round(1);
  ASSERT_FALSE(v.ok());
  ExpectUnavailableNaming(v.status(), gone);
  EXPECT_TRUE(a.Stop().ok());
}

// A wait that runs out of time after one daemon's part came keeps that
// part: the next wait for the round returns it whole. (Daemon B's part is
// held back 3 s by --emulate_round_ms; the first wait takes A's part, then
// gives up on B's after 1 s.)
TEST(PartitionGoneTest, AWaitThatRunsOutKeepsThePartsItTook) {
  DaemonProcess a, b;
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(b.Start({"--emulate_round_ms=3000"}).ok());
  absl::StatusOr<std::unique_ptr<Client>> made = ClientOfBoth(a, b);
  ASSERT_TRUE(made.ok()) << made.status();
  Client& c = **made;
  ASSERT_OK(StartTwoTensorJob(c, "kept"));
  ASSERT_OK(PushRound(c, 0));
  absl::StatusOr<RoundUpdate> early = c.WaitRound(0, absl::Seconds(1));
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded) << early.status();
  absl::StatusOr<RoundUpdate> u = c.WaitRound(0, absl::Seconds(30));
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->round, 0);
  ASSERT_EQ(u->deltas.size(), 2u);  // one tensor from each daemon
  EXPECT_EQ(u->done.delta_messages(), 2);
  EXPECT_TRUE(a.Stop().ok());
  EXPECT_TRUE(b.Stop().ok());
}

// A daemon that goes away after its part of the awaited round came, while
// another daemon's part is still owed, ends the wait naming it (after
// daemon_wait): across hosts, the cut that took it also takes the other
// ranks' closes to the daemons still owed, which then wait for those ranks.
// Here daemon A's part is held back (--emulate_round_ms, 20 s): a wait
// that watched only the daemons still owed would get A's part and return
// the round whole, 20 s later, as if nothing had happened.
TEST(PartitionGoneTest, ADaemonGoneAfterItsPartCameEndsTheWaitNamingIt) {
  DaemonProcess a, b;
  ASSERT_TRUE(a.Start({"--emulate_round_ms=20000"}).ok());
  ASSERT_TRUE(b.Start().ok());
  absl::StatusOr<std::unique_ptr<Client>> made = ClientOfBoth(a, b, absl::Seconds(1));
  ASSERT_TRUE(made.ok()) << made.status();
  Client& c = **made;
  ASSERT_OK(StartTwoTensorJob(c, "gone-after"));
  ASSERT_OK(PushRound(c, 0));
  const std::string gone = b.target();
  // B stops once its part is on the way to the client (a partitioned
  // client's rounds_received is its daemons' least, so daemon B is asked).
  bool b_updated = false;
  std::thread stopper([&] {
    absl::StatusOr<std::unique_ptr<Client>> probe = Client::Connect(TestClientOptions(gone));
    for (int i = 0; i < 200 && probe.ok(); ++i) {
      absl::StatusOr<v1::GetStatsResponse> st = (*probe)->GetStats("gone-after");
      if (st.ok() && st->jobs_size() > 0 && st->jobs(0).rounds_updated() >= 1) {
        b_updated = true;
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    absl::SleepFor(absl::Milliseconds(200));  // its RoundDone on the way to the client
    EXPECT_TRUE(b.Stop().ok());
  });
  absl::StatusOr<RoundUpdate> u = c.WaitRound(0, absl::Seconds(60));
  stopper.join();
  EXPECT_TRUE(b_updated) << "daemon B did not report round 0 updated";
  ASSERT_FALSE(u.ok()) << "the round came whole although daemon B is gone";
  ExpectUnavailableNaming(u.status(), gone);
  (void)a.Stop();  // may still hold its emulated round
}

}  // namespace
}  // namespace zenflow::testing

namespace zenflow::testing {
namespace {

// A rendezvous split over two daemons: the part on the daemon that is gone
// fails (after daemon_wait); the part on the live daemon, which would wait
// for a rank that never comes, is abandoned at once, and the call reports
// the daemon that is gone rather than waiting out selection_timeout.
TEST(PartitionGoneTest, ARendezvousOnTheLiveDaemonIsAbandonedWhenTheOtherIsGone) {
  DaemonProcess a, b;
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(b.Start().ok());
  ClientOptions co = TestClientOptions(absl::StrCat(a.target(), ",", b.target()));
  co.daemon_wait = absl::Seconds(1);
  // Without the abandonment the call on the live daemon would wait this
  // long for rank 1, past the test's own timeout.
  co.selection_timeout = absl::Hours(1);
  absl::StatusOr<std::unique_ptr<Client>> made = Client::Connect(co);
  ASSERT_TRUE(made.ok()) << made.status();
  Client& c = **made;
  v1::JobSpec spec;
  spec.set_job_id("abandon");
  spec.set_world_size(2);  // rank 1 never comes
  for (const char* n : {"p", "q"}) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name(n);
    t->add_shape(4);
    t->add_shape(6);
  }
  ASSERT_TRUE(c.CreateJob(spec).ok());
  std::vector<float> init(24, 0.5f);
  ASSERT_TRUE(c.UploadParameters("abandon", {{"p", {4, 6}, init.data()}, {"q", {4, 6}, init.data()}}).ok());
  ASSERT_TRUE(c.JoinJob("abandon", 0).ok());
  ASSERT_TRUE(b.Stop().ok());
  const std::vector<float> g(8, 1.0f);
  absl::StatusOr<std::vector<std::vector<float>>> r = c.AllReduce(0, {{"p", &g}, {"q", &g}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find(absl::StrCat("zenflowd ", b.target(), " (daemon 1 of 2)")),
            std::string::npos)
      << r.status();
  EXPECT_TRUE(a.Stop().ok());
}

}  // namespace
}  // namespace zenflow::testing
