#include "common/json_writer.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

std::string DoubleText(double v) {
  JsonWriter w;
  w.Double(v);
  return w.str();
}

std::string FloatText(float v) {
  JsonWriter w;
  w.Float(v);
  return w.str();
}

std::string StringText(absl::string_view s) {
  JsonWriter w;
  w.String(s);
  return w.str();
}

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::filesystem::path TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::filesystem::path(dir != nullptr ? dir : "/tmp") / "json_writer_test";
}

TEST(JsonWriterTest, PrettyNesting) {
  JsonWriter w;
  w.BeginObject();
  w.Key("params").Int(64);
  w.Key("simd").String("avx512");
  w.Key("modes").BeginObject();
  w.Key("zenflow").BeginObject().Key("steps").Int(24).Key("ok").Bool(true).EndObject();
  w.EndObject();
  w.Key("runs").BeginArray().Int(1).Null().BeginArray().EndArray().EndArray();
  w.Key("empty").BeginObject().EndObject();
  w.EndObject();
  EXPECT_TRUE(w.done());
  EXPECT_EQ(w.str(),
            "{\n"
            "  \"params\": 64,\n"
            "  \"simd\": \"avx512\",\n"
            "  \"modes\": {\n"
            "    \"zenflow\": {\n"
            "      \"steps\": 24,\n"
            "      \"ok\": true\n"
            "    }\n"
            "  },\n"
            "  \"runs\": [\n"
            "    1,\n"
            "    null,\n"
            "    []\n"
            "  ],\n"
            "  \"empty\": {}\n"
            "}");
}

// The form of zf_train's ZF_SUMMARY line, which scripts grep for.
TEST(JsonWriterTest, CompactHasNoWhitespace) {
  JsonWriter w(JsonWriter::Style::kCompact);
  w.BeginObject();
  w.Key("mode").String("zenflow");
  w.Key("rank").Int(0);
  w.Key("val_loss").Double(2.5);
  w.Key("list").BeginArray().Bool(false).Int(-3).EndArray();
  w.Key("transport").String("ucx");
  w.EndObject();
  EXPECT_EQ(w.str(),
            "{\"mode\":\"zenflow\",\"rank\":0,\"val_loss\":2.5,\"list\":[false,-3],"
            "\"transport\":\"ucx\"}");
}

TEST(JsonWriterTest, TopLevelScalarCompletesTheDocument) {
  JsonWriter w;
  EXPECT_FALSE(w.done());
  w.Int(7);
  EXPECT_TRUE(w.done());
  EXPECT_EQ(w.str(), "7");
}

TEST(JsonWriterTest, StringEscaping) {
  EXPECT_EQ(StringText("plain"), "\"plain\"");
  EXPECT_EQ(StringText("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(StringText("\n\t\r\b\f"), "\"\\n\\t\\r\\b\\f\"");
  EXPECT_EQ(StringText(std::string("\x01\x1f\0x", 4)), "\"\\u0001\\u001f\\u0000x\"");
  EXPECT_EQ(StringText("/usr/share/x"), "\"/usr/share/x\"");  // '/' needs no escape
  EXPECT_EQ(StringText("\xc3\xa9\x7f"), "\"\xc3\xa9\x7f\"");  // UTF-8 and DEL are copied
  EXPECT_EQ(StringText(""), "\"\"");
}

TEST(JsonWriterTest, KeysAreEscapedToo) {
  JsonWriter w(JsonWriter::Style::kCompact);
  w.BeginObject().Key("a\"b\n").Int(1).EndObject();
  EXPECT_EQ(w.str(), "{\"a\\\"b\\n\":1}");
}

TEST(JsonWriterTest, Integers) {
  JsonWriter w(JsonWriter::Style::kCompact);
  w.BeginArray();
  w.Int(0).Int(-1).Int(std::numeric_limits<int64_t>::max()).Int(std::numeric_limits<int64_t>::min());
  w.EndArray();
  EXPECT_EQ(w.str(), "[0,-1,9223372036854775807,-9223372036854775808]");
}

TEST(JsonWriterTest, DoublesAreShortestRoundTrip) {
  EXPECT_EQ(DoubleText(0.1), "0.1");
  EXPECT_EQ(DoubleText(2.5), "2.5");
  EXPECT_EQ(DoubleText(0), "0");
  EXPECT_EQ(DoubleText(-1.25), "-1.25");
  EXPECT_EQ(DoubleText(625.548), "625.548");
  EXPECT_EQ(DoubleText(3.3873e9), "3387300000");
  EXPECT_EQ(DoubleText(1e300), "1e+300");
  EXPECT_EQ(DoubleText(1.5e-7), "1.5e-07");

  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> mantissa(-1, 1);
  std::uniform_int_distribution<int> exponent(-300, 300);
  for (int i = 0; i < 2000; ++i) {
    const double v = std::ldexp(mantissa(rng), exponent(rng));
    const std::string text = DoubleText(v);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), v) << text;
  }
}

