// MoE on the host: router (sigmoid/softmax, correction bias for selection, group-limited top-k,
// renormalisation, routed scaling), load-balancing loss, permute/combine, grouped expert MLPs; the
// routing's index tensors (MoeRouting) and their host views.
#include <algorithm>
#include <numeric>
#include <optional>
#include <vector>

#include "kernels/host/common.hpp"
#include "kernels/host/gemm.hpp"
#include "kernels/host/host_kernels.hpp"
#include "kernels/kernels.hpp"
#include "kernels/shape_rules.hpp"

namespace hcp::kernels {
using rules::assignment_shares;
using rules::check_mlp;
using rules::MlpShape;
using rules::permuted_rows;
namespace {
using host::In;
using host::Out;
using host::Range;

// Descending by value, ties to the lower index: a strict, deterministic order.
template <class T>
bool before(T a, std::int64_t ia, T b, std::int64_t ib) {
  return a > b || (a == b && ia < ib);
}

// The integers an F64 index tensor holds, on the host.
std::vector<std::int64_t> ids(const Tensor& t) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(t.defined() ? t.numel() : 0));
  if (v.empty()) return v;
  const Tensor h = t.space() == Space::Host ? t : t.to(Space::Host);
  const double* d = static_cast<const double*>(h.raw());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>(d[i]);
  return v;
}
// An index tensor (F64) in space sp from integers.
Tensor id_tensor(const std::vector<std::int64_t>& v, Space sp) {
  Tensor t = Tensor::from(std::vector<double>(v.begin(), v.end()), {static_cast<std::int64_t>(v.size())}, DType::F64);
  return sp == Space::Host ? t : t.to(sp);
}
std::vector<std::int64_t> expert_counts(const std::vector<std::int64_t>& idx, std::int64_t experts) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(experts), 0);
  for (auto e : idx) {
    HCP_CHECK(e >= 0 && e < experts, "moe: expert index ", e, " outside [0, ", experts, ")");
    counts[static_cast<std::size_t>(e)]++;
  }
  return counts;
}
}  // namespace

std::vector<std::int64_t> MoeRouting::indices() const { return ids(idx); }
std::vector<std::int64_t> MoeRouting::sources() const { return ids(src); }

MoeRouting moe_routing(const std::vector<std::int64_t>& topk_idx, std::int64_t topk, std::int64_t experts, Space sp) {
  HCP_CHECK(topk >= 1 && static_cast<std::int64_t>(topk_idx.size()) % topk == 0, "moe_routing: ", topk_idx.size(),
            " indices are not a whole number of tokens of ", topk);
  MoeRouting r;
  r.topk = topk;
  r.counts = expert_counts(topk_idx, experts);
  r.idx = id_tensor(topk_idx, sp);
  return r;
}

