// Credentials; see auth.h.
#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace zenflow {

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

std::string TokenDigest(absl::string_view token) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(token.data(), token.size(), out, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(out), len);
}

bool Caller::Grants(absl::string_view credential) const {
  if (!error.ok()) return false;
  if (admin) return true;  // the admin token, or a peer of the admin socket
  return has_token && !credential.empty() && credential.size() == digest.size() &&
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

}  // namespace zenflow
