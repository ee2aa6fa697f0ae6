#include "common/up_wire.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace zenflow {
namespace {

// UpMessage and GradientShard field numbers (proto/zenflow/v1/zenflow.proto).
constexpr uint32_t kUpAttach = 2;
constexpr uint32_t kUpShard = 3;
constexpr uint32_t kUpClose = 4;
constexpr uint32_t kShardPayload = 6;

constexpr uint32_t kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Reads the pieces in order; every read is bounds-checked.
class Cursor {
 public:
  explicit Cursor(const ShardPayload& all) : all_(all) {}
  size_t pos() const { return pos_; }
  size_t size() const { return all_.size(); }

  bool Byte(uint8_t* b) {
    const auto ps = all_.pieces();
    while (piece_ < ps.size() && in_piece_ == ps[piece_].size()) {
      ++piece_;
      in_piece_ = 0;
    }
    if (piece_ == ps.size()) return false;
    *b = static_cast<uint8_t>(ps[piece_][in_piece_++]);
    ++pos_;
    return true;
  }

  // A varint of at most 10 bytes, as protobuf reads them.
  bool Varint(uint64_t* v) {
    uint64_t out = 0;
    for (int i = 0; i < 10; ++i) {
      uint8_t b;
      if (!Byte(&b)) return false;
      out |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
      if ((b & 0x80) == 0) {
        *v = out;
        return true;
      }
    }
    return false;
  }

  // Moves on `n` bytes, which must lie before `limit`.
  bool Skip(uint64_t n, size_t limit) {
    if (n > limit - pos_) return false;
    const auto ps = all_.pieces();
    while (n > 0) {
      if (piece_ == ps.size()) return false;
      const size_t take = std::min<uint64_t>(n, ps[piece_].size() - in_piece_);
      in_piece_ += take;
      pos_ += take;
      n -= take;
      if (in_piece_ == ps[piece_].size()) {
        ++piece_;
        in_piece_ = 0;
      }
    }
    return true;
  }

  // A field's value of wire type `wt`, before `limit`.
  bool SkipValue(uint32_t wt, size_t limit) {
    uint64_t v;
    switch (wt) {
      case kVarint:
        return Varint(&v) && pos_ <= limit;
      case kFixed64:
        return Skip(8, limit);
      case kFixed32:
        return Skip(4, limit);
      case kLen:
        return Varint(&v) && v <= INT32_MAX && pos_ <= limit && Skip(v, limit);
      default:  // groups: not in this proto; protobuf's own parse decides
        return false;
    }
  }

  // A field's key: its number (> 0, < 2^29) and wire type.
  bool Key(uint32_t* field, uint32_t* wt, size_t limit) {
    uint64_t key;
    if (!Varint(&key) || pos_ > limit || key > UINT32_MAX) return false;
    *field = static_cast<uint32_t>(key >> 3);
    *wt = static_cast<uint32_t>(key & 7);
    return *field != 0;
  }

 private:
  const ShardPayload& all_;
  size_t piece_ = 0, in_piece_ = 0, pos_ = 0;
};

// Appends bytes [from, to) of `all` to `out`.
void AppendRange(const ShardPayload& all, size_t from, size_t to, std::string* out) {
  const size_t at = out->size();
  out->resize(at + (to - from));
  all.CopyOut(from, to - from, out->data() + at);
}

}  // namespace

std::string UpMessageHead(v1::UpMessage* msg, size_t payload_size) {
  v1::GradientShard* shard = msg->release_shard();
  std::string head = msg->SerializeAsString();  // the other fields
  std::string fields;
  if (shard != nullptr) {
    fields = shard->SerializeAsString();
    msg->set_allocated_shard(shard);
  }
  const size_t payload_field =
      payload_size == 0 ? 0 : 1 + VarintSize(payload_size) + payload_size;
  PutVarint(&head, (kUpShard << 3) | kLen);
  PutVarint(&head, fields.size() + payload_field);
  head += fields;
  if (payload_size > 0) {
    PutVarint(&head, (kShardPayload << 3) | kLen);
    PutVarint(&head, payload_size);
  }
  return head;
}

void ClearUpKeepingRoom(v1::UpMessage* msg) {
  v1::GradientShard* shard = msg->has_shard() ? msg->release_shard() : nullptr;
  msg->Clear();
  if (shard == nullptr) return;
  shard->Clear();
  std::string().swap(*shard->mutable_payload());  // a payload's room is not kept
  msg->set_allocated_shard(shard);
}

void ShardPayload::CopyOut(size_t offset, size_t n, char* out) const {
  for (const absl::string_view& p : pieces()) {
    if (n == 0) return;
    if (offset >= p.size()) {
      offset -= p.size();
      continue;
    }
    const size_t take = std::min(n, p.size() - offset);
    std::memcpy(out, p.data() + offset, take);
    out += take;
    n -= take;
    offset = 0;
  }
}

bool ParseUpSplit(const ShardPayload& all, v1::UpMessage* msg, ShardPayload* payload) {
  Cursor in(all);
  const size_t end = all.size();
  // The message's bytes other than the payload, gathered for protobuf:
  // the thread's buffers, whose room stays.
  thread_local std::string top, fields;
  top.clear();
  fields.clear();
  bool seen_shard = false, seen_payload = false;
  size_t payload_at = 0, payload_size = 0;
  while (in.pos() < end) {
    const size_t start = in.pos();
    uint32_t field, wt;
    if (!in.Key(&field, &wt, end)) return false;
    if (field == kUpShard && wt == kLen) {
      uint64_t len;
      if (seen_shard || !in.Varint(&len) || in.pos() > end || len > end - in.pos()) return false;
      seen_shard = true;
      const size_t shard_end = in.pos() + len;
      while (in.pos() < shard_end) {
        const size_t fstart = in.pos();
        uint32_t f, w;
        if (!in.Key(&f, &w, shard_end)) return false;
        if (f == kShardPayload && w == kLen) {
          uint64_t n;
          if (seen_payload || !in.Varint(&n) || in.pos() > shard_end) return false;
          seen_payload = true;
          payload_at = in.pos();
          payload_size = n;
          if (!in.Skip(n, shard_end)) return false;
        } else {
          if (!in.SkipValue(w, shard_end)) return false;
          AppendRange(all, fstart, in.pos(), &fields);
        }
      }
      if (in.pos() != shard_end) return false;
    } else if (field == kUpAttach || field == kUpClose || field == kUpShard) {
      return false;  // another kind, or a shard in a form protobuf reads its own way
    } else {
      if (!in.SkipValue(wt, end)) return false;
      AppendRange(all, start, in.pos(), &top);
    }
  }
  if (!seen_shard) return false;
  // As msg->ParseFromString(top) then mutable_shard()->ParseFromString(
  // fields), but a shard `msg` holds is reused: Clear keeps its fields' room.
  v1::GradientShard* shard = msg->has_shard() ? msg->release_shard() : nullptr;
  msg->Clear();
  if (!msg->MergeFromString(top)) {
    delete shard;
    return false;
  }
  if (shard != nullptr) msg->set_allocated_shard(shard);
  if (!msg->mutable_shard()->ParseFromString(fields)) return false;
  payload->Clear();
  size_t skip = payload_at, left = payload_size;
  for (absl::string_view p : all.pieces()) {
    if (left == 0) break;
    if (skip >= p.size()) {
      skip -= p.size();
      continue;
    }
    const size_t take = std::min(left, p.size() - skip);
    payload->Append(p.substr(skip, take));
    left -= take;
    skip = 0;
  }
  return true;
}

}  // namespace zenflow
