#include "server/checkpoint_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zenflow {
namespace {

using ::testing::HasSubstr;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// --- CRC-32C ---

TEST(Crc32cTest, KnownVectors) {
  // RFC 3720 (iSCSI), appendix B.4, and the usual check value.
  const std::string zeros(32, '\0'), ones(32, '\xff');
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  for (auto* extend : {&crc32c_internal::ExtendScalar, &crc32c_internal::ExtendHardware}) {
    if (extend == &crc32c_internal::ExtendHardware && !crc32c_internal::HasHardware()) continue;
    EXPECT_EQ((*extend)(0, "123456789", 9), 0xE3069283u);
    EXPECT_EQ((*extend)(0, "", 0), 0u);
    EXPECT_EQ((*extend)(0, zeros.data(), 32), 0x8A9136AAu);
    EXPECT_EQ((*extend)(0, ones.data(), 32), 0x62A8AB43u);
    EXPECT_EQ((*extend)(0, ascending.data(), 32), 0x46DD794Eu);
  }
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
}

TEST(Crc32cTest, HardwareEqualsScalarOnRandomData) {
  if (!crc32c_internal::HasHardware()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  const std::string data = RandomBytes(200000, 1);
  std::mt19937 rng(2);
  // Every length around the three-stream block (3 x 1024) and its multiples,
  // from unaligned starts, and random ones.
  std::vector<size_t> lengths;
  for (size_t n = 0; n < 64; ++n) lengths.push_back(n);
  for (size_t base : {3072, 6144, 9216}) {
    for (size_t n = base - 9; n < base + 9; ++n) lengths.push_back(n);
  }
  for (int i = 0; i < 200; ++i) lengths.push_back(rng() % 190000);
  for (size_t n : lengths) {
    const size_t start = rng() % 16;
    const uint32_t seed = rng();
    EXPECT_EQ(crc32c_internal::ExtendHardware(seed, data.data() + start, n),
              crc32c_internal::ExtendScalar(seed, data.data() + start, n))
        << "length " << n << " from " << start;
  }
}

TEST(Crc32cTest, ExtendEqualsWhole) {
  const std::string data = RandomBytes(10000, 3);
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t cut : {0, 1, 7, 3072, 5000, 9999, 10000}) {
    EXPECT_EQ(Crc32cExtend(Crc32c(data.data(), cut), data.data() + cut, data.size() - cut), whole)
        << "cut at " << cut;
  }
}

// --- checkpoint files ---

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(mkdir(dir_.c_str(), 0755), 0) << dir_;
  }

  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

  // Writes `contents` to <dir>/<name> by hand.
  void WriteRaw(const std::string& name, const std::string& contents) const {
    const int fd = open(Path(name).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, contents.data(), contents.size()),
              static_cast<ssize_t>(contents.size()));
    close(fd);
  }

  std::string ReadRaw(const std::string& path) const {
    std::string s;
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) return s;
    char buf[65536];
    ssize_t r;
    while ((r = read(fd, buf, sizeof(buf))) > 0) s.append(buf, r);
    close(fd);
    return s;
  }

  std::string dir_;
};

// Sections with the edge cases: empty with and without a pointer, one byte,
// exactly a page, several MiB with an odd tail.
struct Fixture {
  std::vector<std::string> data;
  std::vector<CheckpointSectionView> views;
};

Fixture MakeSections() {
  Fixture f;
  const std::vector<std::pair<std::string, size_t>> shape = {
      {"meta", 100}, {"empty", 0}, {"big.master", 5 * 1024 * 1024 + 123},
      {"zero_len", 0}, {"page", 4096}, {"tail", 1}, {"m_v.0", 3 * 1024 * 1024}};
  f.data.reserve(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    f.data.push_back(RandomBytes(shape[i].second, static_cast<uint32_t>(10 + i)));
    // "empty" has no pointer at all; "zero_len" points at an empty string.
    const void* p = shape[i].first == "empty" ? nullptr : f.data.back().data();
    f.views.push_back({shape[i].first, p, shape[i].second});
  }
  return f;
}

