#include "model/decode.hpp"

#include <algorithm>
#include <numeric>

#include "core/error.hpp"
#include "cp/hidden_parallel.hpp"
#include "cp/layout.hpp"
#include "kernels/kernels.hpp"

namespace hcp::model {
namespace k = hcp::kernels;

namespace {
std::int64_t nbytes(const Tensor& t) {
  return t.defined() ? t.numel() * static_cast<std::int64_t>(dtype_size(t.dtype())) : 0;
}
// The sequence of each unpadded row index (cu_seqlens of the unpadded layout).
std::int64_t seq_of(const std::vector<std::int64_t>& cu, std::int64_t row) {
  return std::upper_bound(cu.begin(), cu.end(), row) - cu.begin() - 1;
}
// The append rule: the rank with the fewest cached tokens of sequence s, the lowest on a tie.
int fewest(const std::vector<std::vector<std::int64_t>>& n, std::int64_t s) {
  int best = 0;
  for (std::size_t r = 1; r < n.size(); ++r)
    if (n[r][static_cast<std::size_t>(s)] < n[static_cast<std::size_t>(best)][static_cast<std::size_t>(s)])
      best = static_cast<int>(r);
  return best;
}
}  // namespace

std::int64_t KvShard::bytes() const { return nbytes(k) + nbytes(v); }

template <class F>
void HybridDecoder::timed(const std::string& name, F&& f) {
  phases_.time(name, default_space(), f);
}

HybridDecoder::HybridDecoder(HybridModel& m, std::int64_t steps) : m_(m), comm_(m.comm_) {
  HCP_CHECK(steps >= 0, "decode: steps must be >= 0, got ", steps);
  const cp::Placement& pl = m.placement_;
  HCP_CHECK(!pl.by_documents(), "generation prefills on a DualChunkSwap placement only (data.partition = \"dcs\")");
  const SeqLayout real = pl.global.unpadded();
  const std::vector<std::int64_t>& cu = real.cu_seqlens;
  nseq_ = real.nseq();
  for (std::int64_t s = 0; s < nseq_; ++s) {
    HCP_CHECK(real.len(s) > 0, "decode: sequence ", s, " has no prompt token");
    len_.push_back(real.len(s));
  }
  const int cp = comm_.size(), me = comm_.rank();
  kv_n_.assign(static_cast<std::size_t>(cp), std::vector<std::int64_t>(static_cast<std::size_t>(nseq_), 0));
  std::vector<std::int64_t> my_seq;  // the sequence of each of my local rows (-1: a pad)
  for (int r = 0; r < cp; ++r)
    for (std::int64_t ri : pl.real_index(r)) {
      const std::int64_t s = ri < 0 ? -1 : seq_of(cu, ri);
      if (s >= 0) ++kv_n_[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)];
      if (r == me) my_seq.push_back(s);
    }
  // Each sequence's room on this rank: the rule applied to `steps` appends ahead of time.
  std::vector<std::vector<std::int64_t>> after = kv_n_;
  for (std::int64_t t = 0; t < steps; ++t)
    for (std::int64_t s = 0; s < nseq_; ++s)
      ++after[static_cast<std::size_t>(fewest(after, s))][static_cast<std::size_t>(s)];
  for (HybridModel::Block& b : m.blocks_) {
    Layer l;
    l.kind = b.kind;
    l.prefix = b.prefix;
    if (b.mamba) {
      l.carry = b.mamba->carry();
      HCP_CHECK(l.carry.state.defined(), "decode: the model's last forward was not a prefill (keep_handoff)");
    }
    if (b.attn) {
      l.attn = b.attn->config();
      const Tensor& kl = b.attn->k_local();
      HCP_CHECK(kl.defined(), "decode: the model's last forward was not a prefill (keep_handoff)");
      KvShard& kv = l.kv;
      std::int64_t rows = 0;
      for (std::int64_t s = 0; s < nseq_; ++s) {
        kv.base.push_back(rows);
        kv.count.push_back(kv_n_[static_cast<std::size_t>(me)][static_cast<std::size_t>(s)]);
        kv.cap.push_back(after[static_cast<std::size_t>(me)][static_cast<std::size_t>(s)]);
        rows += kv.cap.back();
      }
      const std::int64_t HkD = l.attn.kv_heads * l.attn.head_dim;
      kv.k = Tensor::zeros({std::max<std::int64_t>(rows, 1), l.attn.kv_heads, l.attn.head_dim}, kl.dtype(), kl.space());
      kv.v = Tensor::zeros(kv.k.shape(), kl.dtype(), kl.space());
      std::vector<std::int64_t> dst, src, fill(static_cast<std::size_t>(nseq_), 0);
      for (std::size_t i = 0; i < my_seq.size(); ++i) {
        const std::int64_t s = my_seq[i];
        if (s < 0) continue;
        dst.push_back(kv.base[static_cast<std::size_t>(s)] + fill[static_cast<std::size_t>(s)]++);
        src.push_back(static_cast<std::int64_t>(i));
      }
      if (!dst.empty()) {
        Tensor kf = kv.k.view({-1, HkD}), vf = kv.v.view({-1, HkD});
        cp::copy_rows(kf, kl.view({-1, HkD}), dst, src);
        cp::copy_rows(vf, b.attn->v_local().view({-1, HkD}), dst, src);
      }
      b.attn->keep_kv(false);  // one layer's shard twice at a time, not every layer's
    }
    layers_.push_back(std::move(l));
  }
  m.keep_handoff(false);  // the layers drop their copies; the decoder holds the hand-off now
}