void host::router_fwd(Tensor& scores, MoeRouting& route, Tensor& topk_w, const Tensor& logits, const Tensor* bias,
                      const RouterParams& p) {
  const std::int64_t Tn = logits.size(0), E = p.experts, K = p.topk, gs = E / p.n_group;
  std::vector<std::int64_t> topk_idx(static_cast<std::size_t>(Tn * K), 0);
  HCP_DISPATCH_FLOAT(logits, {
    In<T> l_(logits, "logits");
    std::optional<In<T>> b_;
    if (bias) b_.emplace(*bias, "bias");
    Out<T> s_(scores, "scores"), w_(topk_w, "topk_w");
    const T* lb = l_.get();
    const T* bb = b_ ? b_->get() : nullptr;
    T* sb = s_.get();
    T* wb = w_.get();
    Kokkos::parallel_for("router_fwd", Range(0, Tn), [&](std::int64_t t) {
      const T* lr = lb + t * E;
      T* sr = sb + t * E;
      if (p.sigmoid) {
        for (std::int64_t e = 0; e < E; ++e) sr[e] = host::sigmoid(lr[e]);
      } else {
        T mx = *std::max_element(lr, lr + E), s = 0;
        for (std::int64_t e = 0; e < E; ++e) s += (sr[e] = std::exp(lr[e] - mx));
        for (std::int64_t e = 0; e < E; ++e) sr[e] /= s;
      }
      std::vector<T> sel(static_cast<std::size_t>(E));
      for (std::int64_t e = 0; e < E; ++e) sel[static_cast<std::size_t>(e)] = sr[e] + (bb ? bb[e] : T(0));
      // Group-limited: keep the topk_group groups with the largest sum of their top-2 selection scores.
      std::vector<char> allowed(static_cast<std::size_t>(E), 1);
      if (p.n_group > 1) {
        std::vector<T> gscore(static_cast<std::size_t>(p.n_group));
        for (std::int64_t g = 0; g < p.n_group; ++g) {
          std::vector<T> v(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
          std::sort(v.begin(), v.end(), std::greater<T>());
          gscore[static_cast<std::size_t>(g)] = v[0] + (gs > 1 ? v[1] : T(0));
        }
        std::vector<std::int64_t> gi(static_cast<std::size_t>(p.n_group));
        std::iota(gi.begin(), gi.end(), 0);
        std::sort(gi.begin(), gi.end(), [&](std::int64_t a, std::int64_t b) {
          return before(gscore[static_cast<std::size_t>(a)], a, gscore[static_cast<std::size_t>(b)], b);
        });
        std::fill(allowed.begin(), allowed.end(), 0);
        for (std::int64_t r = 0; r < p.topk_group; ++r)
          for (std::int64_t e = gi[static_cast<std::size_t>(r)] * gs; e < (gi[static_cast<std::size_t>(r)] + 1) * gs;
               ++e)
            allowed[static_cast<std::size_t>(e)] = 1;
      }
      std::vector<std::int64_t> cand;
      for (std::int64_t e = 0; e < E; ++e)
        if (allowed[static_cast<std::size_t>(e)]) cand.push_back(e);
      std::partial_sort(cand.begin(), cand.begin() + K, cand.end(), [&](std::int64_t a, std::int64_t b) {
        return before(sel[static_cast<std::size_t>(a)], a, sel[static_cast<std::size_t>(b)], b);
      });
      T sum = 0;
      for (std::int64_t k = 0; k < K; ++k) sum += sr[cand[static_cast<std::size_t>(k)]];
      for (std::int64_t k = 0; k < K; ++k) {
        const std::int64_t e = cand[static_cast<std::size_t>(k)];
        topk_idx[static_cast<std::size_t>(t * K + k)] = e;
        T w = sr[e];
        if (p.renormalize) w /= (sum + T(1e-20));
        wb[t * K + k] = w * static_cast<T>(p.scaling);
      }
    });
  });
  route.counts = expert_counts(topk_idx, E);
  route.idx = id_tensor(topk_idx, Space::Host);
}

void host::router_bwd(Tensor& dlogits, const Tensor& scores, const MoeRouting& route, const Tensor& dtopk_w,
                      const Tensor* dscores, const RouterParams& p) {
  const std::int64_t E = p.experts, K = p.topk;
  const std::int64_t Tn = scores.numel() / E;
  const std::vector<std::int64_t> topk_idx = route.indices();
  HCP_DISPATCH_FLOAT(scores, {
    In<T> s_(scores, "scores"), dw_(dtopk_w, "dtopk_w");
    std::optional<In<T>> ds_;
    if (dscores) ds_.emplace(*dscores, "dscores");
    Out<T> dl_(dlogits, "dlogits");
    const T* sb = s_.get();
    const T* dwb = dw_.get();
    const T* dsb = ds_ ? ds_->get() : nullptr;
    T* dlb = dl_.get();
    Kokkos::parallel_for("router_bwd", Range(0, Tn), [&](std::int64_t t) {
      const T* sr = sb + t * E;
      std::vector<T> ds(static_cast<std::size_t>(E), T(0));
      if (dsb)
        for (std::int64_t e = 0; e < E; ++e) ds[static_cast<std::size_t>(e)] = dsb[t * E + e];
      const T sc = static_cast<T>(p.scaling);
      T sum = 0, dot = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const auto e = topk_idx[static_cast<std::size_t>(t * K + k)];
        sum += sr[e];
        dot += dwb[t * K + k] * sr[e];
      }
      sum += T(1e-20);
      for (std::int64_t k = 0; k < K; ++k) {
        const auto e = topk_idx[static_cast<std::size_t>(t * K + k)];
        if (p.renormalize)
          ds[static_cast<std::size_t>(e)] += sc * (dwb[t * K + k] / sum - dot / (sum * sum));
        else
          ds[static_cast<std::size_t>(e)] += sc * dwb[t * K + k];
      }
      T* dl = dlb + t * E;
      if (p.sigmoid) {
        for (std::int64_t e = 0; e < E; ++e) dl[e] = ds[static_cast<std::size_t>(e)] * sr[e] * (T(1) - sr[e]);
      } else {
        T inner = 0;
        for (std::int64_t e = 0; e < E; ++e) inner += ds[static_cast<std::size_t>(e)] * sr[e];
        for (std::int64_t e = 0; e < E; ++e) dl[e] = sr[e] * (ds[static_cast<std::size_t>(e)] - inner);
      }
    });
  });
}

