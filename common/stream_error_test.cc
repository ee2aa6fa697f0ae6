#include "common/stream_error.h"

#include "gtest/gtest.h"

namespace zenflow {
namespace {

TEST(StreamErrorTest, EveryCodeRoundTripsWithItsMessageAndSeq) {
  for (int c = 1; c <= 16; ++c) {
    const absl::Status s(static_cast<absl::StatusCode>(c), "why");
    const v1::DownMessage m = StreamErrorMessage(s, 42);
    ASSERT_EQ(m.kind_case(), v1::DownMessage::kError);
    EXPECT_EQ(m.error().seq(), 42u);
    EXPECT_FALSE(m.error().fatal());
    EXPECT_EQ(StreamErrorStatus(m.error()), s);
  }
  EXPECT_TRUE(StreamErrorMessage(absl::NotFoundError("gone"), 0, true).error().fatal());
}

TEST(StreamErrorTest, ACodeOutsideTheRangeIsUnknownNotOk) {
  v1::StreamError e;
  e.set_code(0);
  e.set_message("bad");
  EXPECT_EQ(StreamErrorStatus(e).code(), absl::StatusCode::kUnknown);
  e.set_code(999);
  EXPECT_EQ(StreamErrorStatus(e).code(), absl::StatusCode::kUnknown);
  e.set_code(-3);
  EXPECT_EQ(StreamErrorStatus(e).code(), absl::StatusCode::kUnknown);
}

}  // namespace
}  // namespace zenflow
