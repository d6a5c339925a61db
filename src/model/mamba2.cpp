#include "model/mamba2.hpp"

#include "model/mamba2_strategy.hpp"

#include <cmath>

#include "cp/hidden_parallel.hpp"
#include "cp/layout.hpp"
#include "kernels/kernels.hpp"
#include "model/layers.hpp"

namespace hcp::model {
namespace k = hcp::kernels;

std::vector<ParamSpec> mamba2_params(const Mamba2Config& c) {
  const double si = 1.0 / std::sqrt(static_cast<double>(c.hidden)),
               so = 1.0 / std::sqrt(static_cast<double>(c.d_inner()));
  return {{"in_proj", {c.d_in_proj(), c.hidden}, -si, si},
          {"conv_w", {c.conv_dim(), c.conv}, -0.5, 0.5},
          {"conv_b", {c.conv_dim()}, -0.1, 0.1},
          {"A_log", {c.heads}, 0.0, 1.0},
          {"D", {c.heads}, 0.5, 1.5},
          {"dt_bias", {c.heads}, -1.0, 0.0},
          {"norm_w", {c.d_inner()}, 0.8, 1.2},
          {"out_proj", {c.hidden, c.d_inner()}, -so, so}};
}

ParamMap mamba2_init(const Mamba2Config& c, DType dt, std::uint64_t seed) {
  return init_params(mamba2_params(c), dt, seed);
}

ParamMap zeros_like(const ParamMap& p) {
  ParamMap g;
  for (auto& [n, t] : p) g[n] = Tensor::zeros(t.shape(), t.dtype(), t.space());
  return g;
}

namespace {
// `t` in dtype `d` (itself when it already is).
Tensor as(const Tensor& t, DType d) { return t.dtype() == d ? t : t.to(d); }
}  // namespace

template <class F>
void Mamba2Layer::timed(const std::string& name, F&& f) {
  phases_.time(name, default_space(), f);
}

Mamba2Layer::Mamba2Layer(Communicator& comm, Mamba2Config cfg) : comm_(comm), c_(cfg) {
  cp_ = comm_.size();
  rank_ = comm_.rank();
  HCP_CHECK(c_.heads % c_.groups == 0, "mamba.n_groups (", c_.groups, ") must divide mamba.heads (", c_.heads, ")");
}

Mamba2Layer::Mamba2Layer(Communicator& comm, Mamba2Config cfg, SeqLayout global, cp::Partition part)
    : Mamba2Layer(comm, cfg) {
  global_ = std::move(global);
  part_ = part;
  cp::require_dcs_divisible(global_, cp_, "Mamba CP layout", part_);
  tl_ = global_.total() / cp_;
}

void Mamba2Layer::in_proj_fwd(const Tensor& h, const ParamMap& p) {
  HCP_CHECK(h.numel() == tl_ * c_.hidden, "mamba: input must be [", tl_, ", ", c_.hidden, "] local tokens");
  timed("fwd/in_proj", [&] {
    h_ = h.view({tl_, c_.hidden});
    zxbcdt_ = Tensor::zeros({tl_, c_.d_in_proj()}, h.dtype());
    k::linear_fwd(zxbcdt_, h_, p.at("in_proj"), nullptr);
  });
}

void Mamba2Layer::keep_only_z() {
  z_ = z().clone();
  zxbcdt_ = Tensor();
}

Tensor Mamba2Layer::z() const { return z_.defined() ? z_ : cp::cols(zxbcdt_, 0, c_.d_inner()); }

void Mamba2Layer::out_fwd(Tensor& y, const Tensor& yl, const ParamMap& p) {
  timed("fwd/norm_out_proj", [&] {
    const std::int64_t Di = c_.d_inner();
    const DType dt = yl.dtype();
    yl_ = yl;
    Tensor g = Tensor::zeros({tl_, Di}, dt);
    rstd_ = Tensor::zeros({tl_, c_.groups}, dt);
    k::gated_rmsnorm_fwd(g, rstd_, yl_, z(), p.at("norm_w"), c_.groups, c_.eps);
    Tensor out = Tensor::zeros({tl_, c_.hidden}, dt);
    k::linear_fwd(out, g, p.at("out_proj"), nullptr);
    cp::zero_pad_rows(out, global_, cp_, rank_, part_);  // pads: zero outputs
    y.copy_from(out.view(y.shape()));
  });
}

Tensor Mamba2Layer::out_bwd(Tensor& dz, ParamMap& grads, const Tensor& dy, const ParamMap& p) {
  HCP_CHECK(yl_.defined(), "mamba: backward() before forward()");
  Tensor dyl;
  timed("bwd/norm_out_proj", [&] {
    const std::int64_t Di = c_.d_inner();
    const DType dt = h_.dtype();
    grads = zeros_like(p);
    Tensor dyv = dy.view({tl_, c_.hidden});
    if (global_.padded()) {  // a pad's output is zero: its upstream gradient does not flow back
      dyv = dyv.clone();
      cp::zero_pad_rows(dyv, global_, cp_, rank_, part_);
    }
    // The norm's output again (the same kernel on the same inputs: the forward's values exactly).
    Tensor g = Tensor::zeros({tl_, Di}, dt), rstd = Tensor::zeros({tl_, c_.groups}, dt);
    k::gated_rmsnorm_fwd(g, rstd, yl_, z(), p.at("norm_w"), c_.groups, c_.eps);
    Tensor dg = Tensor::zeros({tl_, Di}, dt);
    k::linear_bwd(&dg, &grads["out_proj"], nullptr, g, p.at("out_proj"), dyv);
    release_saved(g, rstd);
    dyl = Tensor::zeros({tl_, Di}, dt);
    dz = Tensor::zeros({tl_, Di}, dt);
    k::gated_rmsnorm_bwd(dyl, dz, grads["norm_w"], yl_, z(), p.at("norm_w"), rstd_, c_.groups, dg);
  });
  return dyl;
}

void Mamba2Layer::in_proj_bwd(Tensor& dh, ParamMap& grads, const Tensor& dzxbcdt, const ParamMap& p) {
  timed("bwd/in_proj", [&] {
    Tensor dhl = Tensor::zeros({tl_, c_.hidden}, h_.dtype());
    k::linear_bwd(&dhl, &grads["in_proj"], nullptr, h_, p.at("in_proj"), dzxbcdt);
    release_saved(h_, zxbcdt_, z_, yl_, rstd_);          // the forward's tensors are spent
    cp::zero_pad_rows(dhl, global_, cp_, rank_, part_);  // pads: zero input gradients
    dh.copy_from(dhl.view(dh.shape()));
  });
  // Parameter gradients: sum over the CP group (token partial sums and head/group slices alike).
  timed("bwd/param_allreduce", [&] {
    for (auto& [n, g] : grads) reduce_grad(comm_, g);
  });
}

namespace {
// Rows [end - (W-1), end) of the [*, C] tensor `src` (rows before `first` are zero) into window
// `b` of w [ns, W-1, C], for each (b, first, end).
struct WindowRows {
  std::vector<std::int64_t> dst, src;
  void add(std::int64_t b, std::int64_t w1, std::int64_t first, std::int64_t end) {
    for (std::int64_t j = 0; j < w1; ++j) {
      const std::int64_t r = end - w1 + j;
      if (r < first) continue;
      dst.push_back(b * w1 + j);
      src.push_back(r);
    }
  }
  void copy(Tensor& w, const Tensor& from) const {
    if (dst.empty()) return;
    Tensor flat = w.view({-1, w.shape().back()});
    cp::copy_rows(flat, from, dst, src);
  }
};
}  // namespace

std::int64_t MambaCarry::bytes() const {
  std::int64_t b = 0;
  for (const Tensor* t : {&wx, &wB, &wC, &state})
    if (t->defined()) b += t->numel() * static_cast<std::int64_t>(dtype_size(t->dtype()));
  return b;
}

// Hidden parallel: the rank holds every sequence's rows of its heads in the global order. Unpadded
// BSHD rows end where the forward's scan ends (its final states); a packed row's scan, and a padded
// sequence's pads, go past a sequence's last real token, so each such state comes from an SSD over
// the sequence's real rows alone.
void Mamba2HP::make_carry() {
  const std::int64_t P = c_.head_dim, N = c_.d_state, W1 = c_.conv - 1, ns = global_.nseq();
  const std::int64_t hl = share_.hl, gl = share_.gl;
  const DType dt = xc_.dtype();
  carry_ = MambaCarry{};
  carry_.share = share_;
  carry_.wx = Tensor::zeros({ns, W1, hl * P}, dt);
  carry_.wB = Tensor::zeros({ns, W1, gl * N}, dt);
  carry_.wC = Tensor::zeros({ns, W1, gl * N}, dt);
  carry_.state = Tensor::zeros({ns, hl, P, N}, acc_dtype(dt));
  WindowRows rows;
  const std::int64_t T = global_.total();
  Tensor x = xc_.view({T, hl, P}), d = dt_.view({T, hl}), B = Bc_.view({T, gl, N}), C = Cc_.view({T, gl, N});
  if (final_.defined()) carry_.state.copy_from(as(final_, acc_dtype(dt)));
  for (std::int64_t s = 0; s < ns; ++s) {
    carry_.seqs.push_back(s);
    const std::int64_t first = global_.cu_seqlens[static_cast<std::size_t>(s)], real = global_.real(s);
    rows.add(s, W1, first, first + real);
    if (real == 0 || final_.defined()) continue;
    k::SsdParams sp;
    sp.seqlen = real;
    sp.heads = hl;
    sp.head_dim = P;
    sp.groups = gl;
    sp.d_state = N;
    sp.chunk = c_.chunk;
    Tensor xs = x.slice(0, first, real).view({1, real, hl, P}), ds = d.slice(0, first, real).view({1, real, hl}),
           Bs = B.slice(0, first, real).view({1, real, gl, N}), Cs = C.slice(0, first, real).view({1, real, gl, N});
    k::SsdInputs in;
    in.x = &xs;
    in.dt = &ds;
    in.A_log = &sl_.at("A_log");
    in.Bm = &Bs;
    in.Cm = &Cs;
    in.D = &sl_.at("D");
    in.dt_bias = &sl_.at("dt_bias");
    Tensor ys = Tensor::zeros({1, real, hl, P}, dt), fs = Tensor::zeros({1, hl, P, N}, dt);
    k::ssd_fwd(ys, &fs, in, sp);
    Tensor to = carry_.state.slice(0, s, 1);
    to.copy_from(as(fs, acc_dtype(dt)));
  }
  rows.copy(carry_.wx, xpre_);
  rows.copy(carry_.wB, Bpre_);
  rows.copy(carry_.wC, Cpre_);
  final_ = Tensor();
}

// State passing: the rank that holds a sequence's last real token hands it off, every head. Its
// state is that of the token's piece, run from the piece's incoming state up to the token; the
// window comes from the piece's conv input with its halo (the rows before it, from other ranks).
void Mamba2SP::make_carry(const ParamMap& p) {
  const std::int64_t H = c_.heads, P = c_.head_dim, N = c_.d_state, G = c_.groups, Di = c_.d_inner();
  const std::int64_t W1 = c_.conv - 1, CD = c_.conv_dim();
  const DType dt = xl_.dtype();
  carry_ = MambaCarry{};
  carry_.share = cp::HpShare{0, H, 0, G, 1};
  std::vector<std::size_t> ends;  // pieces holding their sequence's last real token
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const cp::Piece& pc = pieces_[i];
    const std::int64_t last = global_.cu_seqlens[static_cast<std::size_t>(pc.seq)] + global_.real(pc.seq) - 1;
    if (global_.real(pc.seq) > 0 && last >= pc.gstart && last < pc.gstart + pc.len) ends.push_back(i);
  }
  const auto ns = static_cast<std::int64_t>(ends.size());
  Tensor w = Tensor::zeros({ns, W1, CD}, dt);
  carry_.state = Tensor::zeros({ns, H, P, N}, acc_dtype(dt));
  WindowRows rows;
  Tensor ext = ext_.view({halo_.ext_rows(), CD});
  for (std::int64_t b = 0; b < ns; ++b) {
    const std::size_t i = ends[static_cast<std::size_t>(b)];
    const cp::Piece& pc = pieces_[i];
    carry_.seqs.push_back(pc.seq);
    const std::int64_t n = global_.cu_seqlens[static_cast<std::size_t>(pc.seq)] + global_.real(pc.seq) - pc.gstart;
    const std::int64_t own = halo_.ext_start(i) + halo_.halo();  // the piece's first row in ext
    rows.add(b, W1, halo_.ext_start(i), own + n);
    PieceRun r{i, 1, pc.lrow, n};
    PieceIO io = piece_io(r, xl_, dtl_, Bl_, Cl_);
    Tensor Si = S_in_.slice(0, static_cast<std::int64_t>(i), 1);
    Tensor ys = Tensor::zeros({n, Di}, dt), fs = Tensor::zeros({1, H, P, N}, dt);
    k::ssd_fwd(ys, &fs, inputs(io, p, pc.chunk > 0 ? &Si : nullptr), io.sp);
    Tensor to = carry_.state.slice(0, b, 1);
    to.copy_from(as(fs, acc_dtype(dt)));
  }
  rows.copy(w, ext);
  Tensor wf = w.view({ns * W1, CD});
  carry_.wx = cp::cols(wf, 0, Di).view({ns, W1, Di});
  carry_.wB = cp::cols(wf, Di, G * N).view({ns, W1, G * N});
  carry_.wC = cp::cols(wf, Di + G * N, G * N).view({ns, W1, G * N});
}

