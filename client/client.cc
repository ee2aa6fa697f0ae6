// The worker client library's entry points; see client.h. The two
// implementations live in one_daemon_client.cc and partitioned_client.cc.
#include "client/client.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/connect_diagnosis.h"
#include "client/one_daemon_client.h"
#include "client/partitioned_client.h"
#include "client/parts.h"
#include "common/status_macros.h"

namespace zenflow {

absl::StatusOr<Transport> ParseTransport(const std::string& name) {
  if (name == "grpc") return Transport::kGrpc;
  if (name == "ucx") return Transport::kUcx;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport '", name, "' (want grpc or ucx)"));
}

absl::StatusOr<std::string> LoadToken(const std::string& token_file) {
  if (!token_file.empty()) return ReadTokenFile(token_file);
  const char* env = std::getenv("ZENFLOW_TOKEN");
  return std::string(env == nullptr ? "" : env);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  ZF_ASSIGN_OR_RETURN(std::vector<std::string> targets, SplitTargets(options.target));
  // Every target's form before waiting for the first daemon.
  for (const std::string& t : targets) ZF_RETURN_IF_ERROR(ParseTarget(t).status());
  if (targets.size() == 1) {
    ZF_ASSIGN_OR_RETURN(std::unique_ptr<OneDaemonClient> c,
                        OneDaemonClient::Connect(options, targets[0]));
    return std::unique_ptr<Client>(std::move(c));
  }
  // A job over several daemons: one single-daemon client each.
  std::vector<std::unique_ptr<OneDaemonClient>> clients;
  for (const std::string& t : targets) {
    ClientOptions one = options;
    one.target = t;
    ZF_ASSIGN_OR_RETURN(std::unique_ptr<OneDaemonClient> c, OneDaemonClient::Connect(one, t));
    clients.push_back(std::move(c));
  }
  return std::unique_ptr<Client>(std::make_unique<PartitionedClient>(
      options.transport, std::move(targets), std::move(clients), options.split_tensor_params));
}

absl::Status Client::PushShard(v1::GradientShard shard) {
  v1::UpMessage msg;
  *msg.mutable_shard() = std::move(shard);
  return PushUp(std::move(msg));
}

absl::Status Client::CloseRound(int64_t round, float lr, int32_t steps) {
  return CloseRound(round, lr, steps, WorkerReport());
}

}  // namespace zenflow
