// Bad input on the transports against a real zenflowd: UCX attaches and frames
// that are wrong, stream and upload messages that do not parse, rendezvous
// abandoned halfway, and ranks (gRPC or UCX) that do not read their deltas.
// Each is rejected with a specific status, in band where the stream goes on,
// and bounded; the job stays exact. The fixture is bad_input_fixture.h.
#include "tests/bad_input_fixture.h"

#include <cstring>

namespace zenflow::testing {
namespace {

using absl::StatusCode;

class RawUcxRank {
 public:
  // The worker goes first: its sends in flight read frames_.
  ~RawUcxRank() { worker_.reset(); }
  absl::Status Start() {
    ZF_ASSIGN_OR_RETURN(worker_, UcxWorker::Create({}, [this](uint64_t tag, std::string f) {
                          MutexLock lock(&mu_);
                          got_.push_back({tag, std::move(f)});
                        }));
    return absl::OkStatus();
  }
  // Attaches over gRPC asking for UCX; returns the stream's end status if
  // the daemon refused.
  absl::Status Attach(v1::ZenFlow::Stub* stub, const std::string& job, int32_t rank, uint64_t tag,
                      std::string address) {
    ctx_ = std::make_unique<grpc::ClientContext>();
    AddTestToken(ctx_.get());
    stream_ = stub->Stream(ctx_.get());
    v1::UpMessage hello;
    hello.mutable_attach()->set_job_id(job);
    hello.mutable_attach()->set_rank(rank);
    hello.mutable_attach()->set_ucx_address(address);
    hello.mutable_attach()->set_ucx_tag(tag);
    stream_->Write(hello);
    v1::DownMessage greeting;
    if (!stream_->Read(&greeting)) {
      grpc::Status st = stream_->Finish();
      stream_.reset();
      return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
    }
    if (greeting.attached().ucx_address().empty()) {
      return absl::InternalError("greeting without the daemon's UCX address");
    }
    tag_ = tag;
    up_tag_ = greeting.attached().ucx_tag();
    if (up_tag_ == 0 || up_tag_ == tag) {
      return absl::InternalError("the daemon's tag for this connection must be its own");
    }
    daemon_address_ = greeting.attached().ucx_address();
    ZF_ASSIGN_OR_RETURN(ep_, worker_->Connect(daemon_address_));
    return absl::OkStatus();
  }
  // Connects to a daemon's UCX worker without attaching (an intruder).
  absl::Status ConnectOnly(const std::string& daemon_address) {
    ZF_ASSIGN_OR_RETURN(ep_, worker_->Connect(daemon_address));
    return absl::OkStatus();
  }
  void SendRaw(std::string frame) { SendRawWithTag(up_tag_, std::move(frame)); }
  void SendRawWithTag(uint64_t tag, std::string frame) {
    frames_.push_back(std::make_unique<std::string>(std::move(frame)));
    worker_->Send(ep_, tag, {*frames_.back()}, nullptr);
  }
  void Send(v1::UpMessage m) {
    std::string payload, header;
    SplitFrame(&m, &payload, &header);
    SendRaw(payload + header);
  }
  // The next down message (parsed), or an error after 30 s.
  absl::StatusOr<v1::DownMessage> Next() {
    MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !got_.empty(); },
                              absl::Seconds(30))) {
      return absl::DeadlineExceededError("no UCX message from the daemon");
    }
    auto [tag, frame] = std::move(got_.front());
    got_.pop_front();
    if (tag != tag_) return absl::InternalError("UCX message with another connection's tag");
    v1::DownMessage m;
    ZF_RETURN_IF_ERROR(ParseFrame(std::move(frame), &m));
    return m;
  }
  void Close() {
    if (stream_ == nullptr) return;
    (void)worker_->Flush(ep_, absl::Seconds(10));
    stream_->WritesDone();
    (void)stream_->Finish();
    stream_.reset();
  }
  const std::string& address() const { return worker_->address(); }
  const std::string& daemon_address() const { return daemon_address_; }
  uint64_t tag() const { return tag_; }
  uint64_t up_tag() const { return up_tag_; }
  absl::Status Flush() { return worker_->Flush(ep_, absl::Seconds(10)); }
  // Stops (or restarts) taking the daemon's messages off the wire.
  void PauseReceiving(bool p) { worker_->PauseReceiving(p); }
  // Waits for the daemon to end the lifeline; its status.
  absl::Status Ended() {
    v1::DownMessage m;
    while (stream_->Read(&m)) {
    }
    grpc::Status st = stream_->Finish();
    stream_.reset();
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  }

 private:
  std::unique_ptr<UcxWorker> worker_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::UpMessage, v1::DownMessage>> stream_;
  uint64_t tag_ = 0, up_tag_ = 0, ep_ = 0;
  std::string daemon_address_;
  std::vector<std::unique_ptr<std::string>> frames_;
  Mutex mu_;
  std::deque<std::pair<uint64_t, std::string>> got_ ABSL_GUARDED_BY(mu_);
};

