// Mamba2 mixer layer, forward and backward, with hidden-parallel context parallelism:
//   in_proj (local tokens) -> cp2hp all-to-all of x, B, C, dt (heads/cp heads per rank, B/C groups
//   split or repeated) -> causal conv1d + SiLU (sliced weights) -> SSD scan (sliced A_log, D,
//   dt_bias; seq_idx from the global padded cu_seqlens) -> hp2cp -> gated group RMSNorm with the
//   local z -> out_proj.
// The gate z never leaves its rank: y * silu(z) is applied after hp2cp inside the gated norm,
// which is the same function and saves the all-to-all of z (d_inner values per token) each way.
// With cp = 1 the same code is the plain layer.
#pragma once
#include <map>
#include <string>

#include "comm/communicator.hpp"
#include "core/layout.hpp"
#include "core/tensor.hpp"
#include "cp/layout.hpp"
#include "kernels/kernels.hpp"

namespace hcp::model {

struct Mamba2Config {
  std::int64_t hidden = 64, heads = 4, head_dim = 16, groups = 2, d_state = 16, conv = 4, chunk = 128;
  double eps = 1e-5;
  std::int64_t d_inner() const { return heads * head_dim; }
  std::int64_t conv_dim() const { return d_inner() + 2 * groups * d_state; }
  std::int64_t d_in_proj() const { return 2 * d_inner() + 2 * groups * d_state + heads; }
};

// Parameters (full size on every rank) and their gradients, by name:
// in_proj [d_in_proj, hidden], conv_w [conv_dim, conv], conv_b [conv_dim], A_log [H], D [H],
// dt_bias [H], norm_w [d_inner], out_proj [hidden, d_inner].
using ParamMap = std::map<std::string, Tensor>;
ParamMap mamba2_init(const Mamba2Config& c, DType dt, std::uint64_t seed);
ParamMap zeros_like(const ParamMap& p);

class Mamba2HP {
 public:
  // Checks heads % cp, groups vs cp (n_groups % cp == 0, or cp % n_groups == 0 to repeat groups)
  // and the DCS divisibility of `global` (BSHD rows or THD packed sequences).
  // `part`: how the tokens arrive (DCS between layers; Contiguous as a plain all-gather attention
  // layer would leave them).
  Mamba2HP(Communicator& cp_comm, Mamba2Config cfg, SeqLayout global, cp::Partition part = cp::Partition::DCS);
  // h, y local [Tl, hidden] in DCS order.
  void forward(Tensor& y, const Tensor& h, const ParamMap& p);
  // dh local; parameter gradients summed over the CP group into `grads` (overwritten).
  void backward(Tensor& dh, ParamMap& grads, const Tensor& dy, const ParamMap& p);

 private:
  void ssd_setup(kernels::SsdParams& sp, kernels::SsdInputs& in);  // this rank's SSD problem
  Communicator& comm_;
  Mamba2Config c_;
  SeqLayout global_;
  cp::Partition part_ = cp::Partition::DCS;
  int cp_ = 1, rank_ = 0;
  std::int64_t hl_ = 1, gl_ = 1, rep_ = 1, tl_ = 0, batch_ = 1, seqlen_ = 1;
  std::vector<std::int64_t> seq_idx_;  // empty for BSHD
  // saved by forward
  Tensor h_, zxbcdt_, xpre_, Bpre_, Cpre_, dt_, xc_, Bc_, Cc_, yh_, yl_, rstd_, gated_;
  ParamMap sl_;  // this rank's parameter slices
};

}  // namespace hcp::model
