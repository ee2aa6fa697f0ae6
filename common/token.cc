// Bearer tokens, as both sides of zenflow.v1 handle them
// (docs/security.md): the format, new random ones, and reading one from a file.
#include "common/token.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace zenflow {

namespace {

bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' ||
         c == '~' || c == '+' || c == '/' || c == '=';
}

}  // namespace

absl::Status CheckToken(absl::string_view token) {
  if (token.size() < kMinTokenChars || token.size() > kMaxTokenChars) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a token has ", kMinTokenChars, " to ", kMaxTokenChars, " characters; this one has ",
        token.size(), " (leave it out and CreateJob returns a new random one)"));
  }
  for (char c : token) {
    if (!IsTokenChar(c)) {
      return absl::InvalidArgumentError(
          "a token is made of letters, digits and - . _ ~ + / = only (RFC 6750 b64token)");
    }
  }
  return absl::OkStatus();
}

std::string NewToken() {
  unsigned char raw[32];
  size_t got = 0;
  while (got < sizeof(raw)) {
    const ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      // The kernel's source cannot fail once seeded; if it does, a token
      // must not be made from less.
      std::fprintf(stderr, "zenflow: getrandom failed: %s\n", std::strerror(errno));
      std::abort();
    }
  }
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string token;
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char b : raw) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      token.push_back(kAlphabet[(acc >> bits) & 63]);
    }
  }
  if (bits > 0) token.push_back(kAlphabet[(acc << (6 - bits)) & 63]);
  return token;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the token file ", path, ": ", std::strerror(errno)));
  }
  std::string line;
  std::getline(in, line);
  const std::string token(absl::StripAsciiWhitespace(line));
  if (absl::Status s = CheckToken(token); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": ", s.message()));
  }
  return token;
}

}  // namespace zenflow