// Attaches `rank` with the library once a raw stream of it has let go: the
// daemon closes a raw UCX connection asynchronously after its stream ends.
absl::Status AttachOnceFree(Client& c, const std::string& job, int32_t rank) {
  absl::Status s = absl::UnavailableError("not tried");
  for (int i = 0; i < 100 && !s.ok(); ++i) {
    s = c.Attach(job, rank);
    if (!s.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  return s;
}

// A one-rank job whose rank 0 is joined but not attached.
std::unique_ptr<Harness> JoinedNotAttached(const std::string& target) {
  JobOptions o;
  o.job_id = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  o.world = 1;
  auto h = std::make_unique<Harness>(target, o);
  absl::Status s = h->Connect();
  if (s.ok()) s = h->CreateJob();
  if (s.ok()) s = h->Upload();
  if (s.ok()) {
    grpc::ClientContext ctx;
    AddTestToken(&ctx);
    v1::JoinJobRequest req;
    req.set_job_id(o.job_id);
    req.set_rank(0);
    v1::JoinJobResponse resp;
    grpc::Status g = StubOf(h->client(0))->JoinJob(&ctx, req, &resp);
    if (!g.ok()) s = absl::InternalError(g.error_message());
  }
  EXPECT_TRUE(s.ok()) << s;
  return h;
}

TEST_F(BadInputTest, UcxAttachWithBadTagOrAddressIsInvalidArgument) {
  std::unique_ptr<Harness> h = JoinedNotAttached(daemon_->target());
  RawUcxRank raw;
  ASSERT_OK(raw.Start());
  const std::string job = h->options().job_id;
  ExpectStatus(raw.Attach(StubOf(h->client(0)).get(), job, 0, /*tag=*/0, raw.address()),
               StatusCode::kInvalidArgument, "ucx_tag must be nonzero");
  ExpectStatus(raw.Attach(StubOf(h->client(0)).get(), job, 0, /*tag=*/(uint64_t{1} << 63) | 5,
                          raw.address()),
               StatusCode::kInvalidArgument, "below 2^63");
  ExpectStatus(raw.Attach(StubOf(h->client(0)).get(), job, 0, 7, "abc"), StatusCode::kInvalidArgument,
               "is not a UCX worker address");
  // Junk where the address should be: refused, the same way every time, and
  // the daemon stays up.
  std::string noise(200, '\0');
  uint32_t x = 12345;
  for (char& ch : noise) {
    x = x * 1664525u + 1013904223u;
    ch = static_cast<char>(x >> 24);
  }
  // Also junk behind a genuine header byte (what a corrupted address looks like).
  std::string tail_ff = raw.address().substr(0, 1) + std::string(95, '\xff');
  std::string tail_noise = raw.address().substr(0, 1) + noise;
  std::string tail_zero = raw.address().substr(0, 1) + std::string(95, '\0');
  for (const std::string& junk : {std::string(96, '\x01'), std::string(96, '\xff'), noise, tail_ff,
                                  tail_noise, tail_zero}) {
    absl::Status st = raw.Attach(StubOf(h->client(0)).get(), job, 0, 7, junk);
    EXPECT_FALSE(st.ok());
    EXPECT_TRUE(absl::StrContains(st.message(), "cannot reach the rank's UCX worker")) << st;
  }
  ExpectStatus(raw.Attach(StubOf(h->client(0)).get(), "no_such_job", 0, 7, raw.address()),
               StatusCode::kNotFound, "no_such_job");
  // The rank is still free: the library attaches it and a round is exact.
  ASSERT_OK(h->client(0).Attach(job, 0));
  ASSERT_OK(h->GoodRound(1e-2f));
}

// A UCX connection belongs to the stream that attached it: frames from
// another process's UCX worker, even with the tag the rank chose, are
// dropped (the rank's frames carry the daemon's random tag, told only on
// its authenticated stream), and the job is untouched.
TEST_F(BadInputTest, UcxFramesFromAnotherProcessAreDropped) {
  std::unique_ptr<Harness> h = JoinedNotAttached(daemon_->target());
  RawUcxRank raw;
  ASSERT_OK(raw.Start());
  const std::string job = h->options().job_id;
  ASSERT_OK(raw.Attach(StubOf(h->client(0)).get(), job, 0, 0x1111222233334444ull, raw.address()));
  auto dropped = [&]() -> int64_t {
    absl::StatusOr<v1::GetStatsResponse> st = h->client(0).GetStats("");
    return st.ok() ? st->ucx().frames_dropped() : -1;
  };
  const int64_t before = dropped();
  ASSERT_GE(before, 0);
  RawUcxRank intruder;
  ASSERT_OK(intruder.Start());
  ASSERT_OK(intruder.ConnectOnly(raw.daemon_address()));
  v1::UpMessage up;
  up.set_seq(1);
  *up.mutable_shard() = Shard(*h, 0, {0});
  std::string payload, header;
  SplitFrame(&up, &payload, &header);
  const std::vector<uint64_t> guesses = {raw.tag(), raw.tag() + 1, 1, raw.up_tag() ^ 1};
  for (uint64_t tag : guesses) intruder.SendRawWithTag(tag, payload + header);
  ASSERT_OK(intruder.Flush());
  for (int i = 0; i < 300 && dropped() < before + static_cast<int64_t>(guesses.size()); ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(dropped(), before + static_cast<int64_t>(guesses.size()));
  raw.Close();
  // Had a shard been taken, the rank's own push of column 0 for that step
  // would be refused and the round would differ: it is exact.
  ASSERT_OK(AttachOnceFree(h->client(0), job, 0));
  ASSERT_OK(h->GoodRound(1e-2f));
  EXPECT_TRUE(h->client(0).TakeErrors().empty());
}

// UCX workers rotate (UcxDataPlane): a rank that attaches again and again
// while another job's rank stays attached moves the daemon to new workers,
// never keeping more than the one the attached rank is on and the current
// one, and both jobs' rounds stay exact.
TEST_F(BadInputTest, UcxWorkersRotateUnderReattachesWhileAnotherRankStays) {
  if (TestTransport() != Transport::kUcx) GTEST_SKIP() << "the UCX target runs it";
  JobOptions stay_opts;
  stay_opts.job_id = "rotate_stays";
  stay_opts.world = 1;
  Harness stay(daemon_->target(), stay_opts);
  ASSERT_OK(stay.Setup());
  ASSERT_OK(stay.GoodRound(1e-2f));
  JobOptions again_opts;
  again_opts.job_id = "rotate_again";
  again_opts.world = 1;
  Harness again(daemon_->target(), again_opts);
  ASSERT_OK(again.Connect());
  ASSERT_OK(again.CreateJob());
  ASSERT_OK(again.Upload());
  auto workers = [&]() -> int64_t {
    absl::StatusOr<v1::GetStatsResponse> st = stay.client(0).GetStats("");
    return st.ok() ? st->ucx().workers() : -1;
  };
  int64_t most = 0;
  for (int i = 0; i < 40; ++i) {
    ClientOptions co = TestClientOptions(daemon_->target());
    co.transport = Transport::kUcx;
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(co);
    ASSERT_OK(c.status());
    if (i == 0) {
      ASSERT_OK((*c)->JoinJob("rotate_again", 0).status());
    } else {
      ASSERT_OK(AttachOnceFree(**c, "rotate_again", 0));
    }
    most = std::max(most, workers());
  }  // each client's stream ends as it goes
  std::printf("UCX workers at most %lld during 40 attaches\n", static_cast<long long>(most));
  EXPECT_GE(most, 1);
  EXPECT_LE(most, 2) << "closed connections' workers must go";
  ASSERT_OK(AttachOnceFree(again.client(0), "rotate_again", 0));
  ASSERT_OK(again.GoodRound(1e-2f));
  ASSERT_OK(stay.GoodRound(1e-2f));
  EXPECT_LE(workers(), 2);
}

TEST_F(BadInputTest, UcxMalformedFramesAreRejectedInBand) {
  std::unique_ptr<Harness> h = JoinedNotAttached(daemon_->target());
  RawUcxRank raw;
  ASSERT_OK(raw.Start());
  const std::string job = h->options().job_id;
  ASSERT_OK(raw.Attach(StubOf(h->client(0)).get(), job, 0, 0x1234567887654321ull, raw.address()));
  auto expect_error = [&](StatusCode code, const std::string& fragment) {
    absl::StatusOr<v1::DownMessage> m = raw.Next();
    ASSERT_OK(m.status());
    ASSERT_EQ(m->kind_case(), v1::DownMessage::kError) << m->DebugString();
    ExpectStatus(absl::Status(static_cast<StatusCode>(m->error().code()), m->error().message()),
                 code, fragment);
  };
  raw.SendRaw("short");
  expect_error(StatusCode::kInvalidArgument, "shorter than its trailer");
  raw.SendRaw(std::string(64, 'x'));
  expect_error(StatusCode::kInvalidArgument, "bad magic");
  // A well-formed frame of a bad message is judged like one from gRPC.
  v1::UpMessage up;
  up.set_seq(5);
  *up.mutable_shard() = Shard(*h, 0, {0});
  up.mutable_shard()->set_tensor("nope");
  raw.Send(up);
  expect_error(StatusCode::kNotFound, "nope");
  v1::UpMessage again;
  again.mutable_attach()->set_job_id(job);
  raw.Send(again);
  expect_error(StatusCode::kFailedPrecondition, "attach travels over the gRPC stream");
  raw.Close();
  EXPECT_GE(Rejected(*h, "INVALID_ARGUMENT"), 2);
  // Nothing changed: the library attaches the rank and a round is exact.
  ASSERT_OK(AttachOnceFree(h->client(0), job, 0));
  ASSERT_OK(h->GoodRound(1e-2f));
}


// A Stream call that sends raw bytes (what a broken or hostile client sends).
std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> RawStream(
    grpc::ChannelInterface* channel, grpc::ClientContext* ctx) {
  static const grpc::internal::RpcMethod method(
      "/zenflow.v1.ZenFlow/Stream", grpc::internal::RpcMethod::BIDI_STREAMING);
  return std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel, method, ctx));
}

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer Up(const v1::UpMessage& m) {
  grpc::ByteBuffer b;
  bool own = false;
  (void)grpc::SerializationTraits<v1::UpMessage>::Serialize(m, &b, &own);
  return b;
}

absl::StatusOr<v1::DownMessage> ReadDownMessageRaw(grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>& s) {
  grpc::ByteBuffer b;
  if (!s.Read(&b)) return absl::UnavailableError("stream ended");
  // Parsed by protobuf straight from gRPC's slices (no copy here: under
  // ThreadSanitizer, reading them from test code looks like a race with
  // the uninstrumented gRPC thread that filled them).
  v1::DownMessage m;
  if (!grpc::SerializationTraits<v1::DownMessage>::Deserialize(&b, &m).ok()) {
    return absl::InternalError("unparseable down message");
  }
  return m;
}

v1::UpMessage AttachMsg(const std::string& job, int rank) {
  v1::UpMessage m;
  m.mutable_attach()->set_job_id(job);
  m.mutable_attach()->set_rank(rank);
  return m;
}

// 5. Bytes that are not an UpMessage get an in-band INVALID_ARGUMENT; the
// stream stays up and the next message is handled.
TEST_F(BadInputTest, UnparseableStreamMessageIsRejectedInBand) {
  std::unique_ptr<Harness> h = JoinedNotAttached(daemon_->target());
  const std::string job = h->options().job_id;
  grpc::ClientContext ctx;
  AddTestToken(&ctx);
  auto stream = RawStream(h->client(0).channel().get(), &ctx);
  ASSERT_TRUE(stream->Write(Up(AttachMsg(job, 0))));
  absl::StatusOr<v1::DownMessage> hello = ReadDownMessageRaw(*stream);
  ASSERT_OK(hello.status());
  ASSERT_EQ(hello->kind_case(), v1::DownMessage::kAttached);
  ASSERT_TRUE(stream->Write(Bytes(std::string("\xff\xff\xff\xff\xff", 5))));
  absl::StatusOr<v1::DownMessage> err = ReadDownMessageRaw(*stream);
  ASSERT_OK(err.status());
  ASSERT_EQ(err->kind_case(), v1::DownMessage::kError) << err->DebugString();
  ExpectStatus(absl::Status(static_cast<StatusCode>(err->error().code()), err->error().message()),
               StatusCode::kInvalidArgument,
               "message #2 of this stream (5 bytes) is not a valid zenflow.v1.UpMessage");
  // Still up: the next message is judged on its own.
  v1::UpMessage next;
  next.set_seq(9);
  *next.mutable_shard() = Shard(*h, 0, {0});
  next.mutable_shard()->set_tensor("nope");
  ASSERT_TRUE(stream->Write(Up(next)));
  err = ReadDownMessageRaw(*stream);
  ASSERT_OK(err.status());
  EXPECT_EQ(err->error().seq(), 9u);
  EXPECT_EQ(err->error().code(), static_cast<int>(StatusCode::kNotFound));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_OK(h->client(0).Attach(job, 0));
  ASSERT_OK(h->GoodRound(1e-2f));
}

// 5, for UploadParameters: a chunk that does not parse ends the upload with
// INVALID_ARGUMENT (it is not taken for the end of the stream, which would
// commit), and nothing is stored.
TEST_F(BadInputTest, UnparseableUploadChunkEndsTheUploadAndStoresNothing) {
  JobOptions o;
  o.job_id = "upload_garbage";
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Connect());
  ASSERT_OK(h.CreateJob());
  static const grpc::internal::RpcMethod method(
      "/zenflow.v1.ZenFlow/UploadParameters", grpc::internal::RpcMethod::CLIENT_STREAMING);
  grpc::ClientContext ctx;
  AddTestToken(&ctx);
  grpc::ByteBuffer resp;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> up(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          h.client(0).channel().get(), method, &ctx, &resp));
  // A whole first tensor, then garbage.
  std::vector<float> zeros(8 * 16, 0.0f);
  v1::UploadParametersRequest chunk;
  chunk.set_job_id("upload_garbage");
  chunk.set_tensor("w");
  chunk.add_shape(8);
  chunk.add_shape(16);
  chunk.set_payload(reinterpret_cast<const char*>(zeros.data()), zeros.size() * 4);
  ASSERT_TRUE(up->Write(Bytes(chunk.SerializeAsString())));
  up->Write(Bytes(std::string("\xff\xff\xff", 3)));
  up->WritesDone();
  grpc::Status g = up->Finish();
  ExpectStatus(absl::Status(static_cast<StatusCode>(g.error_code()), g.error_message()),
               StatusCode::kInvalidArgument,
               "message #2 of this stream (3 bytes) is not a valid zenflow.v1.UploadParametersRequest");
  ASSERT_OK(h.Upload());  // the real upload is the first one that commits
  ASSERT_OK(h.JoinAll());
  ASSERT_OK(h.GoodRound(1e-2f));
}

