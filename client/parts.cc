// How a job is spread over several daemons; see parts.h.
#include "client/parts.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace zenflow {

absl::StatusOr<std::vector<std::string>> SplitTargets(const std::string& target) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (absl::string_view t : absl::StrSplit(target, ',')) {
    std::string s(absl::StripAsciiWhitespace(t));
    if (s.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target '", target, "' has an empty entry (want host:port or a comma-separated list)"));
    }
    if (!seen.insert(s).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("target '", target, "' lists ", s, " twice"));
    }
    out.push_back(std::move(s));
  }
  if (static_cast<int>(out.size()) > kMaxDaemons) {
    return absl::InvalidArgumentError(absl::StrCat("target lists ", out.size(),
                                                   " daemons; at most ", kMaxDaemons));
  }
  return out;
}

namespace {

bool Hosted(const v1::JobSpec& spec, const v1::TensorSpec& t) {
  if (spec.mode() == v1::MODE_ZERO_OFFLOAD) return true;
  return t.shape_size() == 2 && !t.local();
}

int64_t Params(const v1::TensorSpec& t) {
  int64_t n = 1;
  for (int64_t d : t.shape()) n *= std::max<int64_t>(d, 0);
  return n;
}

}  // namespace

absl::StatusOr<v1::Partition> PlanPartition(const v1::JobSpec& spec, int parts,
                                            int64_t split_params) {
  if (parts < 2) return absl::InvalidArgumentError("a partition needs at least 2 daemons");
  if (parts > kMaxDaemons) {
    return absl::InvalidArgumentError(
        absl::StrCat("a job spreads over at most ", kMaxDaemons, " daemons, not ", parts));
  }
  auto weight = [&](const v1::TensorSpec& t) { return Hosted(spec, t) ? Params(t) : 0; };
  int64_t hosted = 0;
  for (const v1::TensorSpec& t : spec.tensors()) hosted += weight(t);
  const int64_t share = std::max<int64_t>(1, (hosted + parts - 1) / parts);
  // Split past `limit`, into blocks of about `block` parameters.
  const int64_t limit = split_params > 0 ? split_params : 2 * share;
  const int64_t block = split_params > 0 ? split_params : share;
  // The map's entries, in job order: whole tensors and column blocks.
  struct Item {
    int tensor;
    int64_t first = 0, cols = 0;  // cols 0: whole
    int64_t weight = 0;
    int part = -1;  // until placed
  };
  std::vector<Item> items;
  for (int i = 0; i < spec.tensors_size(); ++i) {
    const v1::TensorSpec& t = spec.tensors(i);
    const int64_t w = weight(t);
    const int64_t cols = t.shape_size() == 2 ? t.shape(1) : 0;
    int64_t blocks = 1;
    if (w > limit && t.shape_size() == 2 && !t.local() && cols >= 2) {
      blocks = std::min<int64_t>({(w + block - 1) / block, parts, cols});
    }
    if (blocks < 2) {
      items.push_back({i, 0, 0, w});
      continue;
    }
    int64_t first = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n = cols / blocks + (b < cols % blocks ? 1 : 0);
      items.push_back({i, first, n, t.shape(0) * n});
      first += n;
    }
  }
  if (static_cast<int>(items.size()) < parts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", spec.job_id(), " has ", spec.tensors_size(), " tensors (", items.size(),
        " parts once its large tensors are split by columns): it cannot be spread over ", parts,
        " daemons; list at most ", items.size()));
  }
  std::vector<int> order(items.size());
  for (size_t k = 0; k < items.size(); ++k) order[k] = static_cast<int>(k);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return items[a].weight > items[b].weight; });
  std::vector<int64_t> load(parts, 0);
  std::vector<int> count(parts, 0);
  std::vector<uint64_t> blocks_on(spec.tensors_size(), 0);  // parts (<= 64) by bit
  for (int k : order) {
    Item& it = items[k];
    int best = -1;
    for (int p = 0; p < parts; ++p) {
      // A daemon holding another block of the tensor already is not a choice.
      if (it.cols > 0 && (blocks_on[it.tensor] >> p & 1) != 0) continue;
      if (best < 0 || std::tie(load[p], count[p]) < std::tie(load[best], count[best])) best = p;
    }
    it.part = best;
    if (it.cols > 0) blocks_on[it.tensor] |= uint64_t{1} << best;
    load[best] += it.weight;
    ++count[best];
  }
  v1::Partition map;
  map.set_version(1);
  map.set_parts(parts);
  for (const Item& it : items) {
    const v1::TensorSpec& t = spec.tensors(it.tensor);
    v1::PartitionEntry* e = map.add_tensors();
    e->set_tensor(t.name());
    e->set_part(it.part);
    if (it.cols > 0) {
      e->set_first_column(it.first);
      e->set_columns(it.cols);
      e->set_params(t.shape(0) * it.cols);
    } else {
      e->set_params(Params(t));
    }
  }
  return map;
}

v1::JobSpec PartSpec(const v1::JobSpec& spec, const v1::Partition& map, int part) {
  v1::JobSpec out = spec;
  out.clear_tensors();
  int ti = -1;
  for (int i = 0; i < map.tensors_size(); ++i) {
    const v1::PartitionEntry& e = map.tensors(i);
    // The map lists the job's tensors in order, a split one once per block.
    if (i == 0 || map.tensors(i - 1).tensor() != e.tensor()) ++ti;
    if (ti >= spec.tensors_size()) break;
    if (e.part() != part) continue;
    v1::TensorSpec* t = out.add_tensors();
    *t = spec.tensors(ti);
    if (e.columns() > 0 && t->shape_size() == 2) t->set_shape(1, e.columns());
  }
  *out.mutable_partition() = map;
  out.mutable_partition()->set_part(part);
  return out;
}

}  // namespace zenflow
