#include "common/up_wire.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "google/protobuf/util/message_differencer.h"

namespace zenflow {
namespace {

using google::protobuf::util::MessageDifferencer;

v1::UpMessage Shard(size_t payload_size, uint32_t seed) {
  v1::UpMessage m;
  m.set_seq(7 + seed);
  m.set_replay(seed % 2 == 1);
  v1::GradientShard* s = m.mutable_shard();
  s->set_step(100 + seed);
  s->set_tensor("layer.0.w");
  s->set_selection_version(3);
  for (int c = 0; c < 5; ++c) s->add_columns(c * 3 + static_cast<int>(seed % 3));
  s->set_dtype(seed % 3 == 0 ? v1::DTYPE_INT8 : v1::DTYPE_BF16);
  if (seed % 3 == 0) {
    for (int c = 0; c < 5; ++c) s->add_scales(0.5f * static_cast<float>(c));
  }
  std::string p(payload_size, '\0');
  std::mt19937 rng(seed);
  for (char& ch : p) ch = static_cast<char>(rng());
  s->set_payload(p);
  return m;
}

// `bytes` cut into pieces at random places (some empty).
ShardPayload Cut(const std::string& bytes, std::mt19937* rng) {
  ShardPayload out;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t n = std::min(bytes.size() - at, static_cast<size_t>((*rng)() % 40));
    out.Append(absl::string_view(bytes.data() + at, n));
    at += n;
  }
  return out;
}

std::string Joined(const ShardPayload& p) {
  std::string out(p.size(), '\0');
  p.CopyOut(0, p.size(), out.data());
  return out;
}

TEST(UpWire, HeadThenPayloadIsTheMessageProtobufReads) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{70000}}) {
    v1::UpMessage want = Shard(n, static_cast<uint32_t>(n));
    v1::UpMessage msg = want;
    const std::string payload = msg.shard().payload();
    msg.mutable_shard()->clear_payload();
    const v1::UpMessage before = msg;
    const std::string head = UpMessageHead(&msg, payload.size());
    EXPECT_TRUE(MessageDifferencer::Equals(msg, before)) << "the head left msg as it was";
    v1::UpMessage got;
    ASSERT_TRUE(got.ParseFromString(head + payload)) << n;
    EXPECT_TRUE(MessageDifferencer::Equals(got, want)) << n;
  }
}

TEST(UpWire, SplitParseAgreesWithProtobufWhereverTheBytesAreCut) {
  std::mt19937 rng(1);
  for (uint32_t seed = 0; seed < 60; ++seed) {
    const v1::UpMessage want = Shard(seed * 37, seed);
    // Both protobuf's own serialization and the client's head + payload.
    v1::UpMessage headless = want;
    headless.mutable_shard()->clear_payload();
    for (const std::string& bytes :
         {want.SerializeAsString(),
          UpMessageHead(&headless, want.shard().payload().size()) + want.shard().payload()}) {
      v1::UpMessage got;
      ShardPayload payload;
      ASSERT_TRUE(ParseUpSplit(Cut(bytes, &rng), &got, &payload)) << seed;
      EXPECT_EQ(got.shard().payload(), "");
      EXPECT_EQ(Joined(payload), want.shard().payload());
      got.mutable_shard()->set_payload(Joined(payload));
      EXPECT_TRUE(MessageDifferencer::Equals(got, want)) << seed;
    }
  }
}

TEST(UpWire, GivesUpOnFormsProtobufReadsItsOwnWay) {
  std::mt19937 rng(2);
  v1::UpMessage got;
  ShardPayload payload;
  v1::UpMessage close;
  close.mutable_close()->set_round(3);
  EXPECT_FALSE(ParseUpSplit(ShardPayload(close.SerializeAsString()), &got, &payload)) << "not a shard";
  v1::UpMessage attach;
  attach.mutable_attach()->set_job_id("j");
  EXPECT_FALSE(ParseUpSplit(ShardPayload(attach.SerializeAsString()), &got, &payload));
  EXPECT_FALSE(ParseUpSplit(ShardPayload(std::string()), &got, &payload)) << "empty message";
  const std::string one = Shard(16, 1).SerializeAsString();
  // Two shard fields: protobuf merges them (the second payload wins).
  const std::string two = one + Shard(8, 2).SerializeAsString();
  EXPECT_FALSE(ParseUpSplit(Cut(two, &rng), &got, &payload));
  // A shard, then a close: the oneof's last kind wins.
  EXPECT_FALSE(ParseUpSplit(ShardPayload(one + close.SerializeAsString()), &got, &payload));
  // Truncated anywhere: taken only where a field ends after the shard's
  // (`replay` comes last), as protobuf reads it.
  const size_t shard_end = one.size() - 2;  // replay = true: key and value
  for (size_t n = 0; n < one.size(); ++n) {
    EXPECT_EQ(ParseUpSplit(ShardPayload(one.substr(0, n)), &got, &payload), n == shard_end) << n;
    v1::UpMessage want;
    EXPECT_EQ(want.ParseFromString(one.substr(0, n)) && want.has_shard() &&
                  want.shard().payload().size() == 16,
              n == shard_end)
        << n;
  }
  // Not UTF-8 in the tensor name: protobuf refuses it, so this does too.
  v1::UpMessage bad = Shard(4, 4);
  std::string bytes = bad.SerializeAsString();
  const size_t at = bytes.find("layer");
  ASSERT_NE(at, std::string::npos);
  bytes[at] = static_cast<char>(0xff);
  EXPECT_FALSE(ParseUpSplit(ShardPayload(bytes), &got, &payload));
  EXPECT_FALSE(got.ParseFromString(bytes));
}