int64_t PendingRendezvousBytes(Harness& h) {
  absl::StatusOr<v1::GetStatsResponse> st = h.client(0).GetStats(h.options().job_id);
  return st.ok() ? st->jobs(0).pending_rendezvous_bytes() : -1;
}

// Waits until the daemon holds no pending rendezvous payload.
bool PendingDrains(Harness& h) {
  return WaitUntil([&] { return PendingRendezvousBytes(h) == 0; });
}

// 6. A rendezvous call whose deadline passes is withdrawn with its memory; a
// retry of the same step works; a second call for the same step replaces
// the first.
TEST_F(BadInputTest, AbandonedRendezvousIsWithdrawnAndRetryable) {
  auto h = MakeJob();
  const std::string job = h->options().job_id;
  auto all_reduce = [&](int rank, int64_t step, const std::vector<float>& v, absl::Duration d) {
    v1::AllReduceRequest req;
    req.set_job_id(job);
    req.set_rank(rank);
    req.set_step(step);
    auto* p = req.add_parts();
    p->set_name("g");
    p->set_payload(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    grpc::ClientContext ctx;
    AddTestToken(&ctx);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + d));
    v1::AllReduceResponse resp;
    grpc::Status g = StubOf(h->client(rank))->AllReduce(&ctx, req, &resp);
    std::vector<float> out;
    if (g.ok()) {
      out.resize(resp.parts(0).payload().size() / 4);
      std::memcpy(out.data(), resp.parts(0).payload().data(), out.size() * 4);
    }
    return std::make_pair(g, out);
  };
  const std::vector<float> junk(1 << 16, 1000.0f);  // 256 KiB a call
  for (int i = 0; i < 5; ++i) {
    auto [g, out] = all_reduce(0, 7, junk, absl::Milliseconds(100));
    EXPECT_EQ(g.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << g.error_message();
    ASSERT_TRUE(PendingDrains(*h)) << "attempt " << i << " left "
                                   << PendingRendezvousBytes(*h) << " bytes";
  }
  // A retry that completes: only the new values count.
  std::vector<float> a(1 << 16, 1.0f), b(1 << 16, 3.0f);
  std::pair<grpc::Status, std::vector<float>> r0;
  std::thread first([&] { r0 = all_reduce(0, 7, a, absl::Seconds(30)); });
  auto r1 = all_reduce(1, 7, b, absl::Seconds(30));
  first.join();
  ASSERT_TRUE(r0.first.ok()) << r0.first.error_message();
  ASSERT_TRUE(r1.first.ok()) << r1.first.error_message();
  EXPECT_EQ(r0.second, std::vector<float>(1 << 16, 2.0f));
  EXPECT_EQ(r1.second, r0.second);
  // Two live calls of rank 0 for one step: the second replaces the first.
  std::pair<grpc::Status, std::vector<float>> old_call, new_call;
  std::thread t1([&] { old_call = all_reduce(0, 8, junk, absl::Seconds(30)); });
  WaitUntil([&] { return PendingRendezvousBytes(*h) > 0; });
  std::thread t2([&] { new_call = all_reduce(0, 8, a, absl::Seconds(30)); });
  t1.join();
  EXPECT_EQ(old_call.first.error_code(), grpc::StatusCode::ABORTED)
      << old_call.first.error_message();
  r1 = all_reduce(1, 8, b, absl::Seconds(30));
  t2.join();
  ASSERT_TRUE(new_call.first.ok()) << new_call.first.error_message();
  EXPECT_EQ(new_call.second, std::vector<float>(1 << 16, 2.0f));
  EXPECT_EQ(PendingRendezvousBytes(*h), 0);
  // SubmitImportance: the same.
  v1::SubmitImportanceRequest sreq;
  sreq.set_job_id(job);
  sreq.set_rank(0);
  sreq.set_step(h->next_round() * 4);
  auto* ti = sreq.add_tensors();
  ti->set_tensor("w");
  for (int c = 0; c < 16; ++c) ti->add_scores(100.0f - c);
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    AddTestToken(&ctx);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
    v1::SubmitImportanceResponse sresp;
    grpc::Status g = StubOf(h->client(0))->SubmitImportance(&ctx, sreq, &sresp);
    EXPECT_EQ(g.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << g.error_message();
    ASSERT_TRUE(PendingDrains(*h));
  }
  // The abandoned scores are gone: the selection follows the new ones.
  std::vector<float> imp(16);
  for (int c = 0; c < 16; ++c) imp[c] = static_cast<float>(c);
  ASSERT_OK(h->Reselect({imp, {}}));
  ASSERT_OK(h->GoodRound(1e-2f));
}

