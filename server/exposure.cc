// What zenflowd exposes beyond this host; see exposure.h.
#include "server/exposure.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace zenflow {
namespace {

bool IsLoopbackV4(const in_addr& a) { return (ntohl(a.s_addr) >> 24) == 127; }

bool IsLoopbackV6(const in6_addr& a) {
  if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
  if (IN6_IS_ADDR_V4MAPPED(&a)) {
    in_addr v4;
    std::memcpy(&v4, &a.s6_addr[12], sizeof(v4));
    return IsLoopbackV4(v4);
  }
  return false;
}

// Every address `host` resolves to is a loopback address (and there is one).
bool ResolvesToLoopbackOnly(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addrs = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &addrs) != 0) return false;
  bool any = false;
  bool all = true;
  for (addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      any = true;
      all &= IsLoopbackV4(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr);
    } else if (a->ai_family == AF_INET6) {
      any = true;
      all &= IsLoopbackV6(reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    }
  }
  freeaddrinfo(addrs);
  return any && all;
}

std::string DevicesText(const std::string& devices) {
  return devices.empty() ? "all devices" : absl::StrCat("--ucx_net_devices=", devices);
}

}  // namespace

bool IsLoopbackListen(const std::string& listen) {
  absl::string_view a = listen;
  if (absl::StartsWith(a, "unix:") || absl::StartsWith(a, "unix-abstract:")) return true;
  // gRPC's URI forms of an address.
  if (absl::StartsWith(a, "ipv4:") || absl::StartsWith(a, "ipv6:")) a.remove_prefix(5);
  const size_t colon = a.rfind(':');
  if (colon == absl::string_view::npos) return false;
  std::string host(a.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) return false;  // every interface
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return IsLoopbackV4(v4);
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IsLoopbackV6(v6);
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  return ResolvesToLoopbackOnly(host);
}

std::string NetworkTransportIn(const std::string& ucx_tls) {
  static const char* const kLocal[] = {"sm",        "shm",      "self",      "cma",
                                       "knem",      "xpmem",    "posix",     "sysv",
                                       "cuda_copy", "cuda_ipc", "rocm_copy", "rocm_ipc",
                                       "gdr_copy"};
  const std::string all(absl::StripAsciiWhitespace(ucx_tls));
  if (all.empty()) return "all";  // UCX's default
  if (all.front() == '^') return all;
  for (absl::string_view item : absl::StrSplit(all, ',')) {
    item = absl::StripAsciiWhitespace(item);
    const absl::string_view name = item.substr(0, item.find(':'));  // "ud:aux"
    if (name.empty()) continue;
    bool local = false;
    for (const char* l : kLocal) local |= absl::EqualsIgnoreCase(name, l);
    if (!local) return std::string(name);
  }
  return "";
}

absl::Status CheckExposure(const ExposureConfig& c) {
  if (c.allow_insecure) return absl::OkStatus();
  std::vector<std::string> problems;
  if (!c.tls && !IsLoopbackListen(c.listen)) {
    problems.push_back(absl::StrCat(
        "--listen=", c.listen,
        " reaches beyond this host and gRPC has no TLS: give --tls_cert and --tls_key (and "
        "--tls_ca to require client certificates), or --allow_insecure to serve plaintext "
        "gRPC anyway"));
  }
  const std::string network = c.ucx ? NetworkTransportIn(c.ucx_tls) : "";
  if (!network.empty() && c.ucx_net_devices != "lo") {
    problems.push_back(absl::StrCat(
        "--ucx_tls=", c.ucx_tls, " has a network transport (", network, ") on ",
        DevicesText(c.ucx_net_devices),
        ", and the UCX data plane is never encrypted: gradients and parameters would cross the "
        "network in plaintext. Give --ucx_net_devices=lo (ranks on this host only), "
        "shared-memory transports (--ucx_tls=sm,self), --ucx=false (ranks send on the gRPC "
        "stream, under TLS), or --allow_insecure"));
  }
  if (!c.metrics_listen.empty() && !IsLoopbackListen(c.metrics_listen)) {
    problems.push_back(absl::StrCat(
        "--metrics_listen=", c.metrics_listen,
        " reaches beyond this host and /metrics is plaintext HTTP (it names every job and its "
        "figures): bind it to loopback, or give --allow_insecure"));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("refusing to serve plaintext beyond this host: ",
                                                 absl::StrJoin(problems, "; ")));
}

std::string DescribeExposure(const ExposureConfig& c) {
  std::string grpc;
  if (c.tls) {
    grpc = c.client_certs ? "TLS, client certificates required (--tls_ca)"
                          : "TLS, no client certificates (--tls_ca would require them)";
  } else if (IsLoopbackListen(c.listen)) {
    grpc = "plaintext, loopback only (--tls_cert/--tls_key serve TLS beyond this host)";
  } else {
    grpc = "PLAINTEXT beyond this host (--allow_insecure): whoever reaches it can read and "
           "send zenflow.v1 traffic";
  }
  std::string line = absl::StrCat("gRPC on ", c.listen, ": ", grpc);
  if (c.ucx) {
    const std::string network = NetworkTransportIn(c.ucx_tls);
    absl::StrAppend(&line, "; UCX data plane (never encrypted) over ", c.ucx_tls, ": ");
    if (network.empty()) {
      absl::StrAppend(&line, "this host's shared memory only");
    } else if (c.ucx_net_devices == "lo") {
      absl::StrAppend(&line, "loopback only");
    } else {
      absl::StrAppend(&line, "PLAINTEXT on ", DevicesText(c.ucx_net_devices),
                      " (--allow_insecure)");
    }
  }
  if (!c.metrics_listen.empty()) {
    absl::StrAppend(&line, "; /metrics on ", c.metrics_listen, ": plaintext HTTP, ",
                    IsLoopbackListen(c.metrics_listen) ? "loopback only"
                                                       : "beyond this host (--allow_insecure)");
  }
  return line;
}

std::string WithBoundPort(const std::string& listen, int port) {
  if (port <= 0 || !absl::EndsWith(listen, ":0")) return listen;
  return absl::StrCat(listen.substr(0, listen.size() - 1), port);
}

}  // namespace zenflow
