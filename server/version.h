// The daemon's release version, for `zenflowd --version` and for anything
// that reports what is running (e.g. a build_info metric).
#ifndef ZENFLOW_SERVER_VERSION_H_
#define ZENFLOW_SERVER_VERSION_H_

namespace zenflow {

inline constexpr char kZenflowVersion[] = "0.1.0";

// The git commit the binary was built from. The build does not stamp it yet
// (that needs Bazel's --stamp and a workspace status command for every
// build), so this is "unknown".
inline const char* ZenflowCommit() { return "unknown"; }

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_VERSION_H_