int HybridDecoder::kv_owner(std::int64_t s) const { return fewest(kv_n_, s); }

std::int64_t HybridDecoder::mamba_bytes() const {
  std::int64_t b = 0;
  for (const Layer& l : layers_) b += l.carry.bytes();
  return b;
}

std::int64_t HybridDecoder::kv_bytes() const {
  std::int64_t b = 0;
  for (const Layer& l : layers_) b += l.kv.bytes();
  return b;
}

std::vector<std::int64_t> HybridDecoder::kv_rows_per_rank() const {
  std::vector<std::int64_t> out;
  for (const auto& per_seq : kv_n_) out.push_back(std::accumulate(per_seq.begin(), per_seq.end(), std::int64_t{0}));
  return out;
}

Tensor HybridDecoder::step(const ParamMap& p, const std::vector<std::int64_t>& ids) {
  SpaceScope space_scope(p.at("embed").space());
  const HybridConfig& c = m_.c_;
  HCP_CHECK(static_cast<std::int64_t>(ids.size()) == nseq_, "decode: need one token per sequence (", nseq_, "), got ",
            ids.size());
  for (auto t : ids)
    HCP_CHECK(t >= 0 && t < c.vocab, "decode: token id ", t, " outside [0, model.vocab = ", c.vocab, ")");
  const DType dt = p.at("embed").dtype();
  const std::int64_t B = nseq_, C = c.hidden;
  std::vector<int> owner(static_cast<std::size_t>(B));
  for (std::int64_t s = 0; s < B; ++s) {
    owner[static_cast<std::size_t>(s)] = kv_owner(s);
    ++kv_n_[static_cast<std::size_t>(owner[static_cast<std::size_t>(s)])][static_cast<std::size_t>(s)];
  }
  Tensor h = Tensor::zeros({B, C}, dt);
  timed("decode/embed", [&] { k::embedding_fwd(h, p.at("embed"), ids); });
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    HybridModel::Block& b = m_.blocks_[i];
    timed(std::string("decode/") + l.kind, [&] {
      Tensor n = Tensor::zeros({B, C}, dt), rstd = Tensor::zeros({B}, dt), y = Tensor::zeros({B, C}, dt);
      k::rmsnorm_fwd(n, rstd, h, p.at(l.prefix + "norm"), c.eps);
      const ParamMap sp = block_params(p, l.prefix);
      if (l.kind == 'M') mamba_step(y, n, sp, l.carry);
      if (l.kind == '*') attention_step(y, n, sp, l, owner);
      if (l.kind == 'E') moe_step(y, n, sp, *b.moe);
      if (l.kind == '-') b.mlp->forward(y, n, sp);
      Tensor hn = Tensor::zeros({B, C}, dt);
      k::add(hn, h, y);
      h = hn;
    });
  }
  Tensor logits = Tensor::zeros({B, c.vocab}, dt);
  timed("decode/head", [&] {
    Tensor n = Tensor::zeros({B, C}, dt), rstd = Tensor::zeros({B}, dt);
    k::rmsnorm_fwd(n, rstd, h, p.at("final_norm"), c.eps);
    k::linear_fwd(logits, n, p.at("lm_head"), nullptr);
  });
  for (auto& n : len_) ++n;
  return logits;
}

