// Ulysses' exchange over one group, as a function of the group and the tensors: every rank j of
// `group` receives, from every rank i, the heads [lo[j], lo[j] + n[j]) of i's tokens, and puts i's
// rows at rows dest[i] of its result. The adjoint sends the head blocks back to the tokens' owners
// and adds them up there in rank order (K/V heads that several ranks read). Used by a2a+p2p, where
// the group is the inner level and dest places the tokens in the outer ring's DCS order.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "core/seq_layout.hpp"
#include "core/tensor.hpp"

namespace hcp::cp {

// Which K/V heads each of `parts` equal query-head blocks reads (GQA: query head h reads K/V head
// h / (heads / kv_heads)): block j reads [lo[j], lo[j] + n[j]). `map` (empty for plain GQA inside
// the block) gives, for block `mine`, the local K/V head of each of its query heads.
struct KvHeadRanges {
  std::vector<std::int64_t> lo, n, map;
};
KvHeadRanges kv_head_ranges(std::int64_t heads, std::int64_t kv_heads, int parts, int mine);

// The positions, in the outer ring's local order, of the tokens of each rank of an inner group:
// the CP group of `cp` ranks is `cp / inner` outer ranks of `inner` consecutive ranks each; the
// outer rank of `rank` holds the union of its inner ranks' DCS shards, in DCS order at cp / inner.
std::vector<std::vector<std::int64_t>> inner_to_outer_rows(const SeqLayout& global, int cp, int inner, int rank);

// out[:, i] = x[:, map[i]] for [T, heads, D] tensors: one K/V head per query head where a block of
// query heads does not follow the GQA groups. Its adjoint: dx[:, m] = sum of the dout[:, i] with
// map[i] = m, in order.
Tensor expand_heads(const Tensor& x, const std::vector<std::int64_t>& map);
Tensor expand_heads_adjoint(const Tensor& dout, const std::vector<std::int64_t>& map, std::int64_t n);

class HeadExchange {
 public:
  HeadExchange(Communicator& group, std::vector<std::int64_t> lo, std::vector<std::int64_t> n,
               std::vector<std::vector<std::int64_t>> dest, std::int64_t rows_out);
  // [tl, heads, D] -> [rows_out, n[me], D]
  Tensor to_heads(const Tensor& x) const;
  // Adjoint: [rows_out, n[me], D] -> [tl, heads, D], the blocks summed at their owner.
  Tensor to_tokens(const Tensor& xh, std::int64_t heads) const;

 private:
  Communicator& group_;
  std::vector<std::int64_t> lo_, n_;
  std::vector<std::vector<std::int64_t>> dest_;
  std::int64_t rows_out_;
};

}  // namespace hcp::cp
