// The audit log (docs/security.md): one line for each job created,
// deleted, joined or attached to, and for each call refused for its
// credential, saying who (the peer's address, and its credential's id or
// TLS identity) did what to which job, and the outcome.
//
//   2026-11-30T23:59:59.123456Z zenflowd audit: event=create job='ft' peer=ipv4:127.0.0.1:40112
//       credential=3f9a0c12 result=OK
//
// Lines go to a file (zenflowd --audit_log, appended, one write(2) each) or
// to standard error (the journal under systemd).
#ifndef ZENFLOW_SERVER_AUDIT_H_
#define ZENFLOW_SERVER_AUDIT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/auth.h"

namespace zenflow {

// Thread-safe.
class AuditLog {
 public:
  // `path` empty: standard error.
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(const std::string& path);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // `event`: create, delete, join, attach, denied, keep (every rank of a
  // job finished and one asked to keep it) or expire (zenflowd
  // --job_idle_ttl_s deleted an idle job); `call` the RPC for denied;
  // `identity` the TLS peer identity (may be empty); `detail`, when not
  // empty, says why (e.g. "every rank finished").
  void Record(absl::string_view event, absl::string_view call, absl::string_view job_id,
              absl::string_view peer, absl::string_view identity, const Caller& who,
              const absl::Status& result, absl::string_view detail = "");

 private:
  explicit AuditLog(int fd, bool owned) : fd_(fd), owned_(owned) {}
  const int fd_;
  const bool owned_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_AUDIT_H_
