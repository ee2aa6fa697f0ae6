// Who may touch a job (docs/security.md). A job belongs to a credential:
// the bearer token its CreateJob call carried, or a new random token the
// daemon made and returned. Every later call and stream for the job carries
// the token as gRPC metadata "authorization: Bearer <token>". The daemon
// keeps only each token's SHA-256 digest (in memory and in checkpoints).
// One admin token (zenflowd --admin_token_file) reaches every job.
//
//   Authenticator auth(admin_token);
//   Caller who = auth.Identify(ctx->client_metadata());
//   ZF_RETURN_IF_ERROR(who.error);            // UNAUTHENTICATED: malformed
//   if (!who.Grants(job->credential())) ...   // PERMISSION_DENIED
#ifndef ZENFLOW_SERVER_AUTH_H_
#define ZENFLOW_SERVER_AUTH_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/token.h"

namespace zenflow {

// SHA-256 of the token: 32 raw bytes.
std::string TokenDigest(absl::string_view token);

// A short, printable name of a credential for logs: the first 8 hex digits
// of its digest ("-" for none).
std::string CredentialId(absl::string_view digest);

// The caller of one RPC, as its metadata says.
struct Caller {
  absl::Status error;   // UNAUTHENTICATED: the authorization metadata is malformed
  bool has_token = false;
  bool admin = false;   // the admin token, or a call over the admin socket (no token)
  std::string digest;   // TokenDigest of the token (empty without one)

  // The caller may touch a job of `credential` (a digest; empty: a job
  // restored from a checkpoint made before credentials, admin only).
  bool Grants(absl::string_view credential) const;
  // For logs: "admin", the credential's id, or "none".
  std::string Describe() const;
};

// Thread-safe (immutable).
class Authenticator {
 public:
  // `admin_token` empty: no admin. Otherwise it must pass CheckToken.
  explicit Authenticator(std::string admin_token = "");

  bool has_admin() const { return !admin_digest_.empty(); }

  // From a call's metadata (grpc::ServerContextBase::client_metadata()).
  template <typename Metadata>
  Caller Identify(const Metadata& md) const {
    std::string value;
    int n = 0;
    for (auto it = md.lower_bound("authorization"); it != md.end() && it->first == "authorization";
         ++it) {
      ++n;
      value.assign(it->second.data(), it->second.size());
    }
    return IdentifyValue(n, value);
  }

  // `count` authorization entries, the last of them `value`.
  Caller IdentifyValue(int count, absl::string_view value) const;

 private:
  const std::string admin_digest_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_AUTH_H_
