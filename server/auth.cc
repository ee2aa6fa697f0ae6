// Credentials; see auth.h.
#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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

std::string TokenDigest(absl::string_view token) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(token.data(), token.size(), out, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(out), len);
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
      std::fprintf(stderr, "zenflowd: getrandom failed: %s\n", std::strerror(errno));
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

std::string CredentialId(absl::string_view digest) {
  if (digest.empty()) return "-";
  static const char kHex[] = "0123456789abcdef";
  std::string id;
  for (size_t i = 0; i < 4 && i < digest.size(); ++i) {
    const unsigned char b = static_cast<unsigned char>(digest[i]);
    id.push_back(kHex[b >> 4]);
    id.push_back(kHex[b & 15]);
  }
  return id;
}

bool Caller::Grants(absl::string_view credential) const {
  if (!error.ok() || !has_token) return false;
  if (admin) return true;
  return !credential.empty() && credential.size() == digest.size() &&
         CRYPTO_memcmp(credential.data(), digest.data(), digest.size()) == 0;
}

std::string Caller::Describe() const {
  if (admin) return "admin";
  if (!has_token) return "none";
  return CredentialId(digest);
}

Authenticator::Authenticator(std::string admin_token)
    : admin_digest_(admin_token.empty() ? std::string() : TokenDigest(admin_token)) {}

Caller Authenticator::IdentifyValue(int count, absl::string_view value) const {
  Caller c;
  if (count == 0) return c;
  if (count > 1) {
    c.error = absl::UnauthenticatedError(
        "the call carries more than one 'authorization' metadata entry; send one");
    return c;
  }
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() < kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    c.error = absl::UnauthenticatedError(
        "the 'authorization' metadata must be \"Bearer <token>\" (the job's token)");
    return c;
  }
  const absl::string_view token = absl::StripAsciiWhitespace(value.substr(kScheme.size()));
  if (absl::Status s = CheckToken(token); !s.ok()) {
    c.error = absl::UnauthenticatedError(
        absl::StrCat("the bearer token is malformed: ", s.message()));
    return c;
  }
  c.has_token = true;
  c.digest = TokenDigest(token);
  c.admin = !admin_digest_.empty() && c.digest.size() == admin_digest_.size() &&
            CRYPTO_memcmp(c.digest.data(), admin_digest_.data(), c.digest.size()) == 0;
  return c;
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
