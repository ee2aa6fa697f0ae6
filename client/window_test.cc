// The send window and the round assembler on their own: no network.
#include <atomic>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "client/round_assembler.h"
#include "client/send_window.h"
#include "common/stream_error.h"
#include "gtest/gtest.h"

namespace zenflow {
namespace {

Outgoing Message(int64_t size, std::shared_ptr<void> hold = nullptr) {
  Outgoing out;
  out.msg.mutable_close()->set_round(size);
  out.size = size;
  out.hold = std::move(hold);
  return out;
}

TEST(SendWindowTest, RefusesPushesUntilOpened) {
  SendWindow w(100);
  absl::Status s = w.Push(Message(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("JoinJob or Attach first"), absl::string_view::npos) << s;
  EXPECT_TRUE(w.WaitIdle(absl::ZeroDuration()).ok());  // nothing to send
}

TEST(SendWindowTest, NumbersMessagesInOrderAndCountsWhatWasSent) {
  SendWindow w(100);
  w.Open();
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(w.Push(Message(i)).ok());
  EXPECT_EQ(w.WaitIdle(absl::ZeroDuration()).code(), absl::StatusCode::kDeadlineExceeded);
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    std::optional<Outgoing> m = w.Next();
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->msg.seq(), seq);
    w.Complete(m->size, /*sent=*/seq != 2);
  }
  EXPECT_TRUE(w.WaitIdle(absl::ZeroDuration()).ok());
  const SendWindow::Stats st = w.stats();
  EXPECT_EQ(st.messages_sent, 2);
  EXPECT_EQ(st.bytes_sent, 1 + 3);
  // Numbers go on across streams: the daemon's replies name them.
  w.Open();
  ASSERT_TRUE(w.Push(Message(1)).ok());
  EXPECT_EQ(w.Next()->msg.seq(), 4u);
}

// A shard counts its payload against the window, not its header: two
// shards of half the window each are in flight together (with the header
// counted, the second waited for the first to be sent: one 32 MiB shard in
// flight with the 64 MiB default). A close still counts its size.
TEST(SendWindowTest, ShardsCountTheirPayloadAgainstTheWindow) {
  SendWindow w(64);
  w.Open();
  auto shard = [](int64_t payload) {
    Outgoing out;
    out.msg.mutable_shard()->set_step(1);
    out.size = payload + 40;  // header bytes too
    out.payload_bytes = payload;
    return out;
  };
  ASSERT_TRUE(w.Push(shard(32)).ok());
  // The second push returns (blocking would need the first to complete,
  // and nothing completes it before both were taken).
  ASSERT_TRUE(w.Push(shard(32)).ok());
  std::optional<Outgoing> a = w.Next();
  std::optional<Outgoing> b = w.Next();
  ASSERT_TRUE(a.has_value() && b.has_value());
  // A third does not fit until one completes.
  std::atomic<bool> pushed{false};
  std::thread third([&] {
    EXPECT_TRUE(w.Push(shard(32)).ok());
    pushed = true;
  });
  // Most often the third is waiting by now (it then must be woken once it
  // fits: with b still in flight, waiting for an eighth to spare would
  // never end; a third that has not started yet simply finds room).
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(pushed);
  w.Complete(a->size, true, a->payload_bytes);
  third.join();
  EXPECT_TRUE(pushed);
  w.Complete(b->size, true, b->payload_bytes);
  std::optional<Outgoing> c = w.Next();
  ASSERT_TRUE(c.has_value());
  w.Complete(c->size, true, c->payload_bytes);
  EXPECT_TRUE(w.WaitIdle(absl::ZeroDuration()).ok());
  const SendWindow::Stats st = w.stats();
  EXPECT_EQ(st.bytes_sent, 3 * (32 + 40));  // what went on the wire
  EXPECT_EQ(st.payload_bytes_sent, 3 * 32);
}

TEST(SendWindowTest, AMessageLargerThanTheWindowGoesAlone) {
  SendWindow w(100);
  w.Open();
  ASSERT_TRUE(w.Push(Message(500)).ok());  // an empty window takes anything
  std::optional<Outgoing> m = w.Next();
  ASSERT_TRUE(m.has_value());
  w.Complete(m->size, true);
  EXPECT_TRUE(w.WaitIdle(absl::ZeroDuration()).ok());
}

TEST(SendWindowTest, AFullWindowBlocksUntilTheStreamEndsAndThenSaysWhy) {
  SendWindow w(100);
  w.Open();
  ASSERT_TRUE(w.Push(Message(60)).ok());
  absl::Status pushed;
  std::thread producer([&] { pushed = w.Push(Message(60)); });
  // 60 + 60 > 100: the producer can only return once the stream ends.
  w.Break();
  w.Close(absl::NotFoundError("job 'j' was deleted"));
  producer.join();
  EXPECT_EQ(pushed.code(), absl::StatusCode::kNotFound) << pushed;
  EXPECT_FALSE(w.Next().has_value());
  EXPECT_EQ(w.WaitIdle(absl::Seconds(1)).code(), absl::StatusCode::kNotFound);
}

TEST(SendWindowTest, SpaceFreedByACompletedSendLetsTheNextPushIn) {
  SendWindow w(100);
  w.Open();
  ASSERT_TRUE(w.Push(Message(60)).ok());
  std::optional<Outgoing> first = w.Next();
  ASSERT_TRUE(first.has_value());
  std::atomic<bool> done{false};
  std::thread producer([&] {
    EXPECT_TRUE(w.Push(Message(60)).ok());
    done = true;
  });
  w.Complete(first->size, true);
  std::optional<Outgoing> second = w.Next();  // arrives once the producer got in
  producer.join();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->msg.seq(), 2u);
  EXPECT_TRUE(done);
}

