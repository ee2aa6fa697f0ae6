// Bearer tokens (docs/security.md), as the daemon and its clients both
// handle them: a job's token travels as gRPC metadata
// "authorization: Bearer <token>".
//
//   const std::string t = NewToken();              // 43 characters, base64url
//   ZF_ASSIGN_OR_RETURN(std::string admin, ReadTokenFile("/etc/zenflowd/admin.token"));
#ifndef ZENFLOW_COMMON_TOKEN_H_
#define ZENFLOW_COMMON_TOKEN_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zenflow {

// Tokens are RFC 6750 b64token characters, kMinTokenChars..kMaxTokenChars.
inline constexpr size_t kMinTokenChars = 16;
inline constexpr size_t kMaxTokenChars = 256;

// INVALID_ARGUMENT, saying why, unless `token` is a usable token.
absl::Status CheckToken(absl::string_view token);

// 32 bytes from the kernel's random source, base64url without padding (43
// characters).
std::string NewToken();

// The first line of the file, blanks around it removed; errors (unreadable,
// not a token) name the file.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_TOKEN_H_
