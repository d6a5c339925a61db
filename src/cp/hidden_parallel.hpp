// Hidden-parallel Mamba2 CP (Megatron's layout): after the cp2hp all-to-all every rank holds every
// token of heads/cp heads, and so needs its share of the heads and B/C groups, its slices of the
// mixer's per-channel parameters, and — when n_groups < cp — each group repeated cp/n_groups times
// on the way in and the copies' gradients summed on the way out. The state-passing strategy lives
// beside it in state_passing.hpp; the layer itself is model::Mamba2HP.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace hcp::cp {

// This rank's heads [h0, h0 + hl) and groups [g0, g0 + gl); rep > 1: groups repeated rep times (each
// rank then holds one copy of group g0). Throws, naming the keys, when heads / groups cannot split.
struct HpShare {
  std::int64_t h0 = 0, hl = 1, g0 = 0, gl = 1, rep = 1;
  static HpShare of(std::int64_t heads, std::int64_t groups, int cp, int rank);
};

// One parameter slice: rows [row0, row0 + rows) of parameter `param`, known as `name`.
struct HpSlice {
  std::string name, param;
  std::int64_t row0, rows;
};
// The slices a rank's conv1d and SSD take (d_inner Di, d_state N, head_dim P, n_groups G): conv_w /
// conv_b rows of its x channels, its B and C group channels (conv_wx, conv_bx, conv_wB, conv_bB,
// conv_wC, conv_bC) and its heads of A_log, D and dt_bias.
std::vector<HpSlice> hp_slices(const HpShare& s, std::int64_t Di, std::int64_t G, std::int64_t N, std::int64_t P);
// The slices themselves, as contiguous copies, by name.
std::map<std::string, Tensor> take_slices(const std::vector<HpSlice>& slices,
                                          const std::map<std::string, Tensor>& params);
// Adds each slice's gradient into its rows of the full parameter gradient (the other ranks' slices
// arrive through the gradient all-reduce).
void add_slice_grads(std::map<std::string, Tensor>& grads, const std::vector<HpSlice>& slices,
                     const std::map<std::string, Tensor>& slice_grads);

// [T, G*N] -> [T, G*rep*N]: each group repeated rep times (consecutive copies); its adjoint sums them.
Tensor repeat_groups(const Tensor& x, std::int64_t G, std::int64_t N, std::int64_t rep);
Tensor sum_groups(const Tensor& x, std::int64_t G, std::int64_t N, std::int64_t rep);

// Columns [c0, c0 + n) of a [T, C] tensor, contiguous copy.
Tensor cols(const Tensor& x, std::int64_t c0, std::int64_t n);

}  // namespace hcp::cp
