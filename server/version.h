// zenflowd's version, for --version and the zenflow_build_info metric.
#ifndef ZENFLOW_SERVER_VERSION_H_
#define ZENFLOW_SERVER_VERSION_H_

namespace zenflow {

inline constexpr char kZenflowVersion[] = "0.1.0";

// The source commit when the build was stamped with one (ZF_COMMIT), else
// "unknown".
inline const char* ZenflowCommit() {
#ifdef ZF_COMMIT
  return ZF_COMMIT;
#else
  return "unknown";
#endif
}

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_VERSION_H_
