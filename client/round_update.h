// One round as a rank receives it: every delta of the round and the
// daemon's RoundDone marker. Client::WaitRound, PollRound and the round
// callback hand these out; the round assembler (round_assembler.h) builds
// them from the stream's down messages.
#ifndef ZENFLOW_CLIENT_ROUND_UPDATE_H_
#define ZENFLOW_CLIENT_ROUND_UPDATE_H_

#include <cstdint>
#include <vector>

#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Every delta of one round, in arrival order, and its RoundDone marker.
struct RoundUpdate {
  int64_t round = -1;
  std::vector<v1::ParameterDelta> deltas;
  v1::RoundDone done;
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_ROUND_UPDATE_H_
