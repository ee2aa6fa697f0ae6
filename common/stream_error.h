// The in-band rejection of a stream message (zenflow.v1.StreamError): built
// by the daemon and read by the client in this one place, so the status code
// travels as a code, never as text to match.
//
//   box->Push(StreamErrorMessage(status, up.seq()));       // daemon
//   absl::Status s = StreamErrorStatus(down.error());      // client
#ifndef ZENFLOW_COMMON_STREAM_ERROR_H_
#define ZENFLOW_COMMON_STREAM_ERROR_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// A DownMessage carrying `s` (not OK) as the answer to up message `seq`
// (0 when it could not be parsed). `fatal`: the stream ends after it.
inline v1::DownMessage StreamErrorMessage(const absl::Status& s, uint64_t seq,
                                          bool fatal = false) {
  v1::DownMessage m;
  v1::StreamError* e = m.mutable_error();
  e->set_seq(seq);
  e->set_code(static_cast<int32_t>(s.code()));
  e->set_message(std::string(s.message()));
  e->set_fatal(fatal);
  return m;
}

// The status a StreamError carries. A code outside absl's range is UNKNOWN.
inline absl::Status StreamErrorStatus(const v1::StreamError& e) {
  const int32_t c = e.code();
  const absl::StatusCode code = c > 0 && c <= static_cast<int32_t>(absl::StatusCode::kUnauthenticated)
                                    ? static_cast<absl::StatusCode>(c)
                                    : absl::StatusCode::kUnknown;
  return absl::Status(code, e.message());
}

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_STREAM_ERROR_H_