double host::moe_aux_loss_fwd(const Tensor& scores, const std::vector<double>& f, const RouterParams& p) {
  const std::int64_t E = p.experts, Tn = scores.numel() / E;
  double loss = 0;
  for (std::int64_t t = 0; t < Tn; ++t) {
    double sum = 0;
    for (std::int64_t e = 0; e < E; ++e) sum += scores.get(t * E + e);
    for (std::int64_t e = 0; e < E; ++e) loss += f[static_cast<std::size_t>(e)] * scores.get(t * E + e) / sum;
  }
  return static_cast<double>(E) * loss / static_cast<double>(Tn);
}

void host::moe_aux_loss_bwd(Tensor& dscores, const Tensor& scores, const std::vector<double>& f, const RouterParams& p,
                            double dloss) {
  const std::int64_t E = p.experts, Tn = scores.numel() / E;
  for (std::int64_t t = 0; t < Tn; ++t) {
    double sum = 0, inner = 0;
    for (std::int64_t e = 0; e < E; ++e) sum += scores.get(t * E + e);
    for (std::int64_t e = 0; e < E; ++e) inner += f[static_cast<std::size_t>(e)] * scores.get(t * E + e) / sum;
    const double k = dloss * static_cast<double>(E) / static_cast<double>(Tn);
    for (std::int64_t e = 0; e < E; ++e)
      dscores.set(t * E + e, dscores.get(t * E + e) + k * (f[static_cast<std::size_t>(e)] - inner) / sum);
  }
}

void host::moe_permute(Tensor& xp, MoeRouting& route, const Tensor& x) {
  const std::int64_t C = x.size(1), K = route.topk;
  const std::int64_t TK = route.idx.defined() ? route.idx.numel() : 0;
  const std::vector<std::int64_t> topk_idx = route.indices();
  std::vector<std::int64_t> off = route.offsets();
  std::vector<std::int64_t> src(static_cast<std::size_t>(TK), 0), inv(static_cast<std::size_t>(TK), 0);
  for (std::int64_t a = 0; a < TK; ++a) {
    const std::int64_t r = off[static_cast<std::size_t>(topk_idx[static_cast<std::size_t>(a)])]++;
    src[static_cast<std::size_t>(r)] = a;
    inv[static_cast<std::size_t>(a)] = r;
  }
  route.src = id_tensor(src, Space::Host);
  route.inv = id_tensor(inv, Space::Host);
  HCP_DISPATCH_FLOAT(x, {
    In<T> x_(x, "x");
    Out<T> xp_(xp, "xp");
    const T* xb = x_.get();
    T* pb = xp_.get();
    Kokkos::parallel_for("moe_permute", Range(0, TK), [&](std::int64_t r) {
      const std::int64_t t = src[static_cast<std::size_t>(r)] / K;
      std::copy(xb + t * C, xb + (t + 1) * C, pb + r * C);
    });
  });
}

void host::moe_permute_bwd(Tensor& dx, const Tensor& dxp, const MoeRouting& route) {
  const std::int64_t TK = permuted_rows(route, "moe_permute_bwd"), topk = route.topk, Tn = TK / topk;
  const std::int64_t C = dxp.numel() / TK;
  const std::vector<std::int64_t> inv = ids(route.inv);
  HCP_DISPATCH_FLOAT(dxp, {
    In<T> d_(dxp, "dxp");
    Out<T> dx_(dx, "dx");
    const T* db = d_.get();
    T* xb = dx_.get();
    Kokkos::parallel_for("moe_permute_bwd", Range(0, Tn), [&](std::int64_t t) {
      for (std::int64_t c = 0; c < C; ++c) xb[t * C + c] = 0;
      for (std::int64_t k = 0; k < topk; ++k) {
        const std::int64_t r = inv[static_cast<std::size_t>(t * topk + k)];
        for (std::int64_t c = 0; c < C; ++c) xb[t * C + c] += db[r * C + c];
      }
    });
  });
}

