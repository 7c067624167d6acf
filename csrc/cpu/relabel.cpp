// Relabelling with a flat open-addressing hash table (linear probing).
//
// Insertion order defines local ids, so the table is filled by one thread;
// the probe for edge e + kLookahead is prefetched while edge e is handled,
// which hides most cache misses on tables larger than the cache.
#include "relabel.h"

#include <stdexcept>
#include <string>

namespace distgnn {
namespace {

constexpr int64_t kEmpty = -1;
constexpr int64_t kLookahead = 8;

class IdTable {
 public:
  explicit IdTable(int64_t max_keys) {
    int bits = 4;
    while ((int64_t{1} << bits) < 2 * max_keys) ++bits;
    shift_ = 64 - bits;
    mask_ = (uint64_t{1} << bits) - 1;
    keys_.assign(mask_ + 1, kEmpty);
    values_.resize(mask_ + 1);
  }

  uint64_t slot_of(int64_t key) const {
    return (static_cast<uint64_t>(key) * 0x9e3779b97f4a7c15ULL) >> shift_;
  }

  void prefetch(int64_t key) const {
    const uint64_t slot = slot_of(key);
    __builtin_prefetch(&keys_[slot]);
    __builtin_prefetch(&values_[slot]);
  }

  // Returns the value stored for key, inserting `fresh` if key is new.
  // `inserted` tells which happened.
  int64_t find_or_insert(int64_t key, int64_t fresh, bool& inserted) {
    uint64_t slot = slot_of(key);
    while (true) {
      const int64_t k = keys_[slot];
      if (k == key) {
        inserted = false;
        return values_[slot];
      }
      if (k == kEmpty) {
        keys_[slot] = key;
        values_[slot] = fresh;
        inserted = true;
        return fresh;
      }
      slot = (slot + 1) & mask_;
    }
  }

 private:
  int shift_;
  uint64_t mask_;
  std::vector<int64_t> keys_;
  std::vector<int64_t> values_;
};

}  // namespace

std::vector<int64_t> relabel(const int64_t* dst, int64_t num_dst, const int64_t* src, int64_t num_edges,
                             int64_t* indices) {
  IdTable table(num_dst + num_edges);
  std::vector<int64_t> nids;
  nids.reserve(num_dst + num_edges / 2);
  bool inserted = false;
  for (int64_t i = 0; i < num_dst; ++i) {
    if (i + kLookahead < num_dst) table.prefetch(dst[i + kLookahead]);
    if (dst[i] < 0) throw std::invalid_argument("dst_nids[" + std::to_string(i) + "] = " + std::to_string(dst[i]) + " is negative; node ids must be >= 0");
    table.find_or_insert(dst[i], i, inserted);
    if (!inserted) throw std::invalid_argument("dst_nids must be unique; " + std::to_string(dst[i]) + " appears twice");
    nids.push_back(dst[i]);
  }
  for (int64_t e = 0; e < num_edges; ++e) {
    if (e + kLookahead < num_edges) table.prefetch(src[e + kLookahead]);
    const int64_t key = src[e];
    if (key < 0) throw std::invalid_argument("src_nids_per_edge[" + std::to_string(e) + "] = " + std::to_string(key) + " is negative; node ids must be >= 0");
    indices[e] = table.find_or_insert(key, static_cast<int64_t>(nids.size()), inserted);
    if (inserted) nids.push_back(key);
  }
  return nids;
}

}  // namespace distgnn
