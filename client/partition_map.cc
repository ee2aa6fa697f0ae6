// A partitioned client's knowledge of its job's map; see partition_map.h.
#include "client/partition_map.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zenflow {

namespace {

// The map without the part it was sent to: what every daemon must agree on.
std::string MapKey(v1::Partition p) {
  p.set_part(0);
  return p.SerializeAsString();
}

}  // namespace

// Appends a block's state (block-local columns) to a tensor's, whose
// columns are the block's plus `first`.
void AppendState(const v1::ColumnState& block, int64_t first, v1::ColumnState* to) {
  for (int32_t c : block.columns()) to->add_columns(static_cast<int32_t>(c + first));
  to->mutable_values()->MergeFrom(block.values());
  to->mutable_m()->MergeFrom(block.m());
  to->mutable_v()->MergeFrom(block.v());
  to->mutable_update_counts()->MergeFrom(block.update_counts());
}

// The important columns of every tensor of `map`, from each daemon's
// answer (a split tensor's blocks joined into one ColumnSet).
std::vector<v1::ColumnSet> MergeSelections(const v1::Partition& map,
                                           const std::vector<const v1::Selection*>& got) {
  std::vector<v1::ColumnSet> out;
  const auto& entries = map.tensors();
  for (int i = 0; i < entries.size(); ++i) {
    const v1::PartitionEntry& e = entries[i];
    const bool continues = i > 0 && entries[i - 1].tensor() == e.tensor();
    if (!continues) {
      out.emplace_back();
      out.back().set_tensor(e.tensor());
    }
    // (A daemon names every tensor it hosts, as one daemon does.)
    for (const v1::ColumnSet& cs : got[e.part()]->important()) {
      if (cs.tensor() != e.tensor()) continue;
      for (int32_t c : cs.columns()) {
        out.back().add_columns(static_cast<int32_t>(c + e.first_column()));
      }
    }
  }
  return out;
}

absl::Status PartitionMap::CheckPart(int i, const v1::JobSpec& s) const {
  if (!s.has_partition()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "zenflowd ", targets_[i], " hosts job ", s.job_id(), " whole (no partition), but this "
        "client lists ", n(), " daemons: list only that daemon"));
  }
  const v1::Partition& p = s.partition();
  if (p.parts() != n() || p.part() != i) {
    return absl::FailedPreconditionError(absl::StrCat(
        "zenflowd ", targets_[i], " hosts part ", p.part(), " of ", p.parts(), " of job ",
        s.job_id(), ", but this client lists it as daemon ", i, " of ", n(),
        ": list the job's daemons in the order it was created with"));
  }
  return absl::OkStatus();
}

absl::Status PartitionMap::Learn(const std::vector<v1::JobSpec>& specs) {
  std::string key;
  for (int i = 0; i < n(); ++i) {
    const v1::JobSpec& s = specs[i];
    const v1::Partition& p = s.partition();
    ZF_RETURN_IF_ERROR(CheckPart(i, s));
    if (i == 0) {
      key = MapKey(p);
    } else if (MapKey(p) != key) {
      return absl::FailedPreconditionError(absl::StrCat(
          "zenflowd ", targets_[i], " and ", targets_[0], " hold different partition maps of job ",
          s.job_id(), ": they do not host parts of the same job"));
    }
  }
  MutexLock lock(&mu_);
  map_ = specs[0].partition();
  map_.set_part(0);
  part_of_.clear();
  blocks_.clear();
  std::map<std::string, std::vector<Block>> split;
  for (const v1::PartitionEntry& e : map_.tensors()) {
    part_of_.emplace(e.tensor(), e.part());  // a split tensor: its first block's
    if (e.columns() > 0) split[e.tensor()].push_back({e.part(), e.first_column(), e.columns()});
  }
  for (auto& [name, blocks] : split) {
    blocks_[name] = std::make_shared<const std::vector<Block>>(std::move(blocks));
  }
  known_ = true;
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> PartitionMap::Merge(const std::vector<v1::JobSpec>& specs) {
  ZF_RETURN_IF_ERROR(Learn(specs));
  v1::JobSpec out = specs[0];
  out.clear_tensors();
  out.mutable_partition()->set_part(0);
  const auto& entries = out.partition().tensors();
  for (int i = 0; i < entries.size(); ++i) {
    const v1::PartitionEntry& e = entries[i];
    // A split tensor: once, from its first block, with every block's columns.
    if (i > 0 && entries[i - 1].tensor() == e.tensor()) continue;
    int64_t cols = 0;
    for (int j = i; j < entries.size() && entries[j].tensor() == e.tensor(); ++j) {
      cols += entries[j].columns();
    }
    const v1::JobSpec& s = specs[e.part()];
    bool found = false;
    for (const v1::TensorSpec& t : s.tensors()) {
      if (t.name() != e.tensor()) continue;
      v1::TensorSpec* whole = out.add_tensors();
      *whole = t;
      if (e.columns() > 0 && whole->shape_size() == 2) whole->set_shape(1, cols);
      found = true;
      break;
    }
    if (!found) {
      return absl::InternalError(absl::StrCat("zenflowd ", targets_[e.part()], " does not host tensor ",
                                              e.tensor(), " that its partition map puts there"));
    }
  }
  return out;
}

absl::StatusOr<PartitionMap::Place> PartitionMap::Locate(const std::string& tensor) {
  MutexLock lock(&mu_);
  if (!known_) {
    return absl::FailedPreconditionError(
        "the job's partition map is not known yet: call CreateJob, GetJob or JoinJob first");
  }
  auto it = part_of_.find(tensor);
  if (it == part_of_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor, "' is not in the job's partition map"));
  }
  Place place;
  place.part = it->second;
  if (auto b = blocks_.find(tensor); b != blocks_.end()) place.blocks = b->second;
  return place;
}