void ExpectSame(const std::vector<CheckpointSection>& got, const Fixture& want) {
  ASSERT_EQ(got.size(), want.views.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want.views[i].name);
    EXPECT_TRUE(got[i].data == want.data[i]) << "section " << got[i].name << " differs";
  }
}

TEST_F(CheckpointFileTest, RoundTripsEverySectionWithEachIoPath) {
  const Fixture f = MakeSections();
  struct Case {
    const char* what;
    CheckpointIoOptions options;
  };
  std::vector<Case> cases(5);
  cases[0].what = "defaults";
  cases[1].what = "pwrite/pread";
  cases[1].options.use_io_uring = false;
  cases[2].what = "page cache";
  cases[2].options.try_direct_io = false;
  cases[3].what = "small buffers, many in flight";
  cases[3].options.buffer_bytes = 8192;
  cases[3].options.buffers = 7;
  cases[4].what = "one buffer, no io_uring, no O_DIRECT";
  cases[4].options = {false, false, 4096, 1};
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(cases[c].what);
    const std::string name = CheckpointFileName("rt.", c);
    auto stats = WriteCheckpoint(dir_, name, f.views, cases[c].options);
    ASSERT_TRUE(stats.ok()) << stats.status();
    struct stat st;
    ASSERT_EQ(stat(Path(name).c_str(), &st), 0);
    EXPECT_EQ(stats->bytes, st.st_size);
    EXPECT_EQ(st.st_size % 4096, 0);
    EXPECT_GT(stats->seconds, 0);
    if (!cases[c].options.use_io_uring) {
      EXPECT_FALSE(stats->io_uring);
    }
    if (!cases[c].options.try_direct_io) {
      EXPECT_FALSE(stats->direct_io);
    }
    std::printf("%s: io_uring=%d fixed_buffers=%d direct_io=%d\n", cases[c].what,
                stats->io_uring, stats->fixed_buffers, stats->direct_io);
    // Each file read back through every path.
    for (const Case& r : cases) {
      auto got = ReadCheckpoint(Path(name), r.options);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectSame(*got, f);
    }
  }
}

TEST_F(CheckpointFileTest, NoSectionsAndTheMostSections) {
  ASSERT_TRUE(WriteCheckpoint(dir_, "none.zfck", {}).ok());
  auto none = ReadCheckpoint(Path("none.zfck"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());

  std::vector<std::string> names(kCheckpointMaxSections);
  std::vector<CheckpointSectionView> views;
  for (size_t i = 0; i < names.size(); ++i) {
    names[i] = absl::StrCat("s", i);
    views.push_back({names[i], names[i].data(), names[i].size()});
  }
  ASSERT_TRUE(WriteCheckpoint(dir_, "most.zfck", views).ok());
  auto most = ReadCheckpoint(Path("most.zfck"));
  ASSERT_TRUE(most.ok()) << most.status();
  ASSERT_EQ(most->size(), names.size());
  EXPECT_EQ((*most)[4095].name, "s4095");
  EXPECT_EQ((*most)[4095].data, "s4095");

  views.push_back({"one.too.many", nullptr, 0});
  auto s = WriteCheckpoint(dir_, "over.zfck", views);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("at most 4096"));
}

TEST_F(CheckpointFileTest, ReplacesAFileOfTheSameName) {
  const std::string a = "first", b = "second version";
  ASSERT_TRUE(WriteCheckpoint(dir_, "x.zfck", {{"v", a.data(), a.size()}}).ok());
  ASSERT_TRUE(WriteCheckpoint(dir_, "x.zfck", {{"v", b.data(), b.size()}}).ok());
  auto got = ReadCheckpoint(Path("x.zfck"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].data, b);
}

