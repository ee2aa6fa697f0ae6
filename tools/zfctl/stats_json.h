// GetStats as JSON (`zfctl stats --json`), written field by field from the
// message's descriptor with common/json_writer.h rather than protobuf's JSON
// mapping, so that 64-bit counts are JSON numbers (the mapping makes them
// strings) and every field is there, zeros included (every rank has its
// `rank`, rank 0 too). Unset optional fields and messages are left out;
// figures withheld from a job token (daemon_wide_withheld) are null.
#ifndef ZENFLOW_TOOLS_ZFCTL_STATS_JSON_H_
#define ZENFLOW_TOOLS_ZFCTL_STATS_JSON_H_

#include <string>
#include <vector>

#include "common/json_writer.h"
#include "google/protobuf/message.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow::ctl {

// Any message, every field (see above); `null_fields`: top-level fields
// written as null.
void WriteMessageJson(const google::protobuf::Message& m,
                      const std::vector<std::string>& null_fields, JsonWriter* w);

// One daemon's GetStatsResponse, pretty-printed, with a newline.
std::string StatsJson(const v1::GetStatsResponse& s);
// Several: {"daemons": [GetStatsResponse, ...]} in the order given.
std::string StatsJson(const std::vector<v1::GetStatsResponse>& daemons);

}  // namespace zenflow::ctl

#endif  // ZENFLOW_TOOLS_ZFCTL_STATS_JSON_H_
