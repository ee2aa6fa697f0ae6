// GetStats, readably: what `zfctl stats` (formerly zf_stats) and `zfctl
// describe` print. Figures the caller's token may not see (the daemon-wide
// ones, GetStatsResponse.daemon_wide_withheld) print as "hidden", with what
// shows them, never as zero.
#ifndef ZENFLOW_TOOLS_ZFCTL_STATS_TEXT_H_
#define ZENFLOW_TOOLS_ZFCTL_STATS_TEXT_H_

#include <cstdint>
#include <string>

#include "zenflow/v1/zenflow.pb.h"

namespace zenflow::ctl {

// "1.50 GiB", "12.0 KiB", "17 B".
std::string Bytes(int64_t b);
// "3h05m", "2m10s", "45s".
std::string Age(double seconds);
// "zenflow", "zero_offload".
std::string ModeName(v1::Mode mode);

// The daemon's lines, then each job's (PrintJob).
void PrintStats(const v1::GetStatsResponse& s, const std::string& where);
// One job's lines: ranks, rounds, update times, divergence, partition,
// transports, each rank.
void PrintJob(const v1::JobStats& j);

// What shows withheld figures.
extern const char kHiddenHint[];

}  // namespace zenflow::ctl

#endif  // ZENFLOW_TOOLS_ZFCTL_STATS_TEXT_H_