Mamba2HP::Mamba2HP(Communicator& comm, Mamba2Config cfg, SeqLayout global, cp::Partition part)
    : Mamba2Layer(comm, cfg, std::move(global), part) {
  share_ = cp::HpShare::of(c_.heads, c_.groups, cp_, rank_);
  slices_ = cp::hp_slices(share_, c_.d_inner(), c_.groups, c_.d_state, c_.head_dim);
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
  sp.heads = share_.hl;
  sp.head_dim = c_.head_dim;
  sp.groups = share_.gl;
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
  SpaceScope space_scope(h.space());  // work tensors live where the inputs do
  const std::int64_t Di = c_.d_inner(), G = c_.groups, N = c_.d_state, H = c_.heads, P = c_.head_dim;
  const std::int64_t T = global_.total();
  const DType dt = h.dtype();
  in_proj_fwd(h, p);
  // cp2hp of x, B, C (groups repeated when G < cp) and dt.
  timed("fwd/all_to_all", [&] {
    xpre_ = cp::cp2hp(comm_, cp::cols(zxbcdt_, Di, Di), global_, part_);  // [T, Hl*P]
    Bpre_ = cp::cp2hp(comm_, cp::repeat_groups(cp::cols(zxbcdt_, 2 * Di, G * N), G, N, share_.rep), global_,
                      part_);  // [T, Gl*N]
    Cpre_ =
        cp::cp2hp(comm_, cp::repeat_groups(cp::cols(zxbcdt_, 2 * Di + G * N, G * N), G, N, share_.rep), global_, part_);
    dt_ = cp::cp2hp(comm_, cp::cols(zxbcdt_, 2 * Di + 2 * G * N, H), global_, part_);  // [T, Hl]
  });
  keep_only_z();  // x, B, C and dt travel on as copies
  const std::vector<std::int64_t>* seq = seq_idx_.empty() ? nullptr : &seq_idx_;
  timed("fwd/conv1d", [&] {
    sl_ = cp::take_slices(slices_, p);  // this rank's heads, and its group (or group copy)
    xc_ = Tensor::zeros({batch_, seqlen_, share_.hl * P}, dt);
    Bc_ = Tensor::zeros({batch_, seqlen_, share_.gl * N}, dt);
    Cc_ = Tensor::zeros({batch_, seqlen_, share_.gl * N}, dt);
    k::conv1d_fwd(xc_, xpre_.view({batch_, seqlen_, share_.hl * P}), sl_["conv_wx"], &sl_["conv_bx"], seq, true);
    k::conv1d_fwd(Bc_, Bpre_.view({batch_, seqlen_, share_.gl * N}), sl_["conv_wB"], &sl_["conv_bB"], seq, true);
    k::conv1d_fwd(Cc_, Cpre_.view({batch_, seqlen_, share_.gl * N}), sl_["conv_wC"], &sl_["conv_bC"], seq, true);
  });
  timed("fwd/ssd", [&] {
    k::SsdParams sp;
    k::SsdInputs in;
    ssd_setup(sp, in);
    yh_ = Tensor::zeros({T, share_.hl * P}, dt);
    // A prefill of unpadded BSHD rows: the scan's final states are the hand-off's.
    final_ = keep_carry_ && !seq && !global_.padded() ? Tensor::zeros({batch_, share_.hl, P, N}, dt) : Tensor();
    k::ssd_fwd(yh_, final_.defined() ? &final_ : nullptr, in, sp);
  });
  if (keep_carry_) timed("fwd/carry", [&] { make_carry(); });
  Tensor yl;
  timed("fwd/all_to_all", [&] { yl = cp::hp2cp(comm_, yh_, global_, part_); });  // [Tl, Di]
  out_fwd(y, yl, p);
}

