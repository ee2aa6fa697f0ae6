// A main() for a fuzz target without libFuzzer: runs LLVMFuzzerTestOneInput
// once on every file given, or in a directory given (sorted, dot files
// skipped). The regression tests run each target over its seed corpus and
// its saved crash inputs this way, with the project's own compiler; any
// input that crashes or fails a FUZZ_CHECK fails the test.
//
//   replay_main --require fuzz/corpus/shard fuzz/regressions/shard
//
// `--require DIR`: DIR must exist and hold at least one input (a corpus
// that went missing fails the test instead of passing it empty); other
// directories may be absent.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string path = dir + "/" + e->d_name;
    if (!IsDir(path)) out.push_back(path);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool RunFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return false;
  }
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "input %s (%zu bytes)\n", path.c_str(), bytes.size());
  std::fflush(stderr);
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  int ran = 0;
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const bool required = arg == "--require";
    if (required) {
      if (++i == argc) {
        std::fprintf(stderr, "--require needs a directory\n");
        return 2;
      }
      arg = argv[i];
    }
    std::vector<std::string> files;
    if (IsDir(arg)) {
      files = FilesIn(arg);
    } else if (required || access(arg.c_str(), F_OK) == 0) {
      files = {arg};
    }
    if (required && files.empty()) {
      std::fprintf(stderr, "%s: no inputs (a required corpus is missing or empty)\n", arg.c_str());
      ok = false;
    }
    for (const std::string& f : files) {
      ok = RunFile(f) && ok;
      ++ran;
    }
    std::fprintf(stderr, "%s: %zu inputs\n", arg.c_str(), files.size());
  }
  std::fprintf(stderr, "%d inputs ran%s\n", ran, ok ? "" : "; a required corpus was missing");
  return ok ? 0 : 1;
}
