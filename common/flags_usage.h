// The command-line programs' --help and --version: the text on stdout and
// exit status 0, as packagers, man-page generators (help2man) and scripts
// expect. (absl's own --help exits 1.) Each main calls ParseFlags instead
// of absl::ParseCommandLine:
//
//   int main(int argc, char** argv) {
//     absl::SetProgramUsageMessage("One rank of a ZenFlow fine-tuning run.");
//     zenflow::ParseFlags(argc, argv, {"zf_train", zenflow::kZenflowVersion,
//                                      {"train_main.cc", "tls_flags.cc"}});
#ifndef ZENFLOW_COMMON_FLAGS_USAGE_H_
#define ZENFLOW_COMMON_FLAGS_USAGE_H_

#include <ostream>
#include <string>
#include <vector>

namespace zenflow {

struct FlagsUsage {
  std::string program;  // e.g. "zf_train"
  std::string version;  // e.g. "0.1.0"; --version prints "PROGRAM VERSION"
  // --help lists the flags defined in source files whose path ends with
  // one of these (e.g. "train_main.cc", "client/tls_flags.cc"); --helpfull
  // lists every flag, the libraries' too.
  std::vector<std::string> files;
};

// Writes absl's program usage message and then the flags --help lists
// (`full`: every flag), each with its help text and default.
void PrintFlagsHelp(const FlagsUsage& usage, bool full, std::ostream& out);

// --help, -h, --helpfull and --version (before a lone "--"): the text on
// stdout, then exit(0). Otherwise absl::ParseCommandLine(argc, argv), whose
// result (the positional arguments) it returns; unknown flags exit 1 there,
// as before.
std::vector<char*> ParseFlags(int argc, char** argv, const FlagsUsage& usage);

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_FLAGS_USAGE_H_