void Mamba2HP::backward(Tensor& dh, ParamMap& grads, const Tensor& dy, const ParamMap& p) {
  SpaceScope space_scope(dy.space());  // work tensors live where the inputs do
  const std::int64_t Di = c_.d_inner(), G = c_.groups, N = c_.d_state, H = c_.heads, P = c_.head_dim;
  const std::int64_t T = global_.total();
  const DType dt = h_.dtype();
  Tensor dz;
  Tensor dyl = out_bwd(dz, grads, dy, p);
  Tensor dyh;
  timed("bwd/all_to_all", [&] { dyh = cp::cp2hp(comm_, dyl, global_, part_); });  // backward of hp2cp
  const std::vector<std::int64_t>* seq = seq_idx_.empty() ? nullptr : &seq_idx_;
  Tensor dxc = Tensor::zeros(xc_.shape(), dt), ddt = Tensor::zeros(dt_.shape(), dt),
         dA = Tensor::zeros({share_.hl}, dt), dBc = Tensor::zeros(Bc_.shape(), dt),
         dCc = Tensor::zeros(Cc_.shape(), dt), dD = Tensor::zeros({share_.hl}, dt),
         ddb = Tensor::zeros({share_.hl}, dt);
  timed("bwd/ssd", [&] {
    k::SsdParams sp;
    k::SsdInputs in;
    ssd_setup(sp, in);
    k::SsdGrads sg{&dxc, &ddt, &dA, &dBc, &dCc, &dD, &ddb, nullptr};
    k::ssd_bwd(sg, in, dyh.view(yh_.shape()), nullptr, sp);
  });
  Tensor dxpre = Tensor::zeros(xc_.shape(), dt), dBpre = Tensor::zeros(Bc_.shape(), dt),
         dCpre = Tensor::zeros(Cc_.shape(), dt);
  timed("bwd/conv1d", [&] {
    ParamMap dsl{{"A_log", dA}, {"D", dD}, {"dt_bias", ddb}};
    for (const char* n : {"conv_wx", "conv_bx", "conv_wB", "conv_bB", "conv_wC", "conv_bC"})
      dsl[n] = Tensor::zeros(sl_.at(n).shape(), dt);
    k::conv1d_bwd(dxpre, dsl["conv_wx"], &dsl["conv_bx"], xpre_.view(xc_.shape()), sl_["conv_wx"], &sl_["conv_bx"], seq,
                  true, dxc);
    k::conv1d_bwd(dBpre, dsl["conv_wB"], &dsl["conv_bB"], Bpre_.view(Bc_.shape()), sl_["conv_wB"], &sl_["conv_bB"], seq,
                  true, dBc);
    k::conv1d_bwd(dCpre, dsl["conv_wC"], &dsl["conv_bC"], Cpre_.view(Cc_.shape()), sl_["conv_wC"], &sl_["conv_bC"], seq,
                  true, dCc);
    cp::add_slice_grads(grads, slices_, dsl);  // the other ranks' slices arrive through the all-reduce
  });
  // hp2cp: the backward of cp2hp (group copies summed back).
  Tensor dzxbcdt = Tensor::zeros({tl_, c_.d_in_proj()}, dt);
  dzxbcdt.slice(1, 0, Di).copy_from(dz);
  timed("bwd/all_to_all", [&] {
    dzxbcdt.slice(1, Di, Di).copy_from(cp::hp2cp(comm_, dxpre.view({T, share_.hl * P}), global_, part_));
    dzxbcdt.slice(1, 2 * Di, G * N)
        .copy_from(cp::sum_groups(cp::hp2cp(comm_, dBpre.view({T, share_.gl * N}), global_, part_), G, N, share_.rep));
    dzxbcdt.slice(1, 2 * Di + G * N, G * N)
        .copy_from(cp::sum_groups(cp::hp2cp(comm_, dCpre.view({T, share_.gl * N}), global_, part_), G, N, share_.rep));
    dzxbcdt.slice(1, 2 * Di + 2 * G * N, H).copy_from(cp::hp2cp(comm_, ddt.view({T, share_.hl}), global_, part_));
  });
  release_saved(xpre_, Bpre_, Cpre_, dt_, xc_, Bc_, Cc_, yh_);
  sl_.clear();
  in_proj_bwd(dh, grads, dzxbcdt, p);
}