// Three sections: header 16 + 3 * 56 + 4 = 188 bytes, padded to 4096;
// "a" (5000 bytes) at 4096, "b" (0) at 12288, "c" (9000) at 12288; the file
// ends at 12288 + 12288 = 24576.
class CorruptionTest : public CheckpointFileTest {
 protected:
  void SetUp() override {
    CheckpointFileTest::SetUp();
    a_ = RandomBytes(5000, 1);
    c_ = RandomBytes(9000, 2);
    auto s = WriteCheckpoint(dir_, "good.zfck",
                             {{"a", a_.data(), a_.size()}, {"b", nullptr, 0},
                              {"c", c_.data(), c_.size()}});
    ASSERT_TRUE(s.ok()) << s.status();
    good_ = ReadRaw(Path("good.zfck"));
    ASSERT_EQ(good_.size(), 24576u);
  }

  // Writes `contents` as a file and expects DATA_LOSS naming it and `reason`.
  void ExpectLoss(const std::string& contents, const std::string& reason) {
    const std::string name = absl::StrCat("bad", n_++, ".zfck");
    WriteRaw(name, contents);
    auto got = ReadCheckpoint(Path(name));
    ASSERT_FALSE(got.ok()) << "accepted: " << reason;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    const std::string message(got.status().message());
    EXPECT_THAT(message, HasSubstr(Path(name)));
    EXPECT_THAT(message, HasSubstr(reason));
  }

  std::string Flipped(size_t at) const {
    std::string s = good_;
    s[at] = static_cast<char>(s[at] ^ 0x40);
    return s;
  }

  std::string a_, c_, good_;
  int n_ = 0;
};

TEST_F(CorruptionTest, TheUntouchedFileReads) {
  auto got = ReadCheckpoint(Path("good.zfck"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].data, a_);
  EXPECT_EQ((*got)[1].data, "");
  EXPECT_EQ((*got)[2].data, c_);
}

TEST_F(CorruptionTest, AFlippedByteInASectionIsItsChecksumMismatch) {
  for (size_t at : {4096, 4096 + 2500, 4096 + 4999}) {
    ExpectLoss(Flipped(at), "section \"a\" checksum mismatch");
  }
  for (size_t at : {12288, 12288 + 8999}) {
    ExpectLoss(Flipped(at), "section \"c\" checksum mismatch");
  }
}

TEST_F(CorruptionTest, AFlippedByteInTheHeader) {
  ExpectLoss(Flipped(0), "bad magic");
  ExpectLoss(Flipped(7), "bad magic");
  ExpectLoss(Flipped(8), "unknown format version");
  // The section count, a name, an offset, a size, a section checksum, the
  // pad and the header checksum itself.
  for (size_t at : {12, 16, 16 + 56 + 32, 16 + 112 + 40, 16 + 48, 16 + 52, 184, 187}) {
    ExpectLoss(Flipped(at), "header checksum mismatch");
  }
  // A count over the limit is refused before its checksum can be found.
  std::string huge = good_;
  huge[13] = '\x7f';
  ExpectLoss(huge, "over the limit of 4096");
}

TEST_F(CorruptionTest, AnotherVersionIsUnknown) {
  std::string v2 = good_;
  v2[8] = 2;
  ExpectLoss(v2, "unknown format version 2 (this build reads 1)");
}

TEST_F(CorruptionTest, TruncationAnywhereIsReported) {
  ExpectLoss("", "truncated: 0 bytes");
  ExpectLoss(good_.substr(0, 5), "truncated: 5 bytes");
  ExpectLoss(good_.substr(0, 12), "truncated: 12 bytes");  // mid fixed part
  ExpectLoss(good_.substr(0, 100), "truncated: 100 bytes, inside the header");
  ExpectLoss(good_.substr(0, 187), "truncated: 187 bytes, inside the header");
  ExpectLoss(good_.substr(0, 188), "truncated: 188 bytes, the header says 24576");
  ExpectLoss(good_.substr(0, 4096), "truncated: 4096 bytes");
  ExpectLoss(good_.substr(0, 4096 + 2500), "truncated");   // mid "a"
  ExpectLoss(good_.substr(0, 12288 + 4096), "truncated");  // mid "c"
  ExpectLoss(good_.substr(0, 24575), "truncated: 24575 bytes");
}

