// Flash-style attention on the host: query blocks against key tiles as BLAS GEMMs, online
// softmax, LSE output; backward from the saved O and LSE. Segments (kernels.hpp) carry the block structure that varlen
// THD and the CP strategies need.
#include <algorithm>
#include <vector>

#include "kernels/host/common.hpp"
#include "kernels/host/gemm.hpp"
#include "kernels/host/host_kernels.hpp"
#include "kernels/kernels.hpp"
#include "kernels/shape_rules.hpp"

namespace hcp::kernels {
using rules::check_attn;
using rules::Shapes;
namespace {

using host::In;
using host::Out;
using host::Range;

// Number of keys of segment g visible to its query row i (keys 0..n-1 of the block).
inline std::int64_t visible(const AttnSegment& g, std::int64_t i, Mask m) { return keys_seen(g, i, m == Mask::Causal); }

// Query rows per block of the tiled products (keys per block: AttnParams::kv_tile).
constexpr std::int64_t kQueryBlock = 64;

// A block of `nq` query rows (segment rows i0..) against keys j0..j0+nb of segment g: the number of
// those keys row r sees, in [0, nb].
inline std::int64_t block_visible(const AttnSegment& g, std::int64_t i0, std::int64_t r, std::int64_t j0,
                                  std::int64_t nb, Mask m) {
  return std::clamp<std::int64_t>(visible(g, i0 + r, m) - j0, 0, nb);
}

// Forward, one work item per KV head (its query heads, every segment in order): scores and P·V of a
// query block against a key tile are two GEMMs; the online softmax runs between them.
template <class T>
void fwd_impl(T* o, T* lse, const T* q, const T* k, const T* v, const AttnParams& p, const Shapes& s) {
  const std::int64_t H = s.H, D = s.D, Hkv = s.Hkv, grp = H / Hkv, qs = H * D, ks = Hkv * D, Bk = p.kv_tile;
  const T scale = static_cast<T>(p.effective_scale()), ninf = -std::numeric_limits<T>::infinity();
  std::fill(o, o + s.tq * H * D, T(0));
  std::fill(lse, lse + s.tq * H, ninf);
  Kokkos::parallel_for("attention_fwd", Range(0, Hkv), [&](std::int64_t hk) {
    std::vector<T> sc(static_cast<std::size_t>(kQueryBlock * Bk)), acc(static_cast<std::size_t>(kQueryBlock * D));
    std::vector<T> m(static_cast<std::size_t>(kQueryBlock)), l(static_cast<std::size_t>(kQueryBlock));
    for (const auto& g : p.segments)
      for (std::int64_t h = hk * grp; h < (hk + 1) * grp; ++h)
        for (std::int64_t i0 = 0; i0 < g.q_len; i0 += kQueryBlock) {
          const std::int64_t nq = std::min(kQueryBlock, g.q_len - i0), nvis = visible(g, i0 + nq - 1, p.mask);
          const T* qb = q + (g.q_start + i0) * qs + h * D;
          std::fill(acc.begin(), acc.end(), T(0));
          std::fill(m.begin(), m.end(), ninf);
          std::fill(l.begin(), l.end(), T(0));
          for (std::int64_t j0 = 0; j0 < nvis; j0 += Bk) {
            const std::int64_t nb = std::min(Bk, nvis - j0);
            const T* kb = k + (g.kv_start + j0) * ks + hk * D;
            host::gemm(false, true, nq, nb, D, scale, qb, qs, kb, ks, T(0), sc.data(), nb);
            for (std::int64_t r = 0; r < nq; ++r) {
              T* sr = sc.data() + r * nb;
              const std::int64_t nv = block_visible(g, i0, r, j0, nb, p.mask);
              const T mt = host::row_max(sr, nv, m[r]);
              if (mt == ninf) {  // nothing visible yet: the row adds nothing
                std::fill(sr, sr + nb, T(0));
                continue;
              }
              const T corr = std::exp(m[r] - mt);  // m = -inf before the row's first key: corr = 0
              l[r] *= corr;
              for (std::int64_t d = 0; d < D; ++d) acc[r * D + d] *= corr;
              for (std::int64_t c = 0; c < nv; ++c) sr[c] -= mt;
              host::exp_inplace(sr, nv);
              l[r] += host::row_sum(sr, nv);
              std::fill(sr + nv, sr + nb, T(0));
              m[r] = mt;
            }
            host::gemm(false, false, nq, D, nb, T(1), sc.data(), nb, v + (g.kv_start + j0) * ks + hk * D, ks, T(1),
                       acc.data(), D);
          }
          for (std::int64_t r = 0; r < nq; ++r) {
            if (l[r] == T(0)) continue;  // a row that sees no key: O = 0, LSE = -inf
            const std::int64_t row = g.q_start + i0 + r;
            for (std::int64_t d = 0; d < D; ++d) o[row * qs + h * D + d] = acc[r * D + d] / l[r];
            lse[row * H + h] = m[r] + std::log(l[r]);
          }
        }
  });
}

// Backward from the saved O and LSE, one work item per KV head (so dK/dV rows and the dQ rows of
// its query heads belong to it alone): per query block and key tile, S and dP are GEMMs, then
// dV += P^T dO, dK += dS^T Q and dQ += dS K.
template <class T>
void bwd_impl(T* dq, T* dk, T* dv, const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout,
              const AttnParams& p, const Shapes& s) {
  const std::int64_t H = s.H, D = s.D, Hkv = s.Hkv, grp = H / Hkv, qs = H * D, ks = Hkv * D, Bk = p.kv_tile;
  const T scale = static_cast<T>(p.effective_scale());
  std::fill(dq, dq + s.tq * H * D, T(0));
  std::fill(dk, dk + s.tkv * Hkv * D, T(0));
  std::fill(dv, dv + s.tkv * Hkv * D, T(0));
  // Delta = rowsum(dout * o) per (row, head).
  std::vector<T> delta(static_cast<std::size_t>(s.tq * H), T(0));
  Kokkos::parallel_for("attention_bwd_delta", Range(0, s.tq * H), [&](std::int64_t w) {
    T acc = 0;
    for (std::int64_t d = 0; d < D; ++d) acc += dout[w * D + d] * o[w * D + d];
    delta[static_cast<std::size_t>(w)] = acc;
  });
  Kokkos::parallel_for("attention_bwd", Range(0, Hkv), [&](std::int64_t hk) {
    std::vector<T> pm(static_cast<std::size_t>(kQueryBlock * Bk)), ds(static_cast<std::size_t>(kQueryBlock * Bk));
    for (const auto& g : p.segments)
      for (std::int64_t h = hk * grp; h < (hk + 1) * grp; ++h)
        for (std::int64_t i0 = 0; i0 < g.q_len; i0 += kQueryBlock) {
          const std::int64_t nq = std::min(kQueryBlock, g.q_len - i0), nvis = visible(g, i0 + nq - 1, p.mask);
          const std::int64_t row0 = g.q_start + i0;
          const T* qb = q + row0 * qs + h * D;
          const T* dob = dout + row0 * qs + h * D;
          T* dqb = dq + row0 * qs + h * D;
          for (std::int64_t j0 = 0; j0 < nvis; j0 += Bk) {
            const std::int64_t nb = std::min(Bk, nvis - j0), col0 = g.kv_start + j0;
            const T* kb = k + col0 * ks + hk * D;
            const T* vb = v + col0 * ks + hk * D;
            host::gemm(false, true, nq, nb, D, scale, qb, qs, kb, ks, T(0), pm.data(), nb);
            host::gemm(false, true, nq, nb, D, T(1), dob, qs, vb, ks, T(0), ds.data(), nb);
            for (std::int64_t r = 0; r < nq; ++r) {
              T* pr = pm.data() + r * nb;
              T* dr = ds.data() + r * nb;
              const T lr = lse[(row0 + r) * H + h], dl = delta[static_cast<std::size_t>((row0 + r) * H + h)];
              const std::int64_t nv = std::isinf(lr) ? 0 : block_visible(g, i0, r, j0, nb, p.mask);
              for (std::int64_t c = 0; c < nv; ++c) pr[c] -= lr;
              host::exp_inplace(pr, nv);
              for (std::int64_t c = 0; c < nv; ++c) dr[c] = pr[c] * (dr[c] - dl) * scale;
              std::fill(pr + nv, pr + nb, T(0));
              std::fill(dr + nv, dr + nb, T(0));
            }
            host::gemm(true, false, nb, D, nq, T(1), pm.data(), nb, dob, qs, T(1), dv + col0 * ks + hk * D, ks);
            host::gemm(true, false, nb, D, nq, T(1), ds.data(), nb, qb, qs, T(1), dk + col0 * ks + hk * D, ks);
            host::gemm(false, false, nq, D, nb, T(1), ds.data(), nb, kb, ks, T(1), dqb, qs);
          }
        }
  });
}

template <class T>
void merge_impl(T* o, T* lse, const T* ob, const T* lseb, std::int64_t rows, std::int64_t D) {
  Kokkos::parallel_for("attention_merge", Range(0, rows), [&](std::int64_t r) {
    const T b = lseb[r], a = lse[r];
    if (std::isinf(b) && b < 0) return;
    if (std::isinf(a) && a < 0) {
      lse[r] = b;
      for (std::int64_t d = 0; d < D; ++d) o[r * D + d] = ob[r * D + d];
      return;
    }
    const T mx = std::max(a, b), mn = std::min(a, b);
    const T l = mx + std::log1p(std::exp(mn - mx));
    const T wa = std::exp(a - l), wb = std::exp(b - l);
    for (std::int64_t d = 0; d < D; ++d) o[r * D + d] = o[r * D + d] * wa + ob[r * D + d] * wb;
    lse[r] = l;
  });
}

}  // namespace

std::vector<AttnSegment> segments_from_layout(const SeqLayout& ql, const SeqLayout& kl, bool bottom_right) {
  HCP_CHECK(ql.nseq() == kl.nseq(), "attention: cu_seqlens_q has ", ql.nseq(), " sequences, cu_seqlens_kv ", kl.nseq());
  std::vector<AttnSegment> segs;
  for (std::int64_t s = 0; s < ql.nseq(); ++s) {
    AttnSegment g;
    g.q_start = ql.cu_seqlens[s];
    g.q_len = ql.real(s);  // pads are neither queries nor keys
    g.kv_start = kl.cu_seqlens[s];
    g.kv_len = kl.real(s);
    g.q_pos0 = bottom_right ? g.kv_len - g.q_len : 0;
    g.kv_pos0 = 0;
    segs.push_back(g);
  }
  return segs;
}

void host::attention_fwd(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttnParams& p) {
  const Shapes s = check_attn(q, k, v, p);
  HCP_DISPATCH_FLOAT(q, {
    In<T> q_(q, "q"), k_(k, "k"), v_(v, "v");
    Out<T> o_(o, "o"), l_(lse, "lse");
    fwd_impl<T>(o_, l_, q_, k_, v_, p, s);
  });
}

void host::attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& o, const Tensor& lse, const Tensor& dout, const AttnParams& p) {
  const Shapes s = check_attn(q, k, v, p);
  HCP_DISPATCH_FLOAT(q, {
    In<T> q_(q, "q"), k_(k, "k"), v_(v, "v"), o_(o, "o"), l_(lse, "lse"), do_(dout, "dout");
    Out<T> dq_(dq, "dq"), dk_(dk, "dk"), dv_(dv, "dv");
    bwd_impl<T>(dq_, dk_, dv_, q_, k_, v_, o_, l_, do_, p, s);
  });
}

void host::attention_merge(Tensor& o, Tensor& lse, const Tensor& o_b, const Tensor& lse_b) {
  const std::int64_t rows = lse.numel(), D = o.numel() / rows;
  HCP_DISPATCH_FLOAT(o, {
    In<T> ob(o_b, "o_b"), lb(lse_b, "lse_b");
    Out<T> o_(o, "o", true), l_(lse, "lse", true);
    merge_impl<T>(o_, l_, ob, lb, rows, D);
  });
}

}  // namespace hcp::kernels
