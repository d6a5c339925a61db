#include "model/mamba2.hpp"

#include <cmath>

#include "cp/layout.hpp"
#include "kernels/kernels.hpp"

namespace hcp::model {
namespace k = hcp::kernels;

ParamMap mamba2_init(const Mamba2Config& c, DType dt, std::uint64_t seed) {
  ParamMap p;
  auto mk = [&](const std::string& n, const Shape& s, double lo, double hi) {
    Tensor t = Tensor::empty(s, dt);
    fill_uniform(t, seed * 31 + std::hash<std::string>{}(n) % 1000, lo, hi);
    p[n] = t;
  };
  const double si = 1.0 / std::sqrt(static_cast<double>(c.hidden)), so = 1.0 / std::sqrt(static_cast<double>(c.d_inner()));
  mk("in_proj", {c.d_in_proj(), c.hidden}, -si, si);
  mk("conv_w", {c.conv_dim(), c.conv}, -0.5, 0.5);
  mk("conv_b", {c.conv_dim()}, -0.1, 0.1);
  mk("A_log", {c.heads}, 0.0, 1.0);
  mk("D", {c.heads}, 0.5, 1.5);
  mk("dt_bias", {c.heads}, -1.0, 0.0);
  mk("norm_w", {c.d_inner()}, 0.8, 1.2);
  mk("out_proj", {c.hidden, c.d_inner()}, -so, so);
  return p;
}

ParamMap zeros_like(const ParamMap& p) {
  ParamMap g;
  for (auto& [n, t] : p) g[n] = Tensor::zeros(t.shape(), t.dtype());
  return g;
}

namespace {
// Columns [c0, c0+n) of a [T, C] tensor, contiguous copy.
Tensor cols(const Tensor& x, std::int64_t c0, std::int64_t n) { return x.slice(1, c0, n).clone(); }
// Rows [r0, r0+n) of a parameter (first axis), contiguous copy.
Tensor rows(const Tensor& x, std::int64_t r0, std::int64_t n) { return x.slice(0, r0, n).clone(); }
// Add `part` into rows [r0, r0+n) of `full`.
void add_rows(Tensor& full, std::int64_t r0, const Tensor& part) {
  Tensor dst = full.slice(0, r0, part.size(0));
  Tensor sum = dst.clone();
  k::axpy(sum, 1.0, part);
  dst.copy_from(sum);
}
// [Tl, G*N] -> [Tl, G*rep*N]: each group repeated rep times (consecutive copies).
Tensor repeat_groups(const Tensor& x, std::int64_t G, std::int64_t N, std::int64_t rep) {
  if (rep == 1) return x;
  const std::int64_t t = x.size(0);
  Tensor out = Tensor::empty({t, G * rep * N}, x.dtype());
  for (std::int64_t e = 0; e < G * rep; ++e) out.slice(1, e * N, N).copy_from(x.slice(1, (e / rep) * N, N));
  return out;
}
Tensor sum_groups(const Tensor& x, std::int64_t G, std::int64_t N, std::int64_t rep) {
  if (rep == 1) return x;
  const std::int64_t t = x.size(0);
  Tensor out = Tensor::zeros({t, G * N}, x.dtype());
  for (std::int64_t e = 0; e < G * rep; ++e) {
    Tensor d = out.slice(1, (e / rep) * N, N).clone();
    k::axpy(d, 1.0, x.slice(1, e * N, N).clone());
    out.slice(1, (e / rep) * N, N).copy_from(d);
  }
  return out;
}
}  // namespace

Mamba2HP::Mamba2HP(Communicator& comm, Mamba2Config cfg, SeqLayout global, cp::Partition part)
    : comm_(comm), c_(cfg), global_(std::move(global)), part_(part) {
  cp_ = comm_.size();
  rank_ = comm_.rank();
  HCP_CHECK(c_.heads % c_.groups == 0, "mamba.n_groups (", c_.groups, ") must divide mamba.heads (", c_.heads, ")");
  HCP_CHECK(c_.heads % cp_ == 0, "hidden-parallel Mamba CP needs mamba.heads (", c_.heads, ") divisible by cp (", cp_, ")");
  if (c_.groups >= cp_) {
    HCP_CHECK(c_.groups % cp_ == 0, "hidden-parallel Mamba CP needs mamba.n_groups (", c_.groups,
              ") divisible by cp (", cp_, ") when n_groups >= cp");
    gl_ = c_.groups / cp_;
  } else {
    HCP_CHECK(cp_ % c_.groups == 0, "hidden-parallel Mamba CP with mamba.n_groups (", c_.groups, ") < cp (", cp_,
              ") repeats groups and needs cp % n_groups == 0");
    rep_ = cp_ / c_.groups;
    gl_ = 1;
  }
  cp::require_dcs_divisible(global_, cp_, "Mamba CP layout", part_);
  hl_ = c_.heads / cp_;
  tl_ = global_.total() / cp_;
  if (global_.format == Format::BSHD) {
    batch_ = global_.nseq();
    seqlen_ = global_.nseq() ? global_.len(0) : 0;
  } else {
    batch_ = 1;
    seqlen_ = global_.total();
    seq_idx_ = cp::seq_idx_from_cu(global_.cu_seqlens);
  }
}

void Mamba2HP::ssd_setup(kernels::SsdParams& sp, kernels::SsdInputs& in) {
  sp.batch = batch_;
  sp.seqlen = seqlen_;
  sp.heads = hl_;
  sp.head_dim = c_.head_dim;
  sp.groups = gl_;
  sp.d_state = c_.d_state;
  sp.chunk = c_.chunk;
  in.x = &xc_;
  in.dt = &dt_;
  in.A_log = &sl_.at("A_log");
  in.Bm = &Bc_;
  in.Cm = &Cc_;
  in.D = &sl_.at("D");
  in.dt_bias = &sl_.at("dt_bias");
  in.seq_idx = seq_idx_.empty() ? nullptr : &seq_idx_;
}

void Mamba2HP::forward(Tensor& y, const Tensor& h, const ParamMap& p) {
  const std::int64_t Di = c_.d_inner(), G = c_.groups, N = c_.d_state, H = c_.heads, P = c_.head_dim;
  const std::int64_t T = global_.total();
  HCP_CHECK(h.numel() == tl_ * c_.hidden, "mamba: input must be [", tl_, ", ", c_.hidden, "] local tokens");
  const DType dt = h.dtype();
  h_ = h.view({tl_, c_.hidden});
  zxbcdt_ = Tensor::zeros({tl_, c_.d_in_proj()}, dt);
  k::linear_fwd(zxbcdt_, h_, p.at("in_proj"), nullptr);
  // cp2hp of x, B, C (groups repeated when G < cp) and dt.
  xpre_ = cp::cp2hp(comm_, cols(zxbcdt_, Di, Di), global_, part_);                                   // [T, Hl*P]
  Bpre_ = cp::cp2hp(comm_, repeat_groups(cols(zxbcdt_, 2 * Di, G * N), G, N, rep_), global_, part_);  // [T, Gl*N]
  Cpre_ = cp::cp2hp(comm_, repeat_groups(cols(zxbcdt_, 2 * Di + G * N, G * N), G, N, rep_), global_, part_);
  dt_ = cp::cp2hp(comm_, cols(zxbcdt_, 2 * Di + 2 * G * N, H), global_, part_);                       // [T, Hl]
  // Parameter slices of this rank: its heads, and its group (or group copy).
  const std::int64_t h0 = rank_ * hl_, g0 = rep_ > 1 ? rank_ / rep_ : rank_ * gl_;
  sl_["conv_wx"] = rows(p.at("conv_w"), h0 * P, hl_ * P);
  sl_["conv_bx"] = rows(p.at("conv_b"), h0 * P, hl_ * P);
  sl_["conv_wB"] = rows(p.at("conv_w"), Di + g0 * N, gl_ * N);
  sl_["conv_bB"] = rows(p.at("conv_b"), Di + g0 * N, gl_ * N);
  sl_["conv_wC"] = rows(p.at("conv_w"), Di + G * N + g0 * N, gl_ * N);
  sl_["conv_bC"] = rows(p.at("conv_b"), Di + G * N + g0 * N, gl_ * N);
  sl_["A_log"] = rows(p.at("A_log"), h0, hl_);
  sl_["D"] = rows(p.at("D"), h0, hl_);
  sl_["dt_bias"] = rows(p.at("dt_bias"), h0, hl_);
  const std::vector<std::int64_t>* seq = seq_idx_.empty() ? nullptr : &seq_idx_;
  xc_ = Tensor::zeros({batch_, seqlen_, hl_ * P}, dt);
  Bc_ = Tensor::zeros({batch_, seqlen_, gl_ * N}, dt);
  Cc_ = Tensor::zeros({batch_, seqlen_, gl_ * N}, dt);
  k::conv1d_fwd(xc_, xpre_.view({batch_, seqlen_, hl_ * P}), sl_["conv_wx"], &sl_["conv_bx"], seq, true);
  k::conv1d_fwd(Bc_, Bpre_.view({batch_, seqlen_, gl_ * N}), sl_["conv_wB"], &sl_["conv_bB"], seq, true);
  k::conv1d_fwd(Cc_, Cpre_.view({batch_, seqlen_, gl_ * N}), sl_["conv_wC"], &sl_["conv_bC"], seq, true);
  k::SsdParams sp;
  k::SsdInputs in;
  ssd_setup(sp, in);
  yh_ = Tensor::zeros({T, hl_ * P}, dt);
  k::ssd_fwd(yh_, nullptr, in, sp);
  yl_ = cp::hp2cp(comm_, yh_, global_, part_);  // [Tl, Di]
  Tensor z = cols(zxbcdt_, 0, Di), g = Tensor::zeros({tl_, Di}, dt);
  rstd_ = Tensor::zeros({tl_, G}, dt);
  k::gated_rmsnorm_fwd(g, rstd_, yl_, z, p.at("norm_w"), G, c_.eps);
  Tensor out = Tensor::zeros({tl_, c_.hidden}, dt);
  k::linear_fwd(out, g, p.at("out_proj"), nullptr);
  y.copy_from(out.view(y.shape()));
  gated_ = g;
}

void Mamba2HP::backward(Tensor& dh, ParamMap& grads, const Tensor& dy, const ParamMap& p) {
  HCP_CHECK(yl_.defined(), "mamba: backward() before forward()");
  const std::int64_t Di = c_.d_inner(), G = c_.groups, N = c_.d_state, H = c_.heads, P = c_.head_dim;
  const std::int64_t T = global_.total();
  const DType dt = h_.dtype();
  grads = zeros_like(p);
  Tensor dyv = dy.view({tl_, c_.hidden});
  Tensor dg = Tensor::zeros({tl_, Di}, dt);
  k::linear_bwd(&dg, &grads["out_proj"], nullptr, gated_, p.at("out_proj"), dyv);
  Tensor z = cols(zxbcdt_, 0, Di), dyl = Tensor::zeros({tl_, Di}, dt), dz = Tensor::zeros({tl_, Di}, dt);
  k::gated_rmsnorm_bwd(dyl, dz, grads["norm_w"], yl_, z, p.at("norm_w"), rstd_, G, dg);
  Tensor dyh = cp::cp2hp(comm_, dyl, global_, part_);  // backward of hp2cp
  const std::vector<std::int64_t>* seq = seq_idx_.empty() ? nullptr : &seq_idx_;
  k::SsdParams sp;
  k::SsdInputs in;
  ssd_setup(sp, in);
  Tensor dxc = Tensor::zeros(xc_.shape(), dt), ddt = Tensor::zeros(dt_.shape(), dt), dA = Tensor::zeros({hl_}, dt),
         dBc = Tensor::zeros(Bc_.shape(), dt), dCc = Tensor::zeros(Cc_.shape(), dt), dD = Tensor::zeros({hl_}, dt),
         ddb = Tensor::zeros({hl_}, dt);
  k::SsdGrads sg{&dxc, &ddt, &dA, &dBc, &dCc, &dD, &ddb, nullptr};
  k::ssd_bwd(sg, in, dyh.view(yh_.shape()), nullptr, sp);
  Tensor dxpre = Tensor::zeros(xc_.shape(), dt), dBpre = Tensor::zeros(Bc_.shape(), dt),
         dCpre = Tensor::zeros(Cc_.shape(), dt);
  Tensor dwx = Tensor::zeros(sl_["conv_wx"].shape(), dt), dbx = Tensor::zeros(sl_["conv_bx"].shape(), dt);
  Tensor dwB = Tensor::zeros(sl_["conv_wB"].shape(), dt), dbB = Tensor::zeros(sl_["conv_bB"].shape(), dt);
  Tensor dwC = Tensor::zeros(sl_["conv_wC"].shape(), dt), dbC = Tensor::zeros(sl_["conv_bC"].shape(), dt);
  k::conv1d_bwd(dxpre, dwx, &dbx, xpre_.view(xc_.shape()), sl_["conv_wx"], &sl_["conv_bx"], seq, true, dxc);
  k::conv1d_bwd(dBpre, dwB, &dbB, Bpre_.view(Bc_.shape()), sl_["conv_wB"], &sl_["conv_bB"], seq, true, dBc);
  k::conv1d_bwd(dCpre, dwC, &dbC, Cpre_.view(Cc_.shape()), sl_["conv_wC"], &sl_["conv_bC"], seq, true, dCc);
  // Slice gradients into the full parameters (other ranks fill the other slices).
  const std::int64_t h0 = rank_ * hl_, g0 = rep_ > 1 ? rank_ / rep_ : rank_ * gl_;
  add_rows(grads["conv_w"], h0 * P, dwx);
  add_rows(grads["conv_b"], h0 * P, dbx);
  add_rows(grads["conv_w"], Di + g0 * N, dwB);
  add_rows(grads["conv_b"], Di + g0 * N, dbB);
  add_rows(grads["conv_w"], Di + G * N + g0 * N, dwC);
  add_rows(grads["conv_b"], Di + G * N + g0 * N, dbC);
  add_rows(grads["A_log"], h0, dA);
  add_rows(grads["D"], h0, dD);
  add_rows(grads["dt_bias"], h0, ddb);
  // hp2cp: the backward of cp2hp (group copies summed back).
  Tensor dzxbcdt = Tensor::zeros({tl_, c_.d_in_proj()}, dt);
  dzxbcdt.slice(1, 0, Di).copy_from(dz);
  dzxbcdt.slice(1, Di, Di).copy_from(cp::hp2cp(comm_, dxpre.view({T, hl_ * P}), global_, part_));
  dzxbcdt.slice(1, 2 * Di, G * N).copy_from(sum_groups(cp::hp2cp(comm_, dBpre.view({T, gl_ * N}), global_, part_), G, N, rep_));
  dzxbcdt.slice(1, 2 * Di + G * N, G * N)
      .copy_from(sum_groups(cp::hp2cp(comm_, dCpre.view({T, gl_ * N}), global_, part_), G, N, rep_));
  dzxbcdt.slice(1, 2 * Di + 2 * G * N, H).copy_from(cp::hp2cp(comm_, ddt.view({T, hl_}), global_, part_));
  Tensor dhl = Tensor::zeros({tl_, c_.hidden}, dt);
  k::linear_bwd(&dhl, &grads["in_proj"], nullptr, h_, p.at("in_proj"), dzxbcdt);
  dh.copy_from(dhl.view(dh.shape()));
  // Parameter gradients: sum over the CP group (token partial sums and head/group slices alike).
  for (auto& [n, g] : grads) comm_.all_reduce(g);
}

}  // namespace hcp::model
