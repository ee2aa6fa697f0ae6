#include "common/json_writer.h"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace zenflow {

JsonWriter& JsonWriter::BeginObject() { return Begin(true, '{', "BeginObject"); }
JsonWriter& JsonWriter::EndObject() { return End(true, '}', "EndObject"); }
JsonWriter& JsonWriter::BeginArray() { return Begin(false, '[', "BeginArray"); }
JsonWriter& JsonWriter::EndArray() { return End(false, ']', "EndArray"); }

JsonWriter& JsonWriter::Key(absl::string_view key) {
  if (stack_.empty() || !stack_.back().object) Misuse("Key", "not inside an object");
  Frame& f = stack_.back();
  if (f.keyed) Misuse("Key", "the previous key has no value");
  if (f.members > 0) out_ += ',';
  if (style_ == Style::kPretty) Newline(stack_.size());
  AppendQuoted(key);
  out_ += style_ == Style::kPretty ? ": " : ":";
  f.keyed = true;
  return *this;
}

JsonWriter& JsonWriter::String(absl::string_view value) {
  BeforeValue("String");
  AppendQuoted(value);
  AfterValue();
  return *this;
}

template <typename T>
JsonWriter& JsonWriter::Number(T value, const char* call) {
  // Integers exactly; for floating point, to_chars without a format writes
  // the shortest text that reads back to exactly `value` (at the type's own
  // precision), choosing plain or exponent notation, whatever the locale.
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  BeforeValue(call);
  out_.append(buf, r.ptr);
  AfterValue();
  return *this;
}

JsonWriter& JsonWriter::Int(int64_t value) { return Number(value, "Int"); }

JsonWriter& JsonWriter::Double(double value) {
  return std::isfinite(value) ? Number(value, "Double") : Null();
}

JsonWriter& JsonWriter::Float(float value) {
  return std::isfinite(value) ? Number(value, "Float") : Null();
}

JsonWriter& JsonWriter::Bool(bool value) {
  BeforeValue("Bool");
  out_ += value ? "true" : "false";
  AfterValue();
  return *this;
}

JsonWriter& JsonWriter::Null() {
  BeforeValue("Null");
  out_ += "null";
  AfterValue();
  return *this;
}

absl::Status JsonWriter::WriteFile(const std::string& path) const {
  if (!done_) Misuse("WriteFile", "the document is not complete");
  return WriteFileAtomically(path, absl::StrCat(out_, "\n"));
}

void JsonWriter::BeforeValue(const char* call) {
  if (done_) Misuse(call, "the document is already complete");
  if (stack_.empty()) return;
  Frame& f = stack_.back();
  if (f.object) {
    if (!f.keyed) Misuse(call, "a member of an object needs a Key() first");
    return;  // Key() wrote the separator and the indentation.
  }
  if (f.members > 0) out_ += ',';
  if (style_ == Style::kPretty) Newline(stack_.size());
}

void JsonWriter::AfterValue() {
  if (stack_.empty()) {
    done_ = true;
    return;
  }
  Frame& f = stack_.back();
  f.keyed = false;
  ++f.members;
}

JsonWriter& JsonWriter::Begin(bool object, char open, const char* call) {
  BeforeValue(call);
  out_ += open;
  stack_.push_back(Frame{object});
  return *this;
}

JsonWriter& JsonWriter::End(bool object, char close, const char* call) {
  if (stack_.empty() || stack_.back().object != object) {
    Misuse(call, object ? "no object is open" : "no array is open");
  }
  if (stack_.back().keyed) Misuse(call, "the last key has no value");
  const bool empty = stack_.back().members == 0;
  stack_.pop_back();
  // An empty container stays on one line: {} or [].
  if (style_ == Style::kPretty && !empty) Newline(stack_.size());
  out_ += close;
  AfterValue();
  return *this;
}

void JsonWriter::AppendQuoted(absl::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out_ += '"';
  for (const char c : s) {
    switch (c) {
      case '"':
        out_ += "\\\"";
        break;
      case '\\':
        out_ += "\\\\";
        break;
      case '\b':
        out_ += "\\b";
        break;
      case '\f':
        out_ += "\\f";
        break;
      case '\n':
        out_ += "\\n";
        break;
      case '\r':
        out_ += "\\r";
        break;
      case '\t':
        out_ += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out_ += "\\u00";
          out_ += kHex[(c >> 4) & 0xf];
          out_ += kHex[c & 0xf];
        } else {
          out_ += c;
        }
    }
  }
  out_ += '"';
}

void JsonWriter::Newline(size_t depth) {
  out_ += '\n';
  out_.append(2 * depth, ' ');
}

void JsonWriter::Misuse(const char* call, const char* why) const {
  std::fprintf(stderr, "JsonWriter::%s: %s (after: %.200s)\n", call, why,
               out_.size() > 200 ? out_.c_str() + out_.size() - 200 : out_.c_str());
  std::abort();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot create ", p.parent_path().string(), ": ", ec.message()));
    }
  }
  // The pid keeps two processes writing the same result apart; the ".tmp"
  // suffix is what .gitignore leaves out of bench-results/.
  const std::string tmp = absl::StrCat(path, ".", getpid(), ".tmp");
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  const bool written = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  if (std::fclose(f) != 0 || !written) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace zenflow