// A world-1 zero_offload job of one [rows, 512] tensor (2 KiB x rows of
// deltas a round), uploaded, rank 0 joined but not attached.
absl::Status CreateBigJoinedJob(Client& c, const std::string& id, int64_t rows) {
  v1::JobSpec spec = SquareJob(id, {{rows, 512}});
  spec.set_mode(v1::MODE_ZERO_OFFLOAD);  // S = 1, every column remote
  ZF_RETURN_IF_ERROR(c.CreateJob(spec).status());
  std::vector<float> init(rows * 512, 0.5f);
  ZF_RETURN_IF_ERROR(c.UploadParameters(id, {{"t0", {rows, 512}, init.data()}}).status());
  grpc::ClientContext jctx;
  AddTestToken(&jctx);
  v1::JoinJobRequest req;
  req.set_job_id(id);
  v1::JoinJobResponse resp;
  grpc::Status g = StubOf(c)->JoinJob(&jctx, req, &resp);
  if (!g.ok()) return absl::InternalError(g.error_message());
  return absl::OkStatus();
}

v1::UpMessage BigShard(int64_t step, int64_t rows) {
  const std::vector<uint16_t> g(rows * 512, 0x3c23);  // bf16 0.01
  v1::UpMessage m;
  v1::GradientShard* sh = m.mutable_shard();
  sh->set_step(step);
  sh->set_tensor("t0");
  sh->set_dtype(v1::DTYPE_BF16);
  for (int col = 0; col < 512; ++col) sh->add_columns(col);
  sh->set_payload(reinterpret_cast<const char*>(g.data()), g.size() * 2);
  return m;
}