// ================================ state passing ==================================================
Mamba2SP::Mamba2SP(Communicator& comm, Mamba2Config cfg, SeqLayout global, cp::Partition part)
    : Mamba2Layer(comm, cfg, std::move(global), part) {
  pieces_ = cp::local_pieces(global_, cp_, rank_, part_);
  // Runs of pieces batched into one call: consecutive pieces, equal lengths, adjacent rows.
  const auto runs_of = [this](bool continuing) {
    std::vector<PieceRun> runs;
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      const cp::Piece& pc = pieces_[i];
      if (continuing && pc.chunk == 0) continue;  // starts its sequence: no incoming state
      if (!runs.empty()) {
        PieceRun& r = runs.back();
        if (r.first + r.count == i && r.len == pc.len && r.row + r.rows() == pc.lrow) {
          ++r.count;
          continue;
        }
      }
      runs.push_back({i, 1, pc.lrow, pc.len});
    }
    return runs;
  };
  runs_ = runs_of(false);
  cont_runs_ = runs_of(true);
  halo_ = cp::ConvHalo(global_, cp_, rank_, part_, c_.conv - 1);
  scan_ = cp::StateScan(global_, cp_, rank_, part_, c_.state_exchange, c_.head_dim * c_.d_state);
}

Mamba2SP::PieceIO Mamba2SP::piece_io(const PieceRun& r, const Tensor& x, const Tensor& dt, const Tensor& B,
                                     const Tensor& C) const {
  const auto n = static_cast<std::int64_t>(r.count);
  PieceIO io;
  io.sp.batch = n;
  io.sp.seqlen = r.len;
  io.sp.heads = c_.heads;
  io.sp.head_dim = c_.head_dim;
  io.sp.groups = c_.groups;
  io.sp.d_state = c_.d_state;
  io.sp.chunk = c_.chunk;
  // Row slices of contiguous [Tl, ...] tensors are contiguous views.
  io.x = x.slice(0, r.row, r.rows()).view({n, r.len, c_.heads, c_.head_dim});
  io.dt = dt.slice(0, r.row, r.rows()).view({n, r.len, c_.heads});
  io.B = B.slice(0, r.row, r.rows()).view({n, r.len, c_.groups, c_.d_state});
  io.C = C.slice(0, r.row, r.rows()).view({n, r.len, c_.groups, c_.d_state});
  return io;
}