TEST(SendWindowTest, BreakDropsQueuedMessagesAndReleasesTheirPayloads) {
  SendWindow w(100);
  w.Open();
  auto released = std::make_shared<std::atomic<int>>(0);
  for (int i = 0; i < 2; ++i) {
    std::shared_ptr<void> hold(nullptr, [released](void*) { ++*released; });
    ASSERT_TRUE(w.Push(Message(10, std::move(hold))).ok());
  }
  w.Break();
  EXPECT_EQ(*released, 2);
  EXPECT_FALSE(w.Next().has_value());
}

TEST(SendWindowTest, DrainSendsWhatIsQueuedAndRefusesMore) {
  SendWindow w(100);
  w.Open();
  ASSERT_TRUE(w.Push(Message(10)).ok());
  w.Drain();
  EXPECT_EQ(w.Push(Message(10)).code(), absl::StatusCode::kFailedPrecondition);
  std::optional<Outgoing> m = w.Next();
  ASSERT_TRUE(m.has_value());
  w.Complete(m->size, true);
  EXPECT_FALSE(w.Next().has_value());  // drained
  w.Close(absl::OkStatus());
  EXPECT_EQ(w.Push(Message(10)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(w.WaitIdle(absl::ZeroDuration()).ok());
}

v1::DownMessage Delta(int64_t round, const std::string& tensor) {
  v1::DownMessage m;
  m.mutable_delta()->set_round(round);
  m.mutable_delta()->set_tensor(tensor);
  return m;
}

v1::DownMessage Done(int64_t round) {
  v1::DownMessage m;
  m.mutable_done()->set_round(round);
  return m;
}

TEST(RoundAssemblerTest, CollectsInterleavedRoundsInArrivalOrder) {
  RoundAssembler a;
  a.Open();
  EXPECT_TRUE(a.Deliver(Delta(1, "w"), 10).ok());
  EXPECT_TRUE(a.Deliver(Delta(2, "x"), 10).ok());
  EXPECT_TRUE(a.Deliver(Delta(1, "b"), 10).ok());
  EXPECT_TRUE(a.Deliver(Done(2), 5).ok());
  EXPECT_TRUE(a.Deliver(Done(1), 5).ok());
  absl::StatusOr<RoundUpdate> one = a.Wait(1, absl::ZeroDuration());
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->deltas.size(), 2u);
  EXPECT_EQ(one->deltas[0].tensor(), "w");
  EXPECT_EQ(one->deltas[1].tensor(), "b");
  EXPECT_EQ(one->done.round(), 1);
  std::optional<RoundUpdate> two = a.Poll();
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->round, 2);
  ASSERT_EQ(two->deltas.size(), 1u);
  EXPECT_FALSE(a.Poll().has_value());
  EXPECT_EQ(a.Wait(3, absl::ZeroDuration()).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(a.stats().rounds_received, 2);
  EXPECT_EQ(a.stats().bytes_received, 40);
}

TEST(RoundAssemblerTest, CloseEndsWaitsButKeepsCompleteRounds) {
  RoundAssembler a;
  a.Open();
  ASSERT_TRUE(a.Deliver(Done(1), 1).ok());
  absl::StatusOr<RoundUpdate> waited;
  std::thread waiter([&] { waited = a.Wait(2, absl::Minutes(10)); });
  a.Close();
  waiter.join();
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(a.Wait(1, absl::ZeroDuration()).ok());
}

TEST(RoundAssemblerTest, OpenDropsTheLastStreamsPartialRounds) {
  RoundAssembler a;
  a.Open();
  ASSERT_TRUE(a.Deliver(Delta(1, "w"), 1).ok());
  a.Close();
  a.Open();
  ASSERT_TRUE(a.Deliver(Done(1), 1).ok());
  absl::StatusOr<RoundUpdate> u = a.Wait(1, absl::ZeroDuration());
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->deltas.empty());
}