absl::StatusOr<int> PartitionMap::PartOf(const std::string& tensor) {
  ZF_ASSIGN_OR_RETURN(Place place, Locate(tensor));
  return place.part;
}

PartitionMap::Blocks PartitionMap::SplitOf(const std::string& tensor) {
  MutexLock lock(&mu_);
  auto it = blocks_.find(tensor);
  return it == blocks_.end() ? nullptr : it->second;
}

const PartitionMap::Block* PartitionMap::BlockOn(const Blocks& blocks, int part) {
  if (blocks == nullptr) return nullptr;
  for (const Block& b : *blocks) {
    if (b.part == part) return &b;
  }
  return nullptr;
}

absl::StatusOr<std::vector<PartitionMap::Piece>> PartitionMap::Pieces(const std::string& tensor,
                                                                      const int32_t* columns,
                                                                      int64_t n) {
  ZF_ASSIGN_OR_RETURN(Place place, Locate(tensor));
  std::vector<Piece> out;
  if (place.blocks == nullptr) {
    out.push_back({place.part, 0, n, {}});  // the input's columns as they are
    return out;
  }
  const std::vector<Block>& blocks = *place.blocks;
  // A new piece wherever the block changes (ascending columns: one per block).
  size_t at = 0;  // the block of the previous column
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = columns[i];
    if (!(c >= blocks[at].first && c < blocks[at].first + blocks[at].cols)) {
      at = blocks.size();
      for (size_t b = 0; b < blocks.size(); ++b) {
        if (c >= blocks[b].first && c < blocks[b].first + blocks[b].cols) at = b;
      }
      if (at == blocks.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", tensor, "' has no column ", c, " (its blocks cover [0, ",
            blocks.back().first + blocks.back().cols, "))"));
      }
    }
    if (out.empty() || out.back().part != blocks[at].part) {
      out.push_back({blocks[at].part, i, i, {}});
    }
    out.back().end = i + 1;
    out.back().local.push_back(static_cast<int32_t>(c - blocks[at].first));
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<int, v1::ColumnState>>> PartitionMap::SplitState(
    const v1::ColumnState& state) {
  ZF_ASSIGN_OR_RETURN(Place place, Locate(state.tensor()));
  std::vector<std::pair<int, v1::ColumnState>> out;
  if (place.blocks == nullptr) {
    out.push_back({place.part, state});  // not split: as it is (the daemon checks it)
    return out;
  }
  const int n = state.columns_size();
  const int rows = n == 0 ? 0 : state.values_size() / n;
  const bool counts = state.update_counts_size() == n;
  const bool moments = state.m_size() == state.values_size() && state.v_size() == state.values_size();
  ZF_ASSIGN_OR_RETURN(std::vector<Piece> pieces, Pieces(state.tensor(), state.columns().data(), n));
  if (static_cast<int64_t>(rows) * n != state.values_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state of tensor '", state.tensor(), "': ", state.values_size(), " values for ", n,
        " columns (need rows x columns)"));
  }
  for (const Piece& pc : pieces) {
    v1::ColumnState cs;
    cs.set_tensor(state.tensor());
    cs.mutable_columns()->Add(pc.local.begin(), pc.local.end());
    const int b = static_cast<int>(pc.begin) * rows, e = static_cast<int>(pc.end) * rows;
    cs.mutable_values()->Add(state.values().begin() + b, state.values().begin() + e);
    if (moments) {
      cs.mutable_m()->Add(state.m().begin() + b, state.m().begin() + e);
      cs.mutable_v()->Add(state.v().begin() + b, state.v().begin() + e);
    }
    if (counts) {
      cs.mutable_update_counts()->Add(state.update_counts().begin() + pc.begin,
                                      state.update_counts().begin() + pc.end);
    }
    out.push_back({pc.part, std::move(cs)});
  }
  return out;
}

v1::Partition PartitionMap::map() {
  MutexLock lock(&mu_);
  return map_;
}

}  // namespace zenflow