v1::UpMessage Close(int64_t round) {
  v1::UpMessage close;
  close.mutable_close()->set_round(round);
  close.mutable_close()->set_lr(1e-3f);
  return close;
}

// 7. A rank that does not read: once its outbox holds --max_outbox_bytes the
// daemon stops reading from it (gRPC's flow control then stops its sends);
// when it reads again, everything it was sent arrives and reading resumes.
// The rank closes 40 rounds of a 128 KiB tensor without reading a delta
// (it paces its closes by GetStats, as it must not run two rounds ahead of
// the updates).
TEST_F(BadInputTest, RankThatDoesNotReadIsPausedNotBuffered) {
  if (TestTransport() == Transport::kUcx) {
    GTEST_SKIP() << "over UCX the flow control is the daemon's parking of frames; see docs/operating.md#a-rank-that-does-not-read-its-stream";
  }
  auto h = MakeJob();
  ClientOptions co = TestClientOptions(daemon_->target());
  co.transport = Transport::kGrpc;
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  ASSERT_OK(CreateBigJoinedJob(**c, "no_reader", 64));
  // Its own connection, with HTTP/2's receive window left at 64 KiB (no BDP
  // probing), so that little of what it does not read fits in the pipes.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetMaxReceiveMessageSize(-1);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(daemon_->target(), grpc::InsecureChannelCredentials(), args);
  grpc::ClientContext ctx;
  AddTestToken(&ctx);
  auto stream = RawStream(channel.get(), &ctx);
  ASSERT_TRUE(stream->Write(Up(AttachMsg("no_reader", 0))));
#if defined(__SANITIZE_THREAD__)
  constexpr int kRounds = 12;  // TSan checks every byte read from gRPC's buffers: slow
#else
  constexpr int kRounds = 40;
#endif
  std::thread writer([&] {
    for (int r = 0; r < kRounds; ++r) {
      for (int i = 0; i < 60000; ++i) {
        absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats("no_reader");
        if (!st.ok() || st->jobs(0).rounds_updated() >= r - 1) break;
        absl::SleepFor(absl::Milliseconds(1));
      }
      if (!stream->Write(Up(BigShard(r, 64)))) return;
      if (!stream->Write(Up(Close(r)))) return;
    }
  });
  v1::JobStats job;
  WaitUntil([&] {
    absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats("no_reader");
    if (!st.ok()) return false;
    job = st->jobs(0);
    return job.ranks_size() == 1 && job.ranks(0).reading_paused();
  });
  ASSERT_EQ(job.ranks_size(), 1);
  ASSERT_TRUE(job.ranks(0).reading_paused())
      << "the daemon kept reading a rank that does not read: " << job.DebugString();
  // The limit, plus at most the rounds closed before reading stopped (one
  // round's deltas are 128 KiB here; two can be in flight).
  EXPECT_GE(job.ranks(0).outbox_bytes(), 65536);
  EXPECT_LT(job.ranks(0).outbox_bytes(), 65536 + 3 * (150 << 10));
  EXPECT_LT(job.rounds_updated(), kRounds);
  // Now read: the greeting, then every round's deltas and RoundDone, in
  // order; nothing was lost or rejected.
  absl::StatusOr<v1::DownMessage> m = ReadDownMessageRaw(*stream);
  ASSERT_OK(m.status());
  EXPECT_EQ(m->kind_case(), v1::DownMessage::kAttached);
  int64_t done = 0, deltas = 0;
  while (done < kRounds) {
    m = ReadDownMessageRaw(*stream);
    ASSERT_TRUE(m.ok()) << "after " << done << " rounds: " << m.status();
    ASSERT_NE(m->kind_case(), v1::DownMessage::kError) << m->error().message();
    if (m->kind_case() == v1::DownMessage::kDelta) ++deltas;
    if (m->kind_case() == v1::DownMessage::kDone) {
      ASSERT_EQ(m->done().round(), done);
      ++done;
    }
  }
  EXPECT_GE(deltas, kRounds);
  writer.join();
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats("no_reader");
  ASSERT_OK(st.status());
  EXPECT_EQ(st->jobs(0).rounds_updated(), kRounds);
  EXPECT_EQ(st->jobs(0).ranks(0).outbox_bytes(), 0);
  EXPECT_TRUE(st->jobs(0).rejected().empty());
  ASSERT_OK((*c)->DeleteJob("no_reader"));
  ASSERT_OK(h->GoodRound(1e-2f));
}