kernels::SsdInputs Mamba2SP::inputs(const PieceIO& io, const ParamMap& p, const Tensor* init) const {
  kernels::SsdInputs in;
  in.x = &io.x;
  in.dt = &io.dt;
  in.A_log = &p.at("A_log");
  in.Bm = &io.B;
  in.Cm = &io.C;
  in.D = &p.at("D");
  in.dt_bias = &p.at("dt_bias");
  in.init_states = init;
  return in;
}

void Mamba2SP::forward(Tensor& y, const Tensor& h, const ParamMap& p) {
  SpaceScope space_scope(h.space());  // work tensors live where the inputs do
  const std::int64_t Di = c_.d_inner(), G = c_.groups, N = c_.d_state, H = c_.heads, P = c_.head_dim;
  const std::int64_t CD = c_.conv_dim(), np = static_cast<std::int64_t>(pieces_.size());
  const DType dt = h.dtype();
  in_proj_fwd(h, p);
  // 1. conv1d with the w-1 tokens before each piece (halo) fetched from their owners.
  timed("fwd/halo", [&] { ext_ = halo_.gather(comm_, cp::cols(zxbcdt_, Di, CD)); });
  timed("fwd/conv1d", [&] {
    Tensor conv = Tensor::zeros({1, halo_.ext_rows(), CD}, dt);
    k::conv1d_fwd(conv, ext_.view({1, halo_.ext_rows(), CD}), p.at("conv_w"), &p.at("conv_b"), &halo_.ext_seq(), true);
    Tensor xbc = halo_.own_rows(conv.view({halo_.ext_rows(), CD}));
    xl_ = cp::cols(xbc, 0, Di);
    Bl_ = cp::cols(xbc, Di, G * N);
    Cl_ = cp::cols(xbc, Di + G * N, G * N);
    dtl_ = cp::cols(zxbcdt_, 2 * Di + 2 * G * N, H);
  });
  // 2. every piece from a zero state: local output, final state S_k and total decay a_k.
  Tensor yl = Tensor::zeros({tl_, Di}, dt), S = Tensor::zeros({np, H, P, N}, dt), a = Tensor::zeros({np, H}, dt);
  timed("fwd/ssd", [&] {
    for (const PieceRun& r : runs_) {
      PieceIO io = piece_io(r, xl_, dtl_, Bl_, Cl_);
      const auto i = static_cast<std::int64_t>(r.first), n = static_cast<std::int64_t>(r.count);
      Tensor yi = yl.slice(0, r.row, r.rows()), Si = S.slice(0, i, n), ai = a.slice(0, i, n);
      k::ssd_fwd(yi, &Si, inputs(io, p, nullptr), io.sp);
      k::ssd_run_decay(ai, inputs(io, p, nullptr), io.sp);
    }
  });
  // 3. exchange (S_k, a_k); exclusive scan along each sequence gives every piece's initial state.
  // bf16 states are widened for the exchange and the scan, and rounded once after (as the chunk-start
  // states inside a single-rank bf16 SSD are).
  const DType sdt = cp::state_scan_dtype(dt);
  timed("fwd/state_exchange", [&] { S_in_ = as(scan_.forward(comm_, as(S, sdt), as(a, sdt)), dt); });
  // 4. correct the outputs by the initial-state term.
  timed("fwd/state_correction", [&] {
    for (const PieceRun& r : cont_runs_) {  // a piece that starts its sequence has S_in = 0
      PieceIO io = piece_io(r, xl_, dtl_, Bl_, Cl_);
      Tensor yi = yl.slice(0, r.row, r.rows()),
             Si = S_in_.slice(0, static_cast<std::int64_t>(r.first), static_cast<std::int64_t>(r.count));
      k::ssd_init_state_fwd(yi, inputs(io, p, &Si), io.sp);
    }
  });
  if (keep_carry_) timed("fwd/carry", [&] { make_carry(p); });
  out_fwd(y, yl, p);
}