void HybridDecoder::mamba_step(Tensor& y, const Tensor& x, const ParamMap& p, MambaCarry& c) {
  const Mamba2Config& mc = m_.c_.mamba;
  const std::int64_t Di = mc.d_inner(), G = mc.groups, N = mc.d_state, P = mc.head_dim, B = nseq_;
  const std::int64_t hl = c.share.hl, gl = c.share.gl, ns = static_cast<std::int64_t>(c.seqs.size());
  const DType dt = x.dtype();
  Tensor zx = Tensor::zeros({B, mc.d_in_proj()}, dt);
  k::linear_fwd(zx, x, p.at("in_proj"), nullptr);
  Tensor yfull = Tensor::zeros({B, Di}, dt);
  if (ns > 0) {
    const Tensor rows = ns == B ? zx : cp::take_rows(zx, c.seqs);
    const Tensor xpre = cp::cols(rows, Di + c.share.h0 * P, hl * P),
                 Bpre = cp::cols(rows, 2 * Di + c.share.g0 * N, gl * N),
                 Cpre = cp::cols(rows, 2 * Di + G * N + c.share.g0 * N, gl * N),
                 dtr = cp::cols(rows, 2 * Di + 2 * G * N + c.share.h0, hl);
    std::map<std::string, Tensor> sl = cp::take_slices(cp::hp_slices(c.share, Di, G, N, P), p);
    Tensor xc = Tensor::zeros({ns, hl * P}, dt), Bc = Tensor::zeros({ns, gl * N}, dt),
           Cc = Tensor::zeros({ns, gl * N}, dt);
    k::conv1d_step(xc, c.wx, xpre, sl.at("conv_wx"), &sl.at("conv_bx"), true);
    k::conv1d_step(Bc, c.wB, Bpre, sl.at("conv_wB"), &sl.at("conv_bB"), true);
    k::conv1d_step(Cc, c.wC, Cpre, sl.at("conv_wC"), &sl.at("conv_bC"), true);
    k::SsdParams sp;
    sp.batch = ns;
    sp.seqlen = 1;
    sp.heads = hl;
    sp.head_dim = P;
    sp.groups = gl;
    sp.d_state = N;
    sp.chunk = mc.chunk;
    const Tensor x4 = xc.view({ns, 1, hl, P}), d3 = dtr.view({ns, 1, hl}), B4 = Bc.view({ns, 1, gl, N}),
                 C4 = Cc.view({ns, 1, gl, N});
    k::SsdInputs in;
    in.x = &x4;
    in.dt = &d3;
    in.A_log = &sl.at("A_log");
    in.Bm = &B4;
    in.Cm = &C4;
    in.D = &sl.at("D");
    in.dt_bias = &sl.at("dt_bias");
    Tensor yh = Tensor::zeros({ns, hl * P}, dt);
    k::ssd_step(yh, c.state, in, sp);
    Tensor part = yh;
    if (ns != B) {
      part = Tensor::zeros({B, hl * P}, dt);
      std::vector<std::int64_t> src(static_cast<std::size_t>(ns));
      std::iota(src.begin(), src.end(), std::int64_t{0});
      cp::copy_rows(part, yh, c.seqs, src);
    }
    Tensor cols = yfull.slice(1, c.share.h0 * P, hl * P);
    cols.copy_from(part);
  }
  comm_.all_reduce(yfull);  // one rank holds each (sequence, head): the sum is that value exactly
  Tensor g = Tensor::zeros({B, Di}, dt), rstd = Tensor::zeros({B, G}, dt);
  k::gated_rmsnorm_fwd(g, rstd, yfull, cp::cols(zx, 0, Di), p.at("norm_w"), G, mc.eps);
  k::linear_fwd(y, g, p.at("out_proj"), nullptr);
}

