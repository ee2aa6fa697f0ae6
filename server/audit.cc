// The audit log; see audit.h.
#include "server/audit.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/quote.h"

namespace zenflow {

absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path) {
  if (path.empty()) return std::unique_ptr<AuditLog>(new AuditLog(STDERR_FILENO, false));
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot open the audit log ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<AuditLog>(new AuditLog(fd, true));
}

AuditLog::~AuditLog() {
  if (owned_) close(fd_);
}

void AuditLog::Record(absl::string_view event, absl::string_view call, absl::string_view job_id,
                      absl::string_view peer, absl::string_view identity, const Caller& who,
                      const absl::Status& result, absl::string_view detail) {
  std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone()),
      " zenflowd audit: event=", event);
  if (!call.empty()) absl::StrAppend(&line, " call=", call);
  // Quote escapes and bounds what a client chose (a job id, its address).
  absl::StrAppend(&line, " job=", Quote(job_id), " peer=", Quote(peer));
  if (!identity.empty()) absl::StrAppend(&line, " identity=", Quote(identity));
  absl::StrAppend(&line, " credential=", who.Describe(), " result=",
                  absl::StatusCodeToString(result.code()));
  if (!result.ok()) absl::StrAppend(&line, " why=", Quote(result.message()));
  if (!detail.empty()) absl::StrAppend(&line, " detail=", Quote(detail));
  line.push_back('\n');
  // One write: lines from concurrent calls never interleave (O_APPEND).
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the log is not the caller's problem
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace zenflow
