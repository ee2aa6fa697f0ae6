// Fuzz target "hand_off": HandOff requests (and importance, shards and
// closes) against a real job right after a reselection, where columns leave
// and join the ranks' important sets (server/hand_off.h, Job::HandOff).
//
// Input: a config byte (StartHandOffJob: one or two ranks; bit 1: a second
// selection, so that state leaves the ranks), two records of importance
// scores, then ops (fuzz/ops.h). Properties checked: those of RunOps.
#include <cstddef>
#include <cstdint>
#include <optional>

#include "fuzz/check.h"
#include "fuzz/fuzz_job.h"
#include "fuzz/input.h"
#include "fuzz/ops.h"
#include "fuzz/scenarios.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zenflow::fuzz;
  FuzzInput in(data, size);
  const uint8_t config = in.Byte();
  const std::optional<FuzzRecord> scores1 = in.Record();
  const std::optional<FuzzRecord> scores2 = in.Record();
  absl::StatusOr<HandOffJob> h =
      StartHandOffJob(config, scores1 ? scores1->body : "", scores2 ? scores2->body : "",
                      "handoff");
  FUZZ_CHECK(h.ok(), "the hand-off job of config ", config,
             " could not be started: ", h.status().ToString());
  RunOps(h->job, &in);
  DeleteAllJobs();
  return 0;
}
