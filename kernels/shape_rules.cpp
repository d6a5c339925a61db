#include "kernels/shape_rules.hpp"

#include "kernels/host/common.hpp"

namespace hcp::kernels::rules {

Shapes check_attn(const Tensor& q, const Tensor& k, const Tensor& v, const AttnParams& p) {
  HCP_CHECK(p.heads > 0 && p.kv_heads > 0 && p.head_dim > 0, "attention: heads, kv_heads, head_dim must be > 0");
  HCP_CHECK(p.heads % p.kv_heads == 0, "attention: heads (", p.heads, ") must be divisible by kv_heads (", p.kv_heads,
            ")");
  HCP_CHECK(q.numel() % (p.heads * p.head_dim) == 0, "attention: q shape ", shape_str(q.shape()),
            " is not [T, heads=", p.heads, ", head_dim=", p.head_dim, "]");
  HCP_CHECK(k.numel() % (p.kv_heads * p.head_dim) == 0 && k.numel() == v.numel(), "attention: k ", shape_str(k.shape()),
            " / v ", shape_str(v.shape()), " are not [T, kv_heads=", p.kv_heads, ", head_dim=", p.head_dim, "]");
  HCP_CHECK(p.kv_tile > 0, "attention: kv_tile must be > 0");
  Shapes s{q.numel() / (p.heads * p.head_dim), k.numel() / (p.kv_heads * p.head_dim), p.heads, p.kv_heads, p.head_dim};
  std::vector<char> used(static_cast<std::size_t>(s.tq), 0);
  for (const auto& g : p.segments) {
    HCP_CHECK(g.q_start >= 0 && g.q_len >= 0 && g.q_start + g.q_len <= s.tq, "attention: segment q rows [", g.q_start,
              ", ", g.q_start + g.q_len, ") outside the ", s.tq, " query rows");
    HCP_CHECK(g.kv_start >= 0 && g.kv_len >= 0 && g.kv_start + g.kv_len <= s.tkv, "attention: segment kv rows [",
              g.kv_start, ", ", g.kv_start + g.kv_len, ") outside the ", s.tkv, " key rows");
    for (std::int64_t i = g.q_start; i < g.q_start + g.q_len; ++i) {
      HCP_CHECK(!used[static_cast<std::size_t>(i)], "attention: query row ", i, " belongs to two segments");
      used[static_cast<std::size_t>(i)] = 1;
    }
  }
  return s;
}

ConvShape check_conv(const Tensor& x, const Tensor& w, const Tensor* bias, const std::vector<std::int64_t>* seq) {
  HCP_CHECK(x.dim() == 3, "conv1d: x must be [B,L,C], got ", shape_str(x.shape()));
  HCP_CHECK(w.dim() == 2 && w.size(0) == x.size(2), "conv1d: weight must be [C=", x.size(2), ", W], got ",
            shape_str(w.shape()));
  HCP_CHECK(w.size(1) >= 1 && w.size(1) <= kMaxConvWidth, "conv1d: width ", w.size(1), " outside [1, ", kMaxConvWidth,
            "]");
  if (bias) require_numel(*bias, x.size(2), "conv1d: bias [C]");
  if (seq)
    HCP_CHECK(static_cast<std::int64_t>(seq->size()) == x.size(0) * x.size(1), "conv1d: seq_idx has ", seq->size(),
              " entries, expected B*L = ", x.size(0) * x.size(1));
  return {x.size(0), x.size(1), x.size(2), w.size(1)};
}

void check_ce(const Tensor& logits, const std::vector<std::int64_t>& labels, std::int64_t ignore) {
  HCP_CHECK(logits.dim() == 2, "cross_entropy: logits must be [T,V], got ", shape_str(logits.shape()));
  HCP_CHECK(static_cast<std::int64_t>(labels.size()) == logits.size(0), "cross_entropy: ", labels.size(),
            " labels for ", logits.size(0), " rows");
  for (auto l : labels)
    HCP_CHECK(l == ignore || (l >= 0 && l < logits.size(1)), "cross_entropy: label ", l, " outside [0, ",
              logits.size(1), ") and not the ignore label ", ignore);
}

void check_router(const RouterParams& p) {
  HCP_CHECK(p.experts > 0 && p.topk > 0 && p.topk <= p.experts, "moe: topk (", p.topk,
            ") must be in [1, experts=", p.experts, "]");
  HCP_CHECK(p.n_group > 0 && p.experts % p.n_group == 0, "moe: n_group (", p.n_group, ") must divide experts (",
            p.experts, ")");
  HCP_CHECK(p.topk_group > 0 && p.topk_group <= p.n_group, "moe: topk_group (", p.topk_group,
            ") must be in [1, n_group=", p.n_group, "]");
  HCP_CHECK(p.topk <= p.topk_group * (p.experts / p.n_group), "moe: topk (", p.topk,
            ") exceeds the experts in the selected groups");
}

std::int64_t permuted_rows(const MoeRouting& r, const char* what) {
  HCP_CHECK(r.src.defined() && r.inv.defined(), what, ": the routing has no permutation (moe_permute first)");
  return r.src.numel();
}

std::vector<double> assignment_shares(const MoeRouting& route, const RouterParams& p, std::int64_t tokens) {
  HCP_CHECK(tokens > 0 && static_cast<std::int64_t>(route.counts.size()) == p.experts && route.idx.defined() &&
                route.idx.numel() == tokens * p.topk,
            "moe_aux_loss: the routing does not match scores of ", tokens, " tokens and ", p.experts, " experts");
  std::vector<double> f(route.counts.begin(), route.counts.end());
  for (auto& v : f) v /= static_cast<double>(tokens * p.topk);
  return f;
}

MlpShape check_mlp(const Tensor& xp, const Tensor& W1, const Tensor& W2, const std::vector<std::int64_t>& counts,
                   Activation act) {
  HCP_CHECK(W1.dim() == 3 && W2.dim() == 3, "expert_mlp: W1 must be [E,F1,C] and W2 [E,C,F]");
  MlpShape s;
  s.E = W1.size(0);
  s.F1 = W1.size(1);
  s.C = W1.size(2);
  s.F = act == Activation::SwiGLU ? s.F1 / 2 : s.F1;
  HCP_CHECK(act != Activation::SwiGLU || s.F1 % 2 == 0, "expert_mlp: SwiGLU needs an even W1 row count");
  HCP_CHECK(W2.size(0) == s.E && W2.size(1) == s.C && W2.size(2) == s.F, "expert_mlp: W2 ", shape_str(W2.shape()),
            " does not match [E=", s.E, ", C=", s.C, ", F=", s.F, "]");
  HCP_CHECK(static_cast<std::int64_t>(counts.size()) == s.E, "expert_mlp: ", counts.size(), " counts for ", s.E,
            " experts");
  s.off.assign(static_cast<std::size_t>(s.E + 1), 0);
  for (std::int64_t e = 0; e < s.E; ++e)
    s.off[static_cast<std::size_t>(e + 1)] = s.off[static_cast<std::size_t>(e)] + counts[static_cast<std::size_t>(e)];
  s.rows = s.off.back();
  require_numel(xp, s.rows * s.C, "expert_mlp: xp [rows,C]");
  return s;
}

void check_ssd(const SsdInputs& in, const SsdParams& p) {
  HCP_CHECK(in.x && in.dt && in.A_log && in.Bm && in.Cm, "ssd: x, dt, A_log, B and C are required");
  HCP_CHECK(p.batch > 0 && p.seqlen > 0 && p.heads > 0 && p.head_dim > 0 && p.groups > 0 && p.d_state > 0,
            "ssd: sizes must be positive");
  HCP_CHECK(p.heads % p.groups == 0, "ssd: n_groups (", p.groups, ") must divide heads (", p.heads, ")");
  HCP_CHECK(p.chunk > 0, "ssd: chunk size must be > 0, got ", p.chunk);
  const std::int64_t BL = p.batch * p.seqlen;
  require_numel(*in.x, BL * p.heads * p.head_dim, "ssd: x [B,L,H,P]");
  require_numel(*in.dt, BL * p.heads, "ssd: dt [B,L,H]");
  require_numel(*in.A_log, p.heads, "ssd: A_log [H]");
  require_numel(*in.Bm, BL * p.groups * p.d_state, "ssd: B [B,L,G,N]");
  require_numel(*in.Cm, BL * p.groups * p.d_state, "ssd: C [B,L,G,N]");
  if (in.D) require_numel(*in.D, p.heads, "ssd: D [H]");
  if (in.dt_bias) require_numel(*in.dt_bias, p.heads, "ssd: dt_bias [H]");
  if (in.init_states)
    require_numel(*in.init_states, p.batch * p.heads * p.head_dim * p.d_state, "ssd: initial states [B,H,P,N]");
  if (in.seq_idx) {
    HCP_CHECK(static_cast<std::int64_t>(in.seq_idx->size()) == BL, "ssd: seq_idx has ", in.seq_idx->size(),
              " entries, expected B*L = ", BL);
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t t = 1; t < p.seqlen; ++t)
        HCP_CHECK((*in.seq_idx)[b * p.seqlen + t] >= (*in.seq_idx)[b * p.seqlen + t - 1],
                  "ssd: seq_idx must be non-decreasing along each row");
  }
}

