// Relabelling: global ids -> compact local ids in order of first appearance.
//
// Insertion order defines local ids, so one thread fills the map. Two maps:
// a direct array indexed by global id when the ids are dense enough (max id
// below 4x the number of keys: one memory access per edge, no hashing), else
// a flat open-addressing hash table with linear probing. Both live on in a
// per-thread buffer between calls, because allocating and clearing tens of MB
// per call (page faults) would cost more than the relabelling; a generation
// stamp empties them in O(1). The entry for edge e + kLookahead is prefetched
// while edge e is handled, which hides most cache misses.
#include "relabel.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace distgnn {
namespace {

constexpr int64_t kLookahead = 32;
constexpr int64_t kDenseSpread = 4;

struct HashSlot {
  int64_t key;
  int32_t value;
  uint32_t stamp;  // occupied only if stamp == the current generation
};

struct DenseSlot {
  int32_t value;
  uint32_t stamp;
};

template <typename Slot>
struct SlotBuffer {
  std::vector<Slot> slots;
  uint32_t generation = 0;

  // Makes room for `size` slots and starts a new generation (all empty).
  uint32_t reset(size_t size) {
    if (slots.size() < size) slots.resize(size, Slot{});
    if (++generation == 0) {
      for (Slot& slot : slots) slot.stamp = 0;
      generation = 1;
    }
    return generation;
  }
};

class HashMap {
 public:
  HashMap(SlotBuffer<HashSlot>& buffer, int64_t max_keys) {
    int bits = 4;
    while ((int64_t{1} << bits) * 3 < 4 * max_keys) ++bits;  // load factor <= 3/4
    shift_ = 64 - bits;
    mask_ = (uint64_t{1} << bits) - 1;
    generation_ = buffer.reset(mask_ + 1);
    slots_ = buffer.slots.data();
  }

  void prefetch(int64_t key) const { __builtin_prefetch(slots_ + slot_of(key)); }

  // The value stored for key, after inserting `fresh` if key is new.
  int64_t find_or_insert(int64_t key, int64_t fresh, bool& inserted) {
    uint64_t index = slot_of(key);
    while (true) {
      HashSlot& slot = slots_[index];
      if (slot.stamp != generation_) {
        slot = HashSlot{key, static_cast<int32_t>(fresh), generation_};
        inserted = true;
        return fresh;
      }
      if (slot.key == key) {
        inserted = false;
        return slot.value;
      }
      index = (index + 1) & mask_;
    }
  }

 private:
  uint64_t slot_of(int64_t key) const { return (static_cast<uint64_t>(key) * 0x9e3779b97f4a7c15ULL) >> shift_; }

  HashSlot* slots_;
  uint32_t generation_;
  int shift_;
  uint64_t mask_;
};

class DenseMap {
 public:
  DenseMap(SlotBuffer<DenseSlot>& buffer, int64_t max_id) {
    generation_ = buffer.reset(static_cast<size_t>(max_id) + 1);
    slots_ = buffer.slots.data();
  }

  void prefetch(int64_t key) const { __builtin_prefetch(slots_ + key); }

  int64_t find_or_insert(int64_t key, int64_t fresh, bool& inserted) {
    DenseSlot& slot = slots_[key];
    inserted = slot.stamp != generation_;
    if (inserted) slot = DenseSlot{static_cast<int32_t>(fresh), generation_};
    return slot.value;
  }

 private:
  DenseSlot* slots_;
  uint32_t generation_;
};

template <typename Map>
std::vector<int64_t> relabel_with(Map& map, const int64_t* dst, int64_t num_dst, const int64_t* src,
                                  int64_t num_edges, int64_t* indices) {
  std::vector<int64_t> nids;
  nids.reserve(num_dst + num_edges / 2);
  bool inserted = false;
  for (int64_t i = 0; i < num_dst; ++i) {
    if (i + kLookahead < num_dst) map.prefetch(dst[i + kLookahead]);
    map.find_or_insert(dst[i], i, inserted);
    if (!inserted) throw std::invalid_argument("dst_nids must be unique; " + std::to_string(dst[i]) + " appears twice");
    nids.push_back(dst[i]);
  }
  for (int64_t e = 0; e < num_edges; ++e) {
    if (e + kLookahead < num_edges) map.prefetch(src[e + kLookahead]);
    indices[e] = map.find_or_insert(src[e], static_cast<int64_t>(nids.size()), inserted);
    if (inserted) nids.push_back(src[e]);
  }
  return nids;
}

void check_non_negative(const int64_t* ids, int64_t n, const char* name) {
  const int64_t* bad = std::find_if(ids, ids + n, [](int64_t id) { return id < 0; });
  if (bad != ids + n)
    throw std::invalid_argument(std::string(name) + "[" + std::to_string(bad - ids) + "] = " + std::to_string(*bad) +
                                " is negative; node ids must be >= 0");
}

}  // namespace

std::vector<int64_t> relabel(const int64_t* dst, int64_t num_dst, const int64_t* src, int64_t num_edges,
                             int64_t* indices) {
  const int64_t max_keys = num_dst + num_edges;
  if (max_keys >= (int64_t{1} << 31))
    throw std::invalid_argument("relabel supports fewer than 2^31 dst ids plus edges, got " + std::to_string(max_keys));
  int64_t min_id = 0, max_id = -1;
  for (int64_t i = 0; i < num_dst; ++i) min_id = std::min(min_id, dst[i]), max_id = std::max(max_id, dst[i]);
  for (int64_t e = 0; e < num_edges; ++e) min_id = std::min(min_id, src[e]), max_id = std::max(max_id, src[e]);
  if (min_id < 0) {
    check_non_negative(dst, num_dst, "dst_nids");
    check_non_negative(src, num_edges, "src_nids_per_edge");
  }
  if (max_id < kDenseSpread * max_keys) {
    thread_local SlotBuffer<DenseSlot> buffer;
    DenseMap map(buffer, max_id);
    return relabel_with(map, dst, num_dst, src, num_edges, indices);
  }
  thread_local SlotBuffer<HashSlot> buffer;
  HashMap map(buffer, max_keys);
  return relabel_with(map, dst, num_dst, src, num_edges, indices);
}

}  // namespace distgnn