// A header whose checksum matches but whose sizes do not (a writer's bug,
// not a flipped bit): misaligned, overlapping.
TEST_F(CorruptionTest, SectionsOutOfPlaceAreSizesInconsistent) {
  auto with_offset = [&](size_t entry, uint64_t offset) {
    std::string s = good_;
    std::memcpy(&s[16 + 56 * entry + 32], &offset, 8);
    const uint32_t crc = Crc32c(s.data(), 184);
    std::memcpy(&s[184], &crc, 4);
    return s;
  };
  ExpectLoss(with_offset(0, 4097), "sizes inconsistent: section \"a\" at offset 4097");
  ExpectLoss(with_offset(0, 0), "sizes inconsistent: section \"a\" at offset 0");
  ExpectLoss(with_offset(2, 8192), "sizes inconsistent: section \"c\" at offset 8192");
  ExpectLoss(with_offset(2, uint64_t{1} << 63), "sizes inconsistent");
}

TEST_F(CorruptionTest, TrailingBytesAreSizesInconsistent) {
  ExpectLoss(good_ + std::string(4096, '\0'), "sizes inconsistent: 28672 bytes");
}

TEST_F(CorruptionTest, NotACheckpointAtAll) {
  ExpectLoss(std::string(8192, 'x'), "bad magic");
}

TEST_F(CheckpointFileTest, ACrashedWriteLeavesThePreviousCheckpoint) {
  const std::string v1 = RandomBytes(10000, 5);
  ASSERT_TRUE(WriteCheckpoint(dir_, CheckpointFileName("job.", 1), {{"s", v1.data(), v1.size()}})
                  .ok());
  // What a writer that died mid-way leaves: its temporary file, named as
  // WriteCheckpoint names them, holding part of the data and no header.
  const std::string tmp = absl::StrCat(".", CheckpointFileName("job.", 2), ".tmp.4242.0");
  WriteRaw(tmp, std::string(4096, '\0') + RandomBytes(3000, 6));

  const std::vector<std::string> listed = ListCheckpoints(dir_, "job.");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0], Path(CheckpointFileName("job.", 1)));
  auto got = ReadCheckpoint(listed[0]);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].data, v1);
  // Pruning leaves the other writer's file alone.
  ASSERT_TRUE(PruneCheckpoints(dir_, "job.", 1).ok());
  EXPECT_EQ(access(Path(tmp).c_str(), F_OK), 0);
}

TEST_F(CheckpointFileTest, AFailedWriteLeavesNoTemporaryFile) {
  const std::string v = "x";
  ASSERT_TRUE(WriteCheckpoint(dir_, "sub", {}).ok());  // a file, not a directory
  auto s = WriteCheckpoint(Path("sub"), "c.zfck", {{"s", v.data(), 1}});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();  // ENOTDIR
  EXPECT_THAT(s.status().message(), HasSubstr(Path("sub")));
  auto missing = WriteCheckpoint(Path("nope"), "c.zfck", {{"s", v.data(), 1}});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr(Path("nope")));
  auto dir_read = ReadCheckpoint(dir_);  // pread says EISDIR
  EXPECT_FALSE(dir_read.ok());
  EXPECT_THAT(std::string(dir_read.status().message()), HasSubstr(dir_));
  auto read = ReadCheckpoint(Path("absent.zfck"));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound) << read.status();
  EXPECT_THAT(read.status().message(), HasSubstr(Path("absent.zfck")));
}

TEST_F(CheckpointFileTest, FileNamesSortBySequence) {
  EXPECT_EQ(CheckpointFileName("job.", 42), "job.00000000000000000042.zfck");
  EXPECT_EQ(CheckpointFileName("", UINT64_MAX), "18446744073709551615.zfck");
}

