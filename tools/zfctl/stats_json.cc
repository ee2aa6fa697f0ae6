// GetStats as JSON; see stats_json.h.
#include "tools/zfctl/stats_json.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"

namespace zenflow::ctl {

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// The figures a job token may not see (registry's StatsOf leaves them unset).
const std::vector<std::string>& WithheldFields() {
  static const std::vector<std::string> kFields = {
      "memory_budget_bytes", "memory_reserved_bytes", "max_jobs", "rejected", "rejections",
      "calls", "resident_bytes", "cpu_seconds", "ucx"};
  return kFields;
}

// A value of field `f` of `m` (element `i` of a repeated field; -1: singular).
void WriteValue(const Message& m, const FieldDescriptor* f, int i, JsonWriter* w) {
  const Reflection* r = m.GetReflection();
  const bool rep = i >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      w->Int(rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      w->Int(rep ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      w->Int(rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      w->Int(static_cast<int64_t>(rep ? r->GetRepeatedUInt64(m, f, i) : r->GetUInt64(m, f)));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      w->Double(rep ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      w->Float(rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      w->Bool(rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f));
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      w->String((rep ? r->GetRepeatedEnum(m, f, i) : r->GetEnum(m, f))->name());
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      w->String(rep ? r->GetRepeatedString(m, f, i) : r->GetString(m, f));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      WriteMessageJson(rep ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f), {}, w);
      break;
  }
}

// A map entry's key as JSON object keys are: text.
std::string KeyText(const Message& entry, const FieldDescriptor* f) {
  const Reflection* r = entry.GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING: return r->GetString(entry, f);
    case FieldDescriptor::CPPTYPE_INT32: return absl::StrCat(r->GetInt32(entry, f));
    case FieldDescriptor::CPPTYPE_INT64: return absl::StrCat(r->GetInt64(entry, f));
    case FieldDescriptor::CPPTYPE_UINT32: return absl::StrCat(r->GetUInt32(entry, f));
    case FieldDescriptor::CPPTYPE_UINT64: return absl::StrCat(r->GetUInt64(entry, f));
    case FieldDescriptor::CPPTYPE_BOOL: return r->GetBool(entry, f) ? "true" : "false";
    default: return "";
  }
}

}  // namespace

void WriteMessageJson(const Message& m, const std::vector<std::string>& null_fields,
                      JsonWriter* w) {
  const Reflection* r = m.GetReflection();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  w->BeginObject();
  for (int k = 0; k < d->field_count(); ++k) {
    const FieldDescriptor* f = d->field(k);
    if (std::find(null_fields.begin(), null_fields.end(), f->name()) != null_fields.end()) {
      w->Key(f->name()).Null();
      continue;
    }
    if (f->is_map()) {
      // Entries in key order, so that the output does not depend on the
      // map's iteration order.
      const FieldDescriptor* key = f->message_type()->map_key();
      const FieldDescriptor* value = f->message_type()->map_value();
      std::vector<std::pair<std::string, int>> keys;
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        keys.emplace_back(KeyText(r->GetRepeatedMessage(m, f, i), key), i);
      }
      std::sort(keys.begin(), keys.end());
      w->Key(f->name()).BeginObject();
      for (const auto& [text, i] : keys) {
        w->Key(text);
        WriteValue(r->GetRepeatedMessage(m, f, i), value, -1, w);
      }
      w->EndObject();
    } else if (f->is_repeated()) {
      w->Key(f->name()).BeginArray();
      for (int i = 0; i < r->FieldSize(m, f); ++i) WriteValue(m, f, i, w);
      w->EndArray();
    } else {
      // Unset messages and proto3 optional fields are left out; every
      // other field is written, zero or not.
      if (f->has_presence() && !r->HasField(m, f)) continue;
      w->Key(f->name());
      WriteValue(m, f, -1, w);
    }
  }
  w->EndObject();
}

std::string StatsJson(const v1::GetStatsResponse& s) {
  JsonWriter w;
  WriteMessageJson(s, s.daemon_wide_withheld() ? WithheldFields() : std::vector<std::string>{},
                   &w);
  return absl::StrCat(w.str(), "\n");
}

std::string StatsJson(const std::vector<v1::GetStatsResponse>& daemons) {
  JsonWriter w;
  w.BeginObject().Key("daemons").BeginArray();
  for (const v1::GetStatsResponse& s : daemons) {
    WriteMessageJson(s, s.daemon_wide_withheld() ? WithheldFields() : std::vector<std::string>{},
                     &w);
  }
  w.EndArray().EndObject();
  return absl::StrCat(w.str(), "\n");
}

}  // namespace zenflow::ctl