void Mamba2SP::backward(Tensor& dh, ParamMap& grads, const Tensor& dy, const ParamMap& p) {
  SpaceScope space_scope(dy.space());  // work tensors live where the inputs do
  const std::int64_t Di = c_.d_inner(), G = c_.groups, N = c_.d_state, H = c_.heads, P = c_.head_dim;
  const std::int64_t CD = c_.conv_dim(), np = static_cast<std::int64_t>(pieces_.size());
  const DType dt = h_.dtype();
  Tensor dz;
  Tensor dyl = out_bwd(dz, grads, dy, p);
  Tensor dxl = Tensor::zeros(xl_.shape(), dt), dBl = Tensor::zeros(Bl_.shape(), dt),
         dCl = Tensor::zeros(Cl_.shape(), dt), ddtl = Tensor::zeros(dtl_.shape(), dt);
  // The per-head parameter gradients (A_log, D, dt_bias) are sums over every piece of this rank:
  // each run's part is added to an fp32 sum (bf16 runs), rounded once at the end, not per run.
  const DType adt = acc_dtype(dt);
  Tensor accA = as(grads["A_log"], adt), accD = as(grads["D"], adt), accb = as(grads["dt_bias"], adt);
  const auto add_part = [&](Tensor& acc, const Tensor& part) { k::axpy(acc, 1.0, part); };
  // 4'. the initial-state term: gradients of C, dt, A_log, dt_bias and of each S_in.
  Tensor dSin = Tensor::zeros({np, H, P, N}, dt);
  timed("bwd/state_correction", [&] {
    for (const PieceRun& r : cont_runs_) {
      PieceIO io = piece_io(r, xl_, dtl_, Bl_, Cl_);
      PieceIO gio = piece_io(r, dxl, ddtl, dBl, dCl);
      const auto i = static_cast<std::int64_t>(r.first), n = static_cast<std::int64_t>(r.count);
      Tensor Si = S_in_.slice(0, i, n), dSi = dSin.slice(0, i, n), dyi = dyl.slice(0, r.row, r.rows());
      Tensor tA = Tensor::zeros({H}, adt), tb = Tensor::zeros({H}, adt);
      k::SsdStateGrads sg{&gio.C, &gio.dt, &tA, &tb, &dSi};
      k::ssd_init_state_bwd(sg, inputs(io, p, &Si), &dyi, nullptr, io.sp);
      add_part(accA, tA);
      add_part(accb, tb);
    }
  });
  // 3'. reverse scan: gradient of every piece's final state and decay.
  Tensor dS, da;
  timed("bwd/state_exchange", [&] {
    scan_.backward(comm_, dS, da, as(dSin, cp::state_scan_dtype(dt)));
    dS = as(dS, dt);
    da = as(da, dt);
  });
  // 2'. each piece's zero-state backward with its final-state gradient, plus the decay's gradient.
  timed("bwd/ssd", [&] {
    for (const PieceRun& r : runs_) {
      PieceIO io = piece_io(r, xl_, dtl_, Bl_, Cl_);
      PieceIO gio = piece_io(r, dxl, ddtl, dBl, dCl);
      const auto i = static_cast<std::int64_t>(r.first), n = static_cast<std::int64_t>(r.count);
      Tensor tdt = Tensor::zeros(gio.dt.shape(), dt), tC = Tensor::zeros(gio.C.shape(), dt);
      Tensor tA = Tensor::zeros({H}, adt), tD = Tensor::zeros({H}, adt), tb = Tensor::zeros({H}, adt);
      Tensor dSi = dS.slice(0, i, n), dai = da.slice(0, i, n);
      Tensor dyi = dyl.slice(0, r.row, r.rows()).view({n, r.len, H, P});
      k::SsdGrads sg{&gio.x, &tdt, &tA, &gio.B, &tC, &tD, &tb, nullptr};
      k::ssd_bwd(sg, inputs(io, p, nullptr), dyi, &dSi, io.sp);
      k::axpy(gio.dt, 1.0, tdt);
      k::axpy(gio.C, 1.0, tC);
      add_part(accA, tA);
      add_part(accD, tD);
      add_part(accb, tb);
      // a_k = exp(A sum dt): its gradient adds to dt, A_log and dt_bias (S_in is not needed).
      Tensor zero_state = Tensor::zeros({n, H, P, N}, dt);
      Tensor aA = Tensor::zeros({H}, adt), ab = Tensor::zeros({H}, adt);
      k::SsdStateGrads ag{nullptr, &gio.dt, &aA, &ab, nullptr};
      k::ssd_init_state_bwd(ag, inputs(io, p, &zero_state), nullptr, &dai, io.sp);
      add_part(accA, aA);
      add_part(accb, ab);
    }
  });
  if (adt != dt)  // rounded once into the gradient tensors (fp32/fp64: the sums were made in place)
    for (auto [name, acc] : {std::pair<const char*, Tensor*>{"A_log", &accA}, {"D", &accD}, {"dt_bias", &accb}})
      grads[name].copy_from(acc->to(dt));
  // 1'. conv1d backward over the extended rows; halo gradients go back to their owners.
  Tensor dzxbcdt = Tensor::zeros({tl_, c_.d_in_proj()}, dt), dext_rows;
  timed("bwd/conv1d", [&] {
    Tensor dxbc = Tensor::zeros({tl_, CD}, dt);
    dxbc.slice(1, 0, Di).copy_from(dxl);
    dxbc.slice(1, Di, G * N).copy_from(dBl);
    dxbc.slice(1, Di + G * N, G * N).copy_from(dCl);
    const std::int64_t E = halo_.ext_rows();
    Tensor dext = Tensor::zeros({1, E, CD}, dt);
    k::conv1d_bwd(dext, grads["conv_w"], &grads["conv_b"], ext_.view({1, E, CD}), p.at("conv_w"), &p.at("conv_b"),
                  &halo_.ext_seq(), true, halo_.expand(dxbc).view({1, E, CD}));
    dext_rows = dext.view({E, CD});
  });
  timed("bwd/halo", [&] { dzxbcdt.slice(1, Di, CD).copy_from(halo_.scatter_back(comm_, dext_rows)); });
  dzxbcdt.slice(1, 0, Di).copy_from(dz);
  dzxbcdt.slice(1, 2 * Di + 2 * G * N, H).copy_from(ddtl);
  release_saved(ext_, xl_, Bl_, Cl_, dtl_, S_in_);
  in_proj_bwd(dh, grads, dzxbcdt, p);
}

