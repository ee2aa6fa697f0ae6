// --help and --version for the programs; see flags_usage.h.
#include "common/flags_usage.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace zenflow {

namespace {

bool Listed(const FlagsUsage& usage, absl::string_view file) {
  for (const std::string& f : usage.files) {
    if (absl::EndsWith(file, f)) return true;
  }
  return false;
}

}  // namespace

void PrintFlagsHelp(const FlagsUsage& usage, bool full, std::ostream& out) {
  out << absl::ProgramUsageMessage() << "\n";
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired()) continue;
    if (full || Listed(usage, flag->Filename())) flags.push_back(flag);
  }
  // By file, then by name, as absl lists them.
  std::sort(flags.begin(), flags.end(), [](const auto* a, const auto* b) {
    const std::string fa = a->Filename(), fb = b->Filename();
    return fa != fb ? fa < fb : a->Name() < b->Name();
  });
  std::string file;
  for (const absl::CommandLineFlag* f : flags) {
    if (f->Filename() != file) {
      file = f->Filename();
      out << "\n  Flags from " << file << ":\n";
    }
    const std::string def = f->DefaultValue();
    out << "    --" << f->Name() << " (" << f->Help() << "); default: "
        << (f->IsOfType<std::string>() ? "\"" + def + "\"" : def) << ";\n";
  }
  if (!full) out << "\nTry --helpfull to see every flag, the libraries' too.\n";
}

std::vector<char*> ParseFlags(int argc, char** argv, const FlagsUsage& usage) {
  // absl's own --helpshort and --version answer as ours do.
  absl::FlagsUsageConfig config;
  const std::vector<std::string> files = usage.files;
  config.contains_help_flags = [files](absl::string_view file) {
    for (const std::string& f : files) {
      if (absl::EndsWith(file, f)) return true;
    }
    return false;
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.version_string = [usage] { return usage.program + " " + usage.version + "\n"; };
  absl::SetFlagsUsageConfig(config);
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--help" || a == "-help" || a == "-h" || a == "--helpfull" || a == "-helpfull") {
      PrintFlagsHelp(usage, absl::EndsWith(a, "full"), std::cout);
      std::cout.flush();
      std::exit(0);
    }
    if (a == "--version" || a == "-version") {
      std::cout << usage.program << " " << usage.version << std::endl;
      std::exit(0);
    }
  }
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace zenflow