TEST(RoundAssemblerTest, ACallbackGetsQueuedRoundsThenNewOnes) {
  RoundAssembler a;
  a.Open();
  ASSERT_TRUE(a.Deliver(Done(1), 1).ok());
  std::vector<int64_t> got;
  a.SetCallback([&](RoundUpdate u) { got.push_back(u.round); });
  ASSERT_TRUE(a.Deliver(Done(2), 1).ok());
  EXPECT_EQ(got, (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(a.Poll().has_value());
  a.SetCallback(nullptr);
  ASSERT_TRUE(a.Deliver(Done(3), 1).ok());
  EXPECT_TRUE(a.Poll().has_value());
}

TEST(RoundAssemblerTest, ErrorsKeepTheirCodeAndOnlyFatalOnesEndTheStream) {
  RoundAssembler a;
  a.Open();
  EXPECT_TRUE(
      a.Deliver(StreamErrorMessage(absl::InvalidArgumentError("bad column 99"), 7), 1).ok());
  absl::Status fatal =
      a.Deliver(StreamErrorMessage(absl::NotFoundError("job deleted"), 8, /*fatal=*/true), 1);
  EXPECT_EQ(fatal.code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(a.WaitForErrors(2, absl::ZeroDuration()));
  std::vector<absl::Status> errors = a.TakeErrors();
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(errors[0].message(), "bad column 99 (message #7)");
  EXPECT_EQ(errors[1].code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(a.TakeErrors().empty());
  EXPECT_EQ(a.stats().stream_errors, 2);
}

TEST(RoundAssemblerTest, RoundsSentAgainAfterADaemonRestartAreDropped) {
  RoundAssembler a;
  a.Open();
  ASSERT_TRUE(a.Deliver(Delta(1, "w"), 10).ok());
  ASSERT_TRUE(a.Deliver(Done(1), 5).ok());
  ASSERT_TRUE(a.Wait(1, absl::ZeroDuration()).ok());
  // A new stream (the daemon restarted from an older checkpoint) sends
  // rounds 1 and 2 again: round 1 was delivered, round 2 is new.
  a.Close();
  a.Open();
  ASSERT_TRUE(a.Deliver(Delta(1, "w"), 10).ok());
  ASSERT_TRUE(a.Deliver(Done(1), 5).ok());
  ASSERT_TRUE(a.Deliver(Delta(2, "w"), 10).ok());
  ASSERT_TRUE(a.Deliver(Done(2), 5).ok());
  EXPECT_TRUE(a.WaitDoneSeen(2, absl::ZeroDuration()));
  std::optional<RoundUpdate> next = a.Poll();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->round, 2);
  EXPECT_EQ(next->deltas.size(), 1u);
  EXPECT_FALSE(a.Poll().has_value());
  EXPECT_EQ(a.stats().rounds_dropped_duplicate, 1);
  // Another job: rounds start again from 0 and nothing counts as delivered.
  a.Reset();
  ASSERT_TRUE(a.Deliver(Done(1), 5).ok());
  EXPECT_TRUE(a.Poll().has_value());
}

}  // namespace
}  // namespace zenflow
