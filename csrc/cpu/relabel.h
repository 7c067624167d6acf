// Relabelling of sampled edges into a block's compact local ids.
#pragma once

#include <cstdint>
#include <vector>

namespace distgnn {

// Maps global ids to local ids: dst[i] -> i, then each source id not seen
// before gets the next id in order of first appearance in src. Writes the
// local id of every edge's source to indices[num_edges] and returns the
// global id of every local id (dst ids first). Throws std::invalid_argument
// on a repeated dst id or a negative id.
std::vector<int64_t> relabel(const int64_t* dst, int64_t num_dst, const int64_t* src, int64_t num_edges,
                             int64_t* indices);

}  // namespace distgnn