// The forward's all-to-alls of x, z, B, C (B, C repeated when n_groups < cp) and dt: (cp-1)/cp of each.
std::int64_t hidden_parallel_model_fwd_bytes(const Mamba2Config& c, const SeqLayout& global, int cp, int /*rank*/,
                                             DType dt, cp::Partition /*part*/) {
  const std::int64_t Tl = global.total() / cp, G = c.groups, es = static_cast<std::int64_t>(dtype_size(dt));
  const std::int64_t per_tok = 2 * c.d_inner() + 2 * G * c.group_repeat(cp) * c.d_state + c.heads;
  return (cp - 1) * Tl * per_tok / cp * es;
}
// Forward and backward: the same all-to-alls there and back.
std::int64_t hidden_parallel_model_bytes(const Mamba2Config& c, const SeqLayout& global, int cp, int rank, DType dt,
                                         cp::Partition part) {
  return 2 * hidden_parallel_model_fwd_bytes(c, global, cp, rank, dt, part);
}

// The chunks' final states by the state scan, and the conv halo rows.
std::int64_t state_passing_model_bytes(const Mamba2Config& c, const SeqLayout& global, int cp, int rank, DType dt,
                                       cp::Partition part) {
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(dt));
  const auto ss = static_cast<std::int64_t>(dtype_size(cp::state_scan_dtype(dt)));
  const std::int64_t halo = cp::model_halo_rows_sent(global, cp, part, c.conv - 1, rank) * c.conv_dim() * es;
  return cp::model_state_elements_sent(global, cp, rank, part, c.state_exchange, c.heads, c.head_dim * c.d_state) * ss +
         halo;
}
// The forward's part: the halo rows it gathers and the forward state scan.
std::int64_t state_passing_model_fwd_bytes(const Mamba2Config& c, const SeqLayout& global, int cp, int rank, DType dt,
                                           cp::Partition part) {
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(dt));
  const auto ss = static_cast<std::int64_t>(dtype_size(cp::state_scan_dtype(dt)));
  const std::int64_t halo = cp::model_halo_rows_sent(global, cp, part, c.conv - 1, rank, true) * c.conv_dim() * es;
  return cp::model_state_elements_sent(global, cp, rank, part, c.state_exchange, c.heads, c.head_dim * c.d_state,
                                       true) *
             ss +
         halo;
}