void host::moe_combine_fwd(Tensor& y, const Tensor& yp, const MoeRouting& route, const Tensor& topk_w) {
  const std::int64_t TK = permuted_rows(route, "moe_combine");
  const std::int64_t C = yp.numel() / TK, K = topk_w.dim() == 2 ? topk_w.size(1) : 1, Tn = TK / K;
  const std::vector<std::int64_t> inv = ids(route.inv);
  HCP_DISPATCH_FLOAT(yp, {
    In<T> yp_(yp, "yp"), w_(topk_w, "topk_w");
    Out<T> y_(y, "y");
    const T* pb = yp_.get();
    const T* wb = w_.get();
    T* yb = y_.get();
    Kokkos::parallel_for("moe_combine_fwd", Range(0, Tn), [&](std::int64_t t) {
      for (std::int64_t c = 0; c < C; ++c) yb[t * C + c] = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const std::int64_t r = inv[static_cast<std::size_t>(t * K + k)];
        for (std::int64_t c = 0; c < C; ++c) yb[t * C + c] += wb[t * K + k] * pb[r * C + c];
      }
    });
  });
}

void host::moe_combine_bwd(Tensor& dyp, Tensor& dtopk_w, const Tensor& dy, const Tensor& yp, const MoeRouting& route,
                           const Tensor& topk_w) {
  const std::int64_t TK = permuted_rows(route, "moe_combine_bwd");
  const std::int64_t C = yp.numel() / TK, K = topk_w.dim() == 2 ? topk_w.size(1) : 1;
  const std::vector<std::int64_t> src = route.sources();
  HCP_DISPATCH_FLOAT(yp, {
    In<T> yp_(yp, "yp"), w_(topk_w, "topk_w"), dy_(dy, "dy");
    Out<T> dp_(dyp, "dyp"), dw_(dtopk_w, "dtopk_w");
    const T* pb = yp_.get();
    const T* wb = w_.get();
    const T* dyb = dy_.get();
    T* dpb = dp_.get();
    T* dwb = dw_.get();
    Kokkos::parallel_for("moe_combine_bwd", Range(0, TK), [&](std::int64_t r) {
      const std::int64_t a = src[static_cast<std::size_t>(r)], t = a / K;
      T dot = 0;
      for (std::int64_t c = 0; c < C; ++c) {
        dpb[r * C + c] = wb[a] * dyb[t * C + c];
        dot += dyb[t * C + c] * pb[r * C + c];
      }
      dwb[a] = dot;
    });
  });
}

namespace {
template <class T>
inline T act_fwd(const T* h, std::int64_t f, std::int64_t F, Activation a) {
  if (a == Activation::SquaredReLU) {
    const T r = h[f] > T(0) ? h[f] : T(0);
    return r * r;
  }
  return host::silu(h[f]) * h[F + f];
}
}  // namespace

void host::expert_mlp_fwd(Tensor& yp, Tensor& h, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                          const std::vector<std::int64_t>& counts, Activation act) {
  const MlpShape s = check_mlp(xp, W1, W2, counts, act);
  HCP_DISPATCH_FLOAT(xp, {
    In<T> x_(xp, "xp"), W1_(W1, "W1"), W2_(W2, "W2");
    Out<T> y_(yp, "yp"), h_(h, "h");
    const T* xb = x_.get();
    const T* w1 = W1_.get();
    const T* w2 = W2_.get();
    T* yb = y_.get();
    T* hb = h_.get();
    // One work item per expert: H_e = X_e W1_e^T, A_e = act(H_e), Y_e = A_e W2_e^T (two GEMMs).
    Kokkos::parallel_for("expert_mlp_fwd", Range(0, s.E), [&](std::int64_t e) {
      const std::int64_t r0 = s.off[static_cast<std::size_t>(e)], n = s.off[static_cast<std::size_t>(e + 1)] - r0;
      if (n == 0) return;
      T* hr = hb + r0 * s.F1;
      host::gemm(false, true, n, s.F1, s.C, T(1), xb + r0 * s.C, s.C, w1 + e * s.F1 * s.C, s.C, T(0), hr, s.F1);
      std::vector<T> a(static_cast<std::size_t>(n * s.F));
      for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t f = 0; f < s.F; ++f)
          a[static_cast<std::size_t>(r * s.F + f)] = act_fwd(hr + r * s.F1, f, s.F, act);
      host::gemm(false, true, n, s.C, s.F, T(1), a.data(), s.F, w2 + e * s.C * s.F, s.F, T(0), yb + r0 * s.C, s.C);
    });
  });
}