void HybridDecoder::attention_step(Tensor& y, const Tensor& x, const ParamMap& p, Layer& l,
                                   const std::vector<int>& owner) {
  const AttnLayerConfig& a = l.attn;
  const std::int64_t H = a.heads, Hk = a.kv_heads, D = a.head_dim, B = nseq_;
  const DType dt = x.dtype(), adt = acc_dtype(dt);
  const int cp = comm_.size(), me = comm_.rank();
  Tensor q = Tensor::zeros({B, H * D}, dt), kk = Tensor::zeros({B, Hk * D}, dt), vv = Tensor::zeros({B, Hk * D}, dt);
  k::linear_fwd(q, x, p.at("Wq"), nullptr);
  k::linear_fwd(kk, x, p.at("Wk"), nullptr);
  k::linear_fwd(vv, x, p.at("Wv"), nullptr);
  if (a.rope_theta > 0) {  // the new token sits at position len_[s] of its sequence
    Tensor qr = Tensor::zeros({B, H, D}, dt), kr = Tensor::zeros({B, Hk, D}, dt);
    k::rope_fwd(qr, q.view({B, H, D}), len_, a.rope_theta, D);
    k::rope_fwd(kr, kk.view({B, Hk, D}), len_, a.rope_theta, D);
    q = qr.view({B, H * D});
    kk = kr.view({B, Hk * D});
  }
  KvShard& kv = l.kv;
  std::vector<std::int64_t> dst, src;
  for (std::int64_t s = 0; s < B; ++s) {
    if (owner[static_cast<std::size_t>(s)] != me) continue;
    const auto si = static_cast<std::size_t>(s);
    HCP_CHECK(kv.count[si] < kv.cap[si], "decode: more steps than the decoder was made for");
    dst.push_back(kv.base[si] + kv.count[si]++);
    src.push_back(s);
  }
  if (!dst.empty()) {
    Tensor kf = kv.k.view({-1, Hk * D}), vf = kv.v.view({-1, Hk * D});
    cp::copy_rows(kf, kk, dst, src);
    cp::copy_rows(vf, vv, dst, src);
  }
  k::AttnParams ap;
  ap.heads = H;
  ap.kv_heads = Hk;
  ap.head_dim = D;
  ap.mask = k::Mask::None;  // the cache holds only this token and the ones before it
  for (std::int64_t s = 0; s < B; ++s) {
    const auto si = static_cast<std::size_t>(s);
    if (kv.count[si] > 0) ap.segments.push_back({s, 1, kv.base[si], kv.count[si], 0, 0});
  }
  Tensor o = Tensor::zeros({B, H, D}, dt), lse = Tensor::zeros({B, H}, adt);
  k::attention_fwd(o, lse, q.view({B, H, D}), kv.k, kv.v, ap);
  // Every rank's partial output and log-sum-exp, merged in rank order (the same bits everywhere).
  Tensor og = Tensor::zeros({cp, B, H, D}, dt), lg = Tensor::zeros({cp, B, H}, adt);
  comm_.all_gather(o, og);
  comm_.all_gather(lse, lg);
  Tensor acc = og.slice(0, 0, 1).view({B, H, D}).to(adt), lacc = lg.slice(0, 0, 1).view({B, H}).clone();
  for (int r = 1; r < cp; ++r)
    k::attention_merge(acc, lacc, og.slice(0, r, 1).view({B, H, D}), lg.slice(0, r, 1).view({B, H}));
  k::linear_fwd(y, acc.to(dt).view({B, H * D}), p.at("Wo"), nullptr);
}

void HybridDecoder::moe_step(Tensor& y, const Tensor& x, const ParamMap& p, MoeLayer& moe) {
  const std::int64_t B = nseq_, C = m_.c_.hidden;
  const int cp = comm_.size(), me = comm_.rank();
  const std::int64_t b0 = B * me / cp, n = B * (me + 1) / cp - b0;  // this rank's share of the tokens
  Tensor xs = x.slice(0, b0, n).clone(), ys = Tensor::zeros({n, C}, x.dtype());
  moe.forward(ys, xs, p);  // expert-parallel over the layer's groups, like the prefill
  Tensor full = Tensor::zeros({B, C}, x.dtype());
  if (n > 0) {
    Tensor mine = full.slice(0, b0, n);
    mine.copy_from(ys);
  }
  comm_.all_reduce(full);  // disjoint rows: the sum is each row exactly
  y.copy_from(full);
}

}  // namespace hcp::model