std::int64_t mamba_cp_model_bytes(MambaCp strategy, const Mamba2Config& c, const SeqLayout& global, int cp, int rank,
                                  DType dt, cp::Partition part, bool forward_only) {
  const MambaCpInfo& s = mamba_cp_info(strategy);
  return (forward_only ? s.model_fwd_bytes : s.model_bytes)(c, global, cp, rank, dt, part);
}

std::unique_ptr<Mamba2Layer> make_hidden_parallel(Communicator& comm, Mamba2Config cfg, SeqLayout global,
                                                  cp::Partition part) {
  return std::make_unique<Mamba2HP>(comm, cfg, std::move(global), part);
}
std::unique_ptr<Mamba2Layer> make_state_passing(Communicator& comm, Mamba2Config cfg, SeqLayout global,
                                                cp::Partition part) {
  return std::make_unique<Mamba2SP>(comm, cfg, std::move(global), part);
}

std::unique_ptr<Mamba2Layer> make_mamba2(MambaCp strategy, Communicator& comm, Mamba2Config cfg, SeqLayout global,
                                         cp::Partition part) {
  return mamba_cp_info(strategy).make(comm, std::move(cfg), std::move(global), part);
}

std::unique_ptr<Mamba2Layer> make_mamba2(MambaCp strategy, Communicator& comm, Mamba2Config cfg,
                                         const cp::Placement& placement) {
  if (placement.by_documents()) return std::make_unique<Mamba2Docs>(strategy, comm, std::move(cfg), placement);
  return make_mamba2(strategy, comm, std::move(cfg), placement.global);
}

}  // namespace hcp::model