void check_state_scan(const Tensor& S, const Tensor& a, const Tensor& Sin, const std::vector<std::int64_t>& order,
                      const std::vector<std::int64_t>& off, const char* what) {
  HCP_CHECK(
      S.dim() == 4 && a.dim() == 2 && a.size(0) == S.size(0) && a.size(1) == S.size(1) && Sin.shape() == S.shape(),
      what, ": need S, Sin [slots,H,P,N] and a [slots,H], got ", shape_str(S.shape()), ", ", shape_str(Sin.shape()),
      ", ", shape_str(a.shape()));
  HCP_CHECK(S.dtype() == a.dtype() && S.dtype() == Sin.dtype() && S.space() == a.space() && S.space() == Sin.space(),
            what, ": tensors must share dtype and memory space");
  HCP_CHECK(!off.empty() && off.front() == 0 && off.back() == static_cast<std::int64_t>(order.size()), what,
            ": offsets must run from 0 to the number of slots named");
  for (std::int64_t o : order)
    HCP_CHECK(o >= 0 && o < S.size(0), what, ": slot ", o, " out of range [0, ", S.size(0), ")");
}

void check_compose(const Tensor& A, const Tensor& B, const Tensor& A_prev, const Tensor& B_prev, const char* what) {
  HCP_CHECK(B.dim() == 4 && A.dim() == 2 && A.size(0) == B.size(0) && A.size(1) == B.size(1) &&
                B_prev.shape() == B.shape() && A_prev.shape() == A.shape(),
            what, ": need B, B_prev [rows,H,P,N] and A, A_prev [rows,H], got ", shape_str(B.shape()), ", ",
            shape_str(B_prev.shape()), ", ", shape_str(A.shape()), ", ", shape_str(A_prev.shape()));
  for (const Tensor* t : {&A, &A_prev, &B_prev})
    HCP_CHECK(t->dtype() == B.dtype() && t->space() == B.space(), what, ": tensors must share dtype and memory space");
  HCP_CHECK(B.dtype() == DType::F64 || B.dtype() == DType::F32, what, ": states must be fp32 or fp64");
}

}  // namespace hcp::kernels::rules
