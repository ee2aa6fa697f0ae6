// Whole-file reads and writes for tests.
#ifndef ZENFLOW_TESTS_TESTING_FILES_H_
#define ZENFLOW_TESTS_TESTING_FILES_H_

#include <fstream>
#include <sstream>
#include <string>

namespace zenflow::testing {

// The file's bytes; empty if it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Replaces the file with `text`; false if it cannot be written.
inline bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out);
}

}  // namespace zenflow::testing

#endif  // ZENFLOW_TESTS_TESTING_FILES_H_
