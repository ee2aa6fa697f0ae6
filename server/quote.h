// Quoting client-supplied text inside status messages. A message quotes at
// most a short, escaped prefix of any input, so a 100 MiB job id cannot
// become a 100 MiB error (which gRPC clients refuse as oversized metadata).
//
//   return absl::NotFoundError(absl::StrCat("no job ", Quote(job_id)));
//   // -> no job 'abc'   or   no job 'aaaaaaaa...' (1048576 bytes)
#ifndef ZENFLOW_SERVER_QUOTE_H_
#define ZENFLOW_SERVER_QUOTE_H_

#include <cstddef>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace zenflow {

// Longest prefix of an input that a status message repeats.
inline constexpr size_t kQuoteMaxBytes = 64;

// `s` in single quotes, C-escaped; inputs longer than kQuoteMaxBytes are cut
// to that prefix and followed by their length.
inline std::string Quote(absl::string_view s) {
  if (s.size() <= kQuoteMaxBytes) return absl::StrCat("'", absl::CHexEscape(s), "'");
  return absl::StrCat("'", absl::CHexEscape(s.substr(0, kQuoteMaxBytes)), "...' (", s.size(),
                      " bytes)");
}

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_QUOTE_H_