// 7, over UCX: a rank whose UCX worker does not take the daemon's messages.
// Its outbox fills, its frames are parked instead of handled, and once they
// pass --max_outbox_bytes + --max_message_bytes it is cut off: connection
// closed, lifeline ended with RESOURCE_EXHAUSTED, the daemon unharmed.
TEST_F(BadInputTest, UcxRankThatDoesNotReadIsCutOff) {
  auto h = MakeJob();
  ClientOptions co = TestClientOptions(daemon_->target());
  co.transport = Transport::kGrpc;
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  ASSERT_OK(CreateBigJoinedJob(**c, "no_reader_ucx", 256));
  RawUcxRank raw;
  ASSERT_OK(raw.Start());
  ASSERT_OK(raw.Attach(StubOf(**c).get(), "no_reader_ucx", 0, 0x5eed, raw.address()));
  // Waits until the job has updated `rounds` rounds and the rank's outbox
  // holds at least `min_outbox` bytes (at most `max_outbox`); returns the
  // outbox bytes.
  auto wait_for = [&](int64_t rounds, int64_t min_outbox,
                      int64_t max_outbox = std::numeric_limits<int64_t>::max()) -> int64_t {
    int64_t outbox = -1;
    const bool ok = WaitUntil([&] {
      absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats("no_reader_ucx");
      if (!st.ok()) return false;
      const v1::JobStats& j = st->jobs(0);
      outbox = j.ranks(0).outbox_bytes();
      return j.rounds_updated() >= rounds && outbox >= min_outbox && outbox <= max_outbox;
    });
    return ok ? outbox : -1;
  };
  raw.PauseReceiving(true);
  // Round 0; its deltas fill the outbox (they cannot leave).
  raw.Send(BigShard(0, 256));
  raw.Send(Close(0));
  ASSERT_GE(wait_for(1, 65536), 65536);
  // Round 1 is parked until the rank takes its messages again; then it is
  // handled and updated.
  raw.Send(BigShard(1, 256));
  raw.Send(Close(1));
  raw.PauseReceiving(false);
  // Round 1 updated and its deltas taken by the rank (else round 2's frames
  // would be parked behind them, not handled).
  ASSERT_GE(wait_for(2, 0, 0), 0) << "parked frames were not handled after the outbox drained";
  // Not reading again: round 2 fills the outbox...
  raw.PauseReceiving(true);
  raw.Send(BigShard(2, 256));
  raw.Send(Close(2));
  const int64_t outbox = wait_for(3, 65536);
  ASSERT_GE(outbox, 65536);
  // ...and its frames are parked, not handled: 8 more rounds (2 MiB) pass
  // the limit of what it may leave waiting.
  for (int r = 3; r < 11; ++r) {
    raw.Send(BigShard(r, 256));
    raw.Send(Close(r));
  }
  absl::Status end = raw.Ended();
  ExpectStatus(end, StatusCode::kResourceExhausted,
               absl::StrCat("rank 0 of job 'no_reader_ucx' has more than 1114112 bytes of "
                            "messages waiting in the daemon while its outbox holds ",
                            outbox, " bytes (--max_outbox_bytes 65536)"));
  absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats("no_reader_ucx");
  ASSERT_OK(st.status());
  EXPECT_EQ(st->ucx().connections_cut(), 1);
  // What waits for the rank is its outbox, bounded: the limit plus the
  // rounds closed before it filled.
  EXPECT_LT(st->jobs(0).ranks(0).outbox_bytes(), 65536 + 3 * (600 << 10));
  EXPECT_EQ(st->jobs(0).rounds_updated(), 3) << "parked frames were handled";
  ASSERT_OK((*c)->DeleteJob("no_reader_ucx"));
  ASSERT_OK(h->GoodRound(1e-2f));
}

