// Flash-style attention on the host: tiled keys, online softmax, LSE output; backward from the
// saved O and LSE. Segments (kernels.hpp) carry the block structure that varlen THD and the CP
// strategies need.
#include <algorithm>
#include <vector>

#include "kernels/host/common.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels {
namespace {

using host::In;
using host::Out;
using host::Range;

struct Shapes {
  std::int64_t tq, tkv, H, Hkv, D;
};

Shapes check_attn(const Tensor& q, const Tensor& k, const Tensor& v, const AttnParams& p) {
  HCP_CHECK(p.heads > 0 && p.kv_heads > 0 && p.head_dim > 0, "attention: heads, kv_heads, head_dim must be > 0");
  HCP_CHECK(p.heads % p.kv_heads == 0, "attention: heads (", p.heads, ") must be divisible by kv_heads (",
            p.kv_heads, ")");
  HCP_CHECK(q.numel() % (p.heads * p.head_dim) == 0, "attention: q shape ", shape_str(q.shape()),
            " is not [T, heads=", p.heads, ", head_dim=", p.head_dim, "]");
  HCP_CHECK(k.numel() % (p.kv_heads * p.head_dim) == 0 && k.numel() == v.numel(), "attention: k ",
            shape_str(k.shape()), " / v ", shape_str(v.shape()), " are not [T, kv_heads=", p.kv_heads,
            ", head_dim=", p.head_dim, "]");
  HCP_CHECK(p.kv_tile > 0, "attention: kv_tile must be > 0");
  Shapes s{q.numel() / (p.heads * p.head_dim), k.numel() / (p.kv_heads * p.head_dim), p.heads, p.kv_heads,
           p.head_dim};
  std::vector<char> used(static_cast<std::size_t>(s.tq), 0);
  for (const auto& g : p.segments) {
    HCP_CHECK(g.q_start >= 0 && g.q_len >= 0 && g.q_start + g.q_len <= s.tq, "attention: segment q rows [",
              g.q_start, ", ", g.q_start + g.q_len, ") outside the ", s.tq, " query rows");
    HCP_CHECK(g.kv_start >= 0 && g.kv_len >= 0 && g.kv_start + g.kv_len <= s.tkv, "attention: segment kv rows [",
              g.kv_start, ", ", g.kv_start + g.kv_len, ") outside the ", s.tkv, " key rows");
    for (std::int64_t i = g.q_start; i < g.q_start + g.q_len; ++i) {
      HCP_CHECK(!used[static_cast<std::size_t>(i)], "attention: query row ", i, " belongs to two segments");
      used[static_cast<std::size_t>(i)] = 1;
    }
  }
  return s;
}

// Number of keys of segment g visible to its query row i (keys 0..n-1 of the block).
inline std::int64_t visible(const AttnSegment& g, std::int64_t i, Mask m) {
  if (m == Mask::None) return g.kv_len;
  std::int64_t n = g.q_pos0 + i - g.kv_pos0 + 1;
  return std::clamp<std::int64_t>(n, 0, g.kv_len);
}

double scale_of(const AttnParams& p) { return p.scale != 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim)); }