TEST(JsonWriterTest, FloatsUseTheFloatsShortestText) {
  EXPECT_EQ(FloatText(2.4391f), "2.4391");
  EXPECT_EQ(FloatText(0.1f), "0.1");
  EXPECT_EQ(std::strtof(FloatText(3.14159274f).c_str(), nullptr), 3.14159274f);
}

TEST(JsonWriterTest, NonFiniteIsNull) {
  EXPECT_EQ(DoubleText(std::nan("")), "null");
  EXPECT_EQ(DoubleText(std::numeric_limits<double>::infinity()), "null");
  EXPECT_EQ(DoubleText(-std::numeric_limits<double>::infinity()), "null");
  EXPECT_EQ(FloatText(std::numeric_limits<float>::quiet_NaN()), "null");
  JsonWriter w(JsonWriter::Style::kCompact);
  w.BeginObject().Key("loss").Double(std::nan("")).Key("n").Int(1).EndObject();
  EXPECT_EQ(w.str(), "{\"loss\":null,\"n\":1}");
}

TEST(JsonWriterDeathTest, MisuseAborts) {
  EXPECT_DEATH(
      {
        JsonWriter w;
        w.BeginObject().Int(1);
      },
      "needs a Key");
  EXPECT_DEATH(
      {
        JsonWriter w;
        w.BeginArray().Key("x");
      },
      "not inside an object");
  EXPECT_DEATH(
      {
        JsonWriter w;
        w.BeginObject().Key("x").Key("y");
      },
      "previous key has no value");
  EXPECT_DEATH(
      {
        JsonWriter w;
        w.BeginObject().EndArray();
      },
      "no array is open");
  EXPECT_DEATH(
      {
        JsonWriter w;
        w.BeginObject().Key("x").EndObject();
      },
      "last key has no value");
  EXPECT_DEATH(
      {
        JsonWriter w;
        w.Int(1).Int(2);
      },
      "already complete");
  EXPECT_DEATH(
      {
        JsonWriter w;
        w.BeginObject();
        (void)w.WriteFile(TempDir() / "never.json");
      },
      "not complete");
}

TEST(JsonWriterTest, WriteFileCreatesDirectoriesAndReplacesAtomically) {
  const std::filesystem::path dir = TempDir() / "a" / "b";
  std::filesystem::remove_all(TempDir());
  const std::filesystem::path path = dir / "result.json";

  JsonWriter first;
  first.BeginObject().Key("run").Int(1).EndObject();
  ASSERT_TRUE(first.WriteFile(path).ok());
  EXPECT_EQ(ReadAll(path), "{\n  \"run\": 1\n}\n");

  JsonWriter second;
  second.BeginObject().Key("run").Int(2).EndObject();
  ASSERT_TRUE(second.WriteFile(path).ok());
  EXPECT_EQ(ReadAll(path), "{\n  \"run\": 2\n}\n");

  // Only the result is left: the temporary file was renamed, not copied.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(JsonWriterTest, WriteFileReportsAnUnwritablePath) {
  std::filesystem::create_directories(TempDir());
  const std::filesystem::path blocker = TempDir() / "not_a_dir";
  std::ofstream(blocker) << "x";
  const absl::Status s = WriteFileAtomically((blocker / "result.json").string(), "{}\n");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot create"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace zenflow