TEST_F(CheckpointFileTest, ListIsNewestFirstAndPruneKeepsTheNewest) {
  for (uint64_t seq : {3ull, 10ull, 2ull, 7ull, 1000000000000ull}) {
    ASSERT_TRUE(WriteCheckpoint(dir_, CheckpointFileName("job.", seq), {}).ok());
  }
  // Not checkpoints of "job.": another prefix, no sequence, a sequence over
  // 2^64 - 1, a temporary file, another suffix.
  ASSERT_TRUE(WriteCheckpoint(dir_, CheckpointFileName("jobx.", 5), {}).ok());
  WriteRaw("job.abc.zfck", "");
  WriteRaw("job.99999999999999999999.zfck", "");
  WriteRaw(".job.00000000000000000011.zfck.tmp.1.0", "");
  WriteRaw("job.00000000000000000012.zfck.old", "");

  EXPECT_THAT(ListCheckpoints(dir_, "job."),
              ::testing::ElementsAre(Path(CheckpointFileName("job.", 1000000000000ull)),
                                     Path(CheckpointFileName("job.", 10)),
                                     Path(CheckpointFileName("job.", 7)),
                                     Path(CheckpointFileName("job.", 3)),
                                     Path(CheckpointFileName("job.", 2))));
  EXPECT_THAT(ListCheckpoints(dir_ + "/", "job.")[1],
              Path(CheckpointFileName("job.", 10)));  // no double slash
  EXPECT_TRUE(ListCheckpoints(Path("missing"), "job.").empty());

  EXPECT_EQ(PruneCheckpoints(dir_, "job.", 0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PruneCheckpoints(dir_, "job.", 10).ok());
  EXPECT_EQ(ListCheckpoints(dir_, "job.").size(), 5u);
  ASSERT_TRUE(PruneCheckpoints(dir_, "job.", 2).ok());
  EXPECT_THAT(ListCheckpoints(dir_, "job."),
              ::testing::ElementsAre(Path(CheckpointFileName("job.", 1000000000000ull)),
                                     Path(CheckpointFileName("job.", 10))));
  for (const char* other : {"job.abc.zfck", "job.99999999999999999999.zfck",
                            ".job.00000000000000000011.zfck.tmp.1.0",
                            "job.00000000000000000012.zfck.old",
                            "jobx.00000000000000000005.zfck"}) {
    EXPECT_EQ(access(Path(other).c_str(), F_OK), 0) << other;
  }
}

TEST_F(CheckpointFileTest, NamesAreValidated) {
  const std::string v = "v";
  for (const std::string& bad : {std::string(""), std::string(".hidden"), std::string("a/b"),
                                 std::string(256, 'a'), std::string("a\0b", 3)}) {
    auto s = WriteCheckpoint(dir_, bad, {{"s", v.data(), 1}});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << absl::CEscape(bad);
    EXPECT_THAT(s.status().message(), HasSubstr("checkpoint file name"));
  }
  for (const std::string& bad : {std::string(""), std::string("Upper"), std::string("sp ace"),
                                 std::string(33, 'a'), std::string("a-b"), std::string("a/b"),
                                 std::string("a\0", 2)}) {
    auto s = WriteCheckpoint(dir_, "c.zfck", {{bad, v.data(), 1}});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << absl::CEscape(bad);
    EXPECT_THAT(s.status().message(), HasSubstr("[a-z0-9_.]"));
  }
  auto twice = WriteCheckpoint(dir_, "c.zfck", {{"s", v.data(), 1}, {"s", v.data(), 1}});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.status().message(), HasSubstr("used twice"));
  auto no_data = WriteCheckpoint(dir_, "c.zfck", {{"s", nullptr, 1}});
  EXPECT_EQ(no_data.status().code(), absl::StatusCode::kInvalidArgument);
  CheckpointIoOptions odd;
  odd.buffer_bytes = 1000;
  EXPECT_EQ(WriteCheckpoint(dir_, "c.zfck", {}, odd).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ListCheckpoints(dir_, "").empty());
  EXPECT_EQ(access(Path("c.zfck").c_str(), F_OK), -1);

  const std::string longest(32, 'z');
  ASSERT_TRUE(WriteCheckpoint(dir_, "ok.zfck", {{longest, v.data(), 1}, {"a.b_0", v.data(), 1}})
                  .ok());
  auto got = ReadCheckpoint(Path("ok.zfck"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].name, longest);
}

}  // namespace
}  // namespace zenflow
