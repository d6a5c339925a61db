// The attention segment and its masking rule, shared by the host kernels, the CUDA kernels and the
// CP layer that builds segments (cp/attention_cp.cpp).
//
// A segment pairs a block of query rows with a block of key/value rows; rows of different segments
// never interact. Positions (for the causal mask) are explicit: query row i of the segment is at
// position q_pos0 + i, key row j at kv_pos0 + j; causal keeps kv_pos <= q_pos. A whole BSHD batch
// or THD pack is one segment per sequence; CP adds segments per chunk.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/hd.hpp"

namespace hcp::kernels {

struct AttnSegment {
  std::int64_t q_start = 0, q_len = 0;    // rows of q / o / lse
  std::int64_t kv_start = 0, kv_len = 0;  // rows of k / v
  std::int64_t q_pos0 = 0, kv_pos0 = 0;   // global position of the first row of each block
};

// Keys [0, n) of segment g that query row i sees: all of them without the causal mask.
HCP_HD std::int64_t keys_seen(const AttnSegment& g, std::int64_t i, bool causal) {
  if (!causal) return g.kv_len;
  const std::int64_t n = g.q_pos0 + i - g.kv_pos0 + 1;
  return n < 0 ? 0 : (n > g.kv_len ? g.kv_len : n);
}

// Keys [0, n) that any of the query rows [i0, i0 + rows) sees (the last row sees the most).
HCP_HD std::int64_t keys_seen_by_rows(const AttnSegment& g, std::int64_t i0, std::int64_t rows, bool causal) {
  return keys_seen(g, i0 + rows - 1, causal);
}

// The first query row that sees key j of segment g (q_len or more: none does).
HCP_HD std::int64_t first_row_seeing(const AttnSegment& g, std::int64_t j, bool causal) {
  if (!causal) return 0;
  const std::int64_t i = j + g.kv_pos0 - g.q_pos0;
  return i < 0 ? 0 : i;
}

// The softmax scale: `scale`, or 1/sqrt(head_dim) when it is 0.
inline double softmax_scale(double scale, std::int64_t head_dim) {
  return scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

}  // namespace hcp::kernels
