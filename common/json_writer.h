// The one JSON writer of the binaries: the benchmarks' result files
// (bench-results/*.json), zf_train's ZF_SUMMARY line and its JSON-lines log.
// One writer means every output escapes strings and formats numbers the same
// way, so tools/json_get (the scripts' one reader) parses all of them.
//
//   JsonWriter w;  // pretty: one member per line, 2-space indent
//   w.BeginObject();
//   w.Key("params").Int(params);
//   w.Key("goals").BeginObject().Key("speedup").Int(3).EndObject();
//   w.EndObject();
//   ZF_RETURN_IF_ERROR(w.WriteFile("bench-results/adam.json"));
//
// Numbers: integers exactly; doubles and floats as the shortest text that
// reads back to the same value (so 0.1 is "0.1", not 0.10000000000000001).
// JSON has no NaN or infinity: a non-finite double is written as null, so a
// broken measurement shows up as null instead of making the file unreadable.

#ifndef ZENFLOW_COMMON_JSON_WRITER_H_
#define ZENFLOW_COMMON_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zenflow {

class JsonWriter {
 public:
  enum class Style {
    // One member or element per line, nested containers indented by two
    // spaces, "key": value. For files people read.
    kPretty,
    // No whitespace at all: {"key":value,...}. For one-record-per-line
    // output (ZF_SUMMARY, JSON lines) that scripts grep.
    kCompact,
  };

  explicit JsonWriter(Style style = Style::kPretty) : style_(style) {}

  JsonWriter(const JsonWriter&) = delete;
  JsonWriter& operator=(const JsonWriter&) = delete;

  // Containers. Every Begin needs its End; inside an object every value is
  // preceded by Key(). Calls out of order (a value without a key, End of the
  // wrong kind, a second top-level value) are bugs in the caller: the writer
  // reports the call on stderr and aborts rather than emit invalid JSON.
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();

  // The name of the next member of the innermost (object) container.
  JsonWriter& Key(absl::string_view key);

  // Values. Strings are escaped: quote, backslash and control characters
  // (as \n, \t, ... or \u00XX); other bytes, UTF-8 included, are copied.
  JsonWriter& String(absl::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Double(double value);  // non-finite -> null
  // A float's shortest text (2.4391f -> 2.4391); through Double it would
  // carry the float's binary error as digits (2.4391000270843506).
  JsonWriter& Float(float value);  // non-finite -> null
  JsonWriter& Bool(bool value);
  JsonWriter& Null();

  // True once one complete top-level value has been written.
  bool done() const { return done_; }

  // The document so far (complete once done()), without a final newline.
  const std::string& str() const { return out_; }

  // Writes the complete document and a newline to `path`, creating missing
  // parent directories. The text goes to a temporary file next to `path`
  // that is then renamed over it, so a reader never sees half a file and an
  // interrupted run leaves the previous result in place. Aborts if !done().
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Frame {
    bool object;         // object (true) or array
    int members = 0;     // values written so far
    bool keyed = false;  // object: Key() given, its value pending
  };

  // Separator, newline and indentation before a value or key.
  void BeforeValue(const char* call);
  void AfterValue();
  JsonWriter& Begin(bool object, char open, const char* call);
  JsonWriter& End(bool object, char close, const char* call);
  // `s` in double quotes, escaped.
  void AppendQuoted(absl::string_view s);
  void Newline(size_t depth);
  // int64_t, double or float (finite), as text.
  template <typename T>
  JsonWriter& Number(T value, const char* call);
  [[noreturn]] void Misuse(const char* call, const char* why) const;

  const Style style_;
  std::string out_;
  std::vector<Frame> stack_;
  bool done_ = false;
};

// Writes `contents` to `path` through a temporary file and rename (see
// JsonWriter::WriteFile), creating missing parent directories.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_JSON_WRITER_H_