// 7b, over UCX: a rank that reads but sends faster than the daemon's
// dispatcher handles its frames (a daemon whose every frame waits 20 ms).
// A round's 16 frames of 128 KiB are sent at once, 2 MiB against a held
// limit of 1.06 MiB (--max_outbox_bytes + --max_message_bytes): the
// daemon's receiving thread holds back past half the limit instead of
// cutting the rank off, and the round closes and updates with every
// column received once. (Before the backpressure this cut the rank off:
// RESOURCE_EXHAUSTED, "has more than 1114112 bytes of messages waiting".)
TEST_F(BadInputTest, UcxRankFasterThanItsDispatcherIsSlowedNotCutOff) {
  DaemonProcess slow;
  ASSERT_OK(slow.Start({"--max_message_bytes=1048576", "--memory_budget_bytes=268435456",
                        "--max_outbox_bytes=65536", "--emulate_ucx_frame_ms=20"}));
  ClientOptions co = TestClientOptions(slow.target());
  co.transport = Transport::kGrpc;
  co.max_shard_bytes = 512 << 10;  // the upload's chunks, under the daemon's message limit
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  constexpr int64_t kRows = 2048, kColsPerFrame = 32;
  ASSERT_OK(CreateBigJoinedJob(**c, "fast_rank", kRows));
  RawUcxRank raw;
  ASSERT_OK(raw.Start());
  ASSERT_OK(raw.Attach(StubOf(**c).get(), "fast_rank", 0, 0x5eed, raw.address()));
  const std::vector<uint16_t> g(kRows * kColsPerFrame, 0x3c23);  // bf16 0.01
  for (int first = 0; first < 512; first += kColsPerFrame) {
    v1::UpMessage m;
    v1::GradientShard* sh = m.mutable_shard();
    sh->set_step(0);
    sh->set_tensor("t0");
    sh->set_dtype(v1::DTYPE_BF16);
    for (int col = first; col < first + kColsPerFrame; ++col) sh->add_columns(col);
    sh->set_payload(reinterpret_cast<const char*>(g.data()), g.size() * 2);
    raw.Send(std::move(m));
  }
  raw.Send(Close(0));
  ASSERT_TRUE(WaitUntil([&] {
    absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats("fast_rank");
    return st.ok() && (st->jobs(0).rounds_updated() >= 1 || st->ucx().connections_cut() > 0);
  }));
  absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats("fast_rank");
  ASSERT_OK(st.status());
  EXPECT_EQ(st->ucx().connections_cut(), 0) << "a rank that only sent fast was cut off";
  EXPECT_EQ(st->jobs(0).rounds_updated(), 1);
  EXPECT_TRUE(st->jobs(0).rejected().empty());
  // The deltas, over UCX: every value took the same update (each column's
  // shard arrived once), then the round's RoundDone.
  int64_t values = 0;
  float first = 0;
  for (;;) {
    absl::StatusOr<v1::DownMessage> m = raw.Next();
    ASSERT_OK(m.status());
    if (m->has_done()) break;
    ASSERT_TRUE(m->has_delta()) << m->DebugString().substr(0, 200);
    const v1::ParameterDelta& d = m->delta();
    ASSERT_EQ(d.dtype(), v1::DTYPE_FP32);
    const size_t n = d.payload().size() / sizeof(float);
    std::vector<float> v(n);
    std::memcpy(v.data(), d.payload().data(), n * sizeof(float));
    if (values == 0 && n > 0) first = v[0];
    for (float x : v) ASSERT_EQ(x, first);
    values += static_cast<int64_t>(n);
  }
  EXPECT_EQ(values, kRows * 512);
  EXPECT_NE(first, 0.5f);
  raw.Close();
  ASSERT_OK((*c)->DeleteJob("fast_rank"));
  ASSERT_OK(slow.Stop());
}

TEST_F(BadInputTest, UcxAttachToDaemonWithoutUcxIsFailedPrecondition) {
  DaemonProcess plain;
  ASSERT_OK(plain.Start({"--ucx=false"}));
  ClientOptions co;
  co.token = kTestToken;
  co.target = plain.target();
  co.transport = Transport::kUcx;
  JobOptions o;
  o.job_id = "no_ucx";
  o.world = 1;
  Harness h(plain.target(), o);
  ASSERT_OK(h.Connect());
  ASSERT_OK(h.CreateJob());
  ASSERT_OK(h.Upload());
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  ExpectStatus((*c)->JoinJob("no_ucx", 0).status(), StatusCode::kFailedPrecondition,
               "--ucx=false");
  // The same rank attaches over gRPC.
  ClientOptions grpc_co;
  grpc_co.token = kTestToken;
  grpc_co.target = plain.target();
  auto g = Client::Connect(grpc_co);
  ASSERT_OK(g.status());
  ASSERT_OK((*g)->Attach("no_ucx", 0));
  EXPECT_TRUE(plain.Stop().ok());
}

}  // namespace
}  // namespace zenflow::testing