template <class T>
void fwd_impl(T* o, T* lse, const T* q, const T* k, const T* v, const AttnParams& p, const Shapes& s) {
  const std::int64_t H = s.H, D = s.D, Hkv = s.Hkv, grp = H / Hkv;
  const T scale = static_cast<T>(scale_of(p));
  std::fill(o, o + s.tq * H * D, T(0));
  std::fill(lse, lse + s.tq * H, -std::numeric_limits<T>::infinity());
  // Flatten (segment, row, head) work items.
  std::vector<std::pair<std::int64_t, std::int64_t>> rows;  // (segment, row in segment)
  for (std::size_t gi = 0; gi < p.segments.size(); ++gi)
    for (std::int64_t i = 0; i < p.segments[gi].q_len; ++i) rows.emplace_back(static_cast<std::int64_t>(gi), i);
  const std::int64_t tile = p.kv_tile;
  Kokkos::parallel_for(
      "attention_fwd", Range(0, static_cast<std::int64_t>(rows.size()) * H), [&](std::int64_t w) {
        const auto& g = p.segments[static_cast<std::size_t>(rows[static_cast<std::size_t>(w / H)].first)];
        const std::int64_t i = rows[static_cast<std::size_t>(w / H)].second, h = w % H, hk = h / grp;
        const std::int64_t row = g.q_start + i, nvis = visible(g, i, p.mask);
        if (nvis == 0) return;
        const T* qr = q + (row * H + h) * D;
        std::vector<T> acc(static_cast<std::size_t>(D), T(0)), sc(static_cast<std::size_t>(tile));
        T m = -std::numeric_limits<T>::infinity(), l = 0;
        for (std::int64_t j0 = 0; j0 < nvis; j0 += tile) {
          const std::int64_t j1 = std::min(nvis, j0 + tile);
          T mt = m;
          for (std::int64_t j = j0; j < j1; ++j) {
            const T* kr = k + ((g.kv_start + j) * Hkv + hk) * D;
            T dot = 0;
            for (std::int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
            sc[static_cast<std::size_t>(j - j0)] = dot * scale;
            mt = std::max(mt, dot * scale);
          }
          const T corr = std::exp(m - mt);  // m = -inf on the first tile: corr = 0
          l *= corr;
          for (auto& a : acc) a *= corr;
          for (std::int64_t j = j0; j < j1; ++j) {
            const T pj = std::exp(sc[static_cast<std::size_t>(j - j0)] - mt);
            l += pj;
            const T* vr = v + ((g.kv_start + j) * Hkv + hk) * D;
            for (std::int64_t d = 0; d < D; ++d) acc[static_cast<std::size_t>(d)] += pj * vr[d];
          }
          m = mt;
        }
        T* orow = o + (row * H + h) * D;
        for (std::int64_t d = 0; d < D; ++d) orow[d] = acc[static_cast<std::size_t>(d)] / l;
        lse[row * H + h] = m + std::log(l);
      });
}

template <class T>
void bwd_impl(T* dq, T* dk, T* dv, const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout,
              const AttnParams& p, const Shapes& s) {
  const std::int64_t H = s.H, D = s.D, Hkv = s.Hkv, grp = H / Hkv;
  const T scale = static_cast<T>(scale_of(p));
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
  auto dscore = [&](const AttnSegment& g, std::int64_t i, std::int64_t j, std::int64_t h, T* pout) -> T {
    const std::int64_t row = g.q_start + i, col = g.kv_start + j, hk = h / grp;
    const T* qr = q + (row * H + h) * D;
    const T* kr = k + (col * Hkv + hk) * D;
    const T* vr = v + (col * Hkv + hk) * D;
    const T* dor = dout + (row * H + h) * D;
    T sdot = 0, dp = 0;
    for (std::int64_t d = 0; d < D; ++d) {
      sdot += qr[d] * kr[d];
      dp += dor[d] * vr[d];
    }
    const T pr = std::exp(sdot * scale - lse[row * H + h]);
    *pout = pr;
    return pr * (dp - delta[static_cast<std::size_t>(row * H + h)]);
  };
  // Pass 1: dq, one work item per (segment row, head).
  std::vector<std::pair<std::int64_t, std::int64_t>> rows;
  for (std::size_t gi = 0; gi < p.segments.size(); ++gi)
    for (std::int64_t i = 0; i < p.segments[gi].q_len; ++i) rows.emplace_back(static_cast<std::int64_t>(gi), i);
  Kokkos::parallel_for("attention_bwd_dq", Range(0, static_cast<std::int64_t>(rows.size()) * H), [&](std::int64_t w) {
    const auto& g = p.segments[static_cast<std::size_t>(rows[static_cast<std::size_t>(w / H)].first)];
    const std::int64_t i = rows[static_cast<std::size_t>(w / H)].second, h = w % H;
    const std::int64_t row = g.q_start + i, nvis = visible(g, i, p.mask);
    if (nvis == 0 || std::isinf(lse[row * H + h])) return;
    T* dqr = dq + (row * H + h) * D;
    for (std::int64_t j = 0; j < nvis; ++j) {
      T pr;
      const T ds = dscore(g, i, j, h, &pr) * scale;
      const T* kr = k + ((g.kv_start + j) * Hkv + h / grp) * D;
      for (std::int64_t d = 0; d < D; ++d) dqr[d] += ds * kr[d];
    }
  });
  // Pass 2: dk, dv, one work item per (key row, kv head); visits every segment holding the row.
  Kokkos::parallel_for("attention_bwd_dkv", Range(0, s.tkv * Hkv), [&](std::int64_t w) {
    const std::int64_t col = w / Hkv, hk = w % Hkv;
    T* dkr = dk + (col * Hkv + hk) * D;
    T* dvr = dv + (col * Hkv + hk) * D;
    for (const auto& g : p.segments) {
      if (col < g.kv_start || col >= g.kv_start + g.kv_len) continue;
      const std::int64_t j = col - g.kv_start;
      for (std::int64_t i = 0; i < g.q_len; ++i) {
        if (j >= visible(g, i, p.mask)) continue;
        const std::int64_t row = g.q_start + i;
        for (std::int64_t h = hk * grp; h < (hk + 1) * grp; ++h) {
          if (std::isinf(lse[row * H + h])) continue;
          T pr;
          const T ds = dscore(g, i, j, h, &pr) * scale;
          const T* qr = q + (row * H + h) * D;
          const T* dor = dout + (row * H + h) * D;
          for (std::int64_t d = 0; d < D; ++d) {
            dvr[d] += pr * dor[d];
            dkr[d] += ds * qr[d];
          }
        }
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
  HCP_CHECK(ql.nseq() == kl.nseq(), "attention: cu_seqlens_q has ", ql.nseq(), " sequences, cu_seqlens_kv ",
            kl.nseq());
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

void attention_fwd(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const AttnParams& p) {
  const Shapes s = check_attn(q, k, v, p);
  host::require_numel(o, q.numel(), "attention_fwd: o");
  host::require_numel(lse, s.tq * s.H, "attention_fwd: lse");
  HCP_ROUTE_CUDA(q, cuda_impl::attention_fwd(o, lse, q, k, v, p));
  HCP_DISPATCH_FLOAT(q, {
    In<T> q_(q, "q"), k_(k, "k"), v_(v, "v");
    Out<T> o_(o, "o"), l_(lse, "lse");
    fwd_impl<T>(o_, l_, q_, k_, v_, p, s);
  });
}

void attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& o, const Tensor& lse, const Tensor& dout, const AttnParams& p) {
  const Shapes s = check_attn(q, k, v, p);
  host::require_numel(dq, q.numel(), "attention_bwd: dq");
  host::require_numel(dk, k.numel(), "attention_bwd: dk");
  host::require_numel(dv, v.numel(), "attention_bwd: dv");
  host::require_numel(o, q.numel(), "attention_bwd: o");
  host::require_numel(dout, q.numel(), "attention_bwd: dout");
  host::require_numel(lse, s.tq * s.H, "attention_bwd: lse");
  HCP_ROUTE_CUDA(q, cuda_impl::attention_bwd(dq, dk, dv, q, k, v, o, lse, dout, p));
  HCP_DISPATCH_FLOAT(q, {
    In<T> q_(q, "q"), k_(k, "k"), v_(v, "v"), o_(o, "o"), l_(lse, "lse"), do_(dout, "dout");
    Out<T> dq_(dq, "dq"), dk_(dk, "dk"), dv_(dv, "dv");
    bwd_impl<T>(dq_, dk_, dv_, q_, k_, v_, o_, l_, do_, p, s);
  });
}

void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_b, const Tensor& lse_b) {
  HCP_CHECK(o.shape() == o_b.shape() && lse.numel() == lse_b.numel() && lse.numel() > 0 &&
                o.numel() % lse.numel() == 0,
            "attention_merge: shapes o ", shape_str(o.shape()), ", o_b ", shape_str(o_b.shape()), ", lse ",
            shape_str(lse.shape()), ", lse_b ", shape_str(lse_b.shape()));
  const std::int64_t rows = lse.numel(), D = o.numel() / rows;
  HCP_ROUTE_CUDA(o, cuda_impl::attention_merge(o, lse, o_b, lse_b));
  HCP_DISPATCH_FLOAT(o, {
    In<T> ob(o_b, "o_b"), lb(lse_b, "lse_b");
    Out<T> o_(o, "o", true), l_(lse, "lse", true);
    merge_impl<T>(o_, l_, ob, lb, rows, D);
  });
}

}  // namespace hcp::kernels