void host::expert_mlp_bwd(Tensor& dxp, Tensor& dW1, Tensor& dW2, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                          const Tensor& h, const std::vector<std::int64_t>& counts, Activation act, const Tensor& dyp) {
  const MlpShape s = check_mlp(xp, W1, W2, counts, act);
  HCP_DISPATCH_FLOAT(xp, {
    In<T> x_(xp, "xp"), W1_(W1, "W1"), W2_(W2, "W2"), h_(h, "h"), dy_(dyp, "dyp");
    Out<T> dx_(dxp, "dxp"), dW1_(dW1, "dW1"), dW2_(dW2, "dW2");
    const T* xb = x_.get();
    const T* w1 = W1_.get();
    const T* w2 = W2_.get();
    const T* hb = h_.get();
    const T* dyb = dy_.get();
    T* dxb = dx_.get();
    T* dw1 = dW1_.get();
    T* dw2 = dW2_.get();
    // One work item per expert (its rows, its weights). dW2 and dA read dY before dX is written, so
    // dxp may alias dyp.
    Kokkos::parallel_for("expert_mlp_bwd", Range(0, s.E), [&](std::int64_t e) {
      const std::int64_t r0 = s.off[static_cast<std::size_t>(e)], n = s.off[static_cast<std::size_t>(e + 1)] - r0;
      T* dw1e = dw1 + e * s.F1 * s.C;
      T* dw2e = dw2 + e * s.C * s.F;
      if (n == 0) {
        std::fill(dw1e, dw1e + s.F1 * s.C, T(0));
        std::fill(dw2e, dw2e + s.C * s.F, T(0));
        return;
      }
      const T* hr = hb + r0 * s.F1;
      const T* dy = dyb + r0 * s.C;
      std::vector<T> a(static_cast<std::size_t>(n * s.F)), da(static_cast<std::size_t>(n * s.F)),
          dh(static_cast<std::size_t>(n * s.F1));
      for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t f = 0; f < s.F; ++f)
          a[static_cast<std::size_t>(r * s.F + f)] = act_fwd(hr + r * s.F1, f, s.F, act);
      host::gemm(true, false, s.C, s.F, n, T(1), dy, s.C, a.data(), s.F, T(0), dw2e, s.F);  // dW2 = dY^T A
      host::gemm(false, false, n, s.F, s.C, T(1), dy, s.C, w2 + e * s.C * s.F, s.F, T(0), da.data(),
                 s.F);  // dA = dY W2
      for (std::int64_t r = 0; r < n; ++r) {
        const T* h_r = hr + r * s.F1;
        T* dh_r = dh.data() + r * s.F1;
        for (std::int64_t f = 0; f < s.F; ++f) {
          const T g = da[static_cast<std::size_t>(r * s.F + f)];
          if (act == Activation::SquaredReLU) {
            dh_r[f] = h_r[f] > T(0) ? g * T(2) * h_r[f] : T(0);
          } else {
            dh_r[f] = g * h_r[s.F + f] * host::dsilu(h_r[f]);
            dh_r[s.F + f] = g * host::silu(h_r[f]);
          }
        }
      }
      host::gemm(true, false, s.F1, s.C, n, T(1), dh.data(), s.F1, xb + r0 * s.C, s.C, T(0), dw1e,
                 s.C);  // dW1 = dH^T X
      host::gemm(false, false, n, s.C, s.F1, T(1), dh.data(), s.F1, w1 + e * s.F1 * s.C, s.C, T(0), dxb + r0 * s.C,
                 s.C);  // dX = dH W1
    });
  });
}

}  // namespace hcp::kernels