// Random damage to valid messages: whenever the split parse takes the bytes,
// protobuf takes them too and reads the same message.
TEST(UpWire, WhatTheSplitParseTakesProtobufReadsAlike) {
  std::mt19937 rng(3);
  int taken = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = Shard(rng() % 64, static_cast<uint32_t>(i)).SerializeAsString();
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 4) {
        case 0:
          bytes[rng() % bytes.size()] = static_cast<char>(rng());
          break;
        case 1:
          bytes.resize(rng() % (bytes.size() + 1));
          break;
        case 2:
          bytes.insert(rng() % (bytes.size() + 1), 1, static_cast<char>(rng()));
          break;
        default:
          bytes += Shard(rng() % 8, static_cast<uint32_t>(rng())).SerializeAsString();
          break;
      }
      if (bytes.empty()) bytes = "x";
    }
    v1::UpMessage got;
    ShardPayload payload;
    if (!ParseUpSplit(Cut(bytes, &rng), &got, &payload)) continue;
    ++taken;
    v1::UpMessage want;
    ASSERT_TRUE(want.ParseFromString(bytes)) << i;
    got.mutable_shard()->set_payload(Joined(payload));
    ASSERT_TRUE(MessageDifferencer::Equals(got, want)) << i;
  }
  EXPECT_GT(taken, 100);  // the damage does not always break the message
}

TEST(UpWire, StretchesReadEveryValueInPlaceOrGathered) {
  std::mt19937 rng(4);
  for (int i = 0; i < 300; ++i) {
    const size_t esize = size_t{1} << (rng() % 3);  // int8, 16-bit, fp32
    const size_t rows = 1 + rng() % 40, cols = 1 + rng() % 9;
    std::string bytes(rows * cols * esize, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const ShardPayload payload = Cut(bytes, &rng);
    const size_t first = rng() % cols, end = first + 1 + rng() % (cols - first);
    size_t at = first * rows * esize, stretches = 0;
    size_t want_col = first, want_row = 0;
    ASSERT_TRUE(ForEachStretch(payload, rows, esize, first, end,
                               [&](size_t col, size_t row, const char* v, size_t n) {
                                 EXPECT_EQ(col, want_col);
                                 EXPECT_EQ(row, want_row);
                                 EXPECT_GE(n, 1u);
                                 EXPECT_LE(row + n, rows);
                                 EXPECT_EQ(std::string(v, n * esize),
                                           bytes.substr(at, n * esize));
                                 at += n * esize;
                                 want_row += n;
                                 if (want_row == rows) {
                                   ++want_col;
                                   want_row = 0;
                                 }
                                 ++stretches;
                                 return true;
                               }));
    EXPECT_EQ(at, end * rows * esize);
    EXPECT_EQ(want_col, end);
    // In place: at most a stretch per piece and column, and one per value cut in two.
    EXPECT_LE(stretches, (end - first) + 2 * payload.pieces().size());
    // fn's false stops the walk.
    size_t calls = 0;
    EXPECT_EQ(ForEachStretch(payload, rows, esize, first, end,
                             [&](size_t, size_t, const char*, size_t) { return ++calls < 2; }),
              stretches < 2);
    EXPECT_EQ(calls, std::min<size_t>(stretches, 2));
  }
}

TEST(UpWire, OneMessageParsedAgainAndAgainIsAsProtobufParsesIt) {
  // ParseUpSplit keeps the shard `got` holds (and its room): every parse
  // must still be what protobuf reads, whatever the message before held.
  std::mt19937 rng(9);
  v1::UpMessage got;
  ShardPayload payload;
  for (uint32_t seed = 0; seed < 60; ++seed) {
    v1::UpMessage m = Shard(rng() % 300, seed);
    if (seed % 4 == 1) m.mutable_shard()->clear_scales();
    if (seed % 5 == 2) m.clear_seq();
    const std::string bytes = m.SerializeAsString();
    ASSERT_TRUE(ParseUpSplit(Cut(bytes, &rng), &got, &payload)) << seed;
    v1::UpMessage want = m;
    want.mutable_shard()->clear_payload();
    EXPECT_TRUE(MessageDifferencer::Equals(got, want)) << seed;
    EXPECT_EQ(Joined(payload), m.shard().payload()) << seed;
    if (seed % 3 == 0) ClearUpKeepingRoom(&got);
    if (seed % 7 == 0) {
      ClearUpKeepingRoom(&got);
      EXPECT_TRUE(got.has_shard());  // empty: its key and a zero length
      EXPECT_EQ(got.ByteSizeLong(), 2u);
    }
  }
}

}  // namespace
}  // namespace zenflow
