// Flash-style attention on the GPU: one warp per (query row, head) with an online softmax over key
// tiles of 32 (one key per lane for the scores, lanes over head_dim for the output), LSE out (fp32,
// fp64 for fp64 inputs); backward from the saved O and LSE: dq with one warp per (query row,
// head), dk/dv with one warp per (key row, kv head) visiting every segment that holds the key, so
// every output has one owner (no atomics: bitwise repeatable). Segments and masks exactly as the
// host kernels (kernels.hpp). This is the general path (fp32, fp64, any head_dim); bf16 with head_dim
// 64 or 128 goes to the tensor-core flash kernels of attention_tc.cu (this folder).
#include <cmath>

#include "kernels/cuda/attention/attention_tc.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels::cuda_impl {
using namespace hcp::cuda;

namespace {
constexpr int kMaxD = 256, kPer = kMaxD / 32, kWarps = 4;

using Seg = AttnSegment;
template <class S, class A>
__device__ __forceinline__ A dot_row(const A* a_sh, const S* b, std::int64_t D) {
  A s = 0;
  for (std::int64_t d = 0; d < D; ++d) s += a_sh[d] * ld(b + d);
  return s;
}

// ---- forward --------------------------------------------------------------------------------------
template <class S, class A>
__global__ void fwd_k(S* o, A* lse, const S* q, const S* k, const S* v, const Seg* segs, const std::int64_t* row_seg,
                      const std::int64_t* row_i, std::int64_t nrows, std::int64_t H, std::int64_t Hkv, std::int64_t D,
                      A scale, bool causal) {
  __shared__ A q_sh[kWarps][kMaxD];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t w = blockIdx.x * static_cast<std::int64_t>(kWarps) + warp;
  if (w >= nrows * H) return;
  const std::int64_t r = w / H, h = w % H, hk = h / (H / Hkv);
  const Seg g = segs[row_seg[r]];
  const std::int64_t i = row_i[r], row = g.q_start + i, nvis = keys_seen(g, i, causal);
  for (std::int64_t d = lane; d < D; d += 32) q_sh[warp][d] = ld(q + (row * H + h) * D + d);
  __syncwarp();
  A acc[kPer];
  for (int t = 0; t < kPer; ++t) acc[t] = 0;
  A m = -INFINITY, l = 0;
  for (std::int64_t j0 = 0; j0 < nvis; j0 += 32) {
    const std::int64_t j = j0 + lane;
    A s = -INFINITY;
    if (j < nvis) s = dot_row(q_sh[warp], k + ((g.kv_start + j) * Hkv + hk) * D, D) * scale;
    const A mt = max(m, warp_max(s));
    const A corr = exp(m - mt);  // m = -inf on the first tile: 0
    const A p = j < nvis ? exp(s - mt) : A(0);
    l = l * corr + warp_sum(p);
    for (int t = 0; t < kPer; ++t) acc[t] *= corr;
    const std::int64_t n = nvis - j0 < 32 ? nvis - j0 : 32;
    for (std::int64_t jj = 0; jj < n; ++jj) {
      const A pj = __shfl_sync(0xffffffffu, p, static_cast<int>(jj));
      const S* vr = v + ((g.kv_start + j0 + jj) * Hkv + hk) * D;
      for (int t = 0; t < kPer; ++t) {
        const std::int64_t d = lane + 32 * t;
        if (d < D) acc[t] += pj * ld(vr + d);
      }
    }
    m = mt;
  }
  S* orow = o + (row * H + h) * D;
  for (int t = 0; t < kPer; ++t) {
    const std::int64_t d = lane + 32 * t;
    if (d < D) st(orow + d, nvis > 0 ? acc[t] / l : A(0));
  }
  if (lane == 0) lse[row * H + h] = nvis > 0 ? m + log(l) : -INFINITY;
}

template <class S, class A>
__global__ void init_k(S* o, A* lse, std::int64_t rows, std::int64_t D) {
  const std::int64_t x = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (x < rows * D) st(o + x, A(0));
  if (x < rows) lse[x] = -INFINITY;
}

// ---- backward ---------------------------------------------------------------------------------------
template <class S, class A>
__global__ void delta_k(A* delta, const S* dout, const S* o, std::int64_t rows, std::int64_t D) {
  const std::int64_t x = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (x >= rows) return;
  A acc = 0;
  for (std::int64_t d = 0; d < D; ++d) acc += ld(dout + x * D + d) * ld(o + x * D + d);
  delta[x] = acc;
}
template <class S, class A>
__global__ void dq_k(S* dq, const S* q, const S* k, const S* v, const A* lse, const A* delta, const S* dout,
                     const Seg* segs, const std::int64_t* row_seg, const std::int64_t* row_i, std::int64_t nrows,
                     std::int64_t H, std::int64_t Hkv, std::int64_t D, A scale, bool causal) {
  __shared__ A q_sh[kWarps][kMaxD], do_sh[kWarps][kMaxD];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t w = blockIdx.x * static_cast<std::int64_t>(kWarps) + warp;
  if (w >= nrows * H) return;
  const std::int64_t r = w / H, h = w % H, hk = h / (H / Hkv);
  const Seg g = segs[row_seg[r]];
  const std::int64_t i = row_i[r], row = g.q_start + i, nvis = keys_seen(g, i, causal);
  const A L = lse[row * H + h], Dl = delta[row * H + h];
  for (std::int64_t d = lane; d < D; d += 32) {
    q_sh[warp][d] = ld(q + (row * H + h) * D + d);
    do_sh[warp][d] = ld(dout + (row * H + h) * D + d);
  }
  __syncwarp();
  A acc[kPer];
  for (int t = 0; t < kPer; ++t) acc[t] = 0;
  const bool live = !(isinf(L) && L < 0);
  for (std::int64_t j0 = 0; live && j0 < nvis; j0 += 32) {
    const std::int64_t j = j0 + lane;
    A ds = 0;
    if (j < nvis) {
      const std::int64_t col = g.kv_start + j;
      const A s = dot_row(q_sh[warp], k + (col * Hkv + hk) * D, D) * scale;
      const A dp = dot_row(do_sh[warp], v + (col * Hkv + hk) * D, D);
      ds = exp(s - L) * (dp - Dl) * scale;
    }
    const std::int64_t n = nvis - j0 < 32 ? nvis - j0 : 32;
    for (std::int64_t jj = 0; jj < n; ++jj) {
      const A dsj = __shfl_sync(0xffffffffu, ds, static_cast<int>(jj));
      const S* kr = k + ((g.kv_start + j0 + jj) * Hkv + hk) * D;
      for (int t = 0; t < kPer; ++t) {
        const std::int64_t d = lane + 32 * t;
        if (d < D) acc[t] += dsj * ld(kr + d);
      }
    }
  }
  for (int t = 0; t < kPer; ++t) {
    const std::int64_t d = lane + 32 * t;
    if (d < D) st(dq + (row * H + h) * D + d, acc[t]);
  }
}
// One warp per (key row, kv head); lanes over the query rows of each segment holding the key.
template <class S, class A>
__global__ void dkv_k(S* dk, S* dv, const S* q, const S* k, const S* v, const A* lse, const A* delta, const S* dout,
                      const Seg* segs, std::int64_t nseg, std::int64_t tkv, std::int64_t H, std::int64_t Hkv,
                      std::int64_t D, A scale, bool causal) {
  __shared__ A k_sh[kWarps][kMaxD], v_sh[kWarps][kMaxD];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t w = blockIdx.x * static_cast<std::int64_t>(kWarps) + warp;
  if (w >= tkv * Hkv) return;
  const std::int64_t col = w / Hkv, hk = w % Hkv, grp = H / Hkv;
  for (std::int64_t d = lane; d < D; d += 32) {
    k_sh[warp][d] = ld(k + (col * Hkv + hk) * D + d);
    v_sh[warp][d] = ld(v + (col * Hkv + hk) * D + d);
  }
  __syncwarp();
  A ak[kPer], av[kPer];
  for (int t = 0; t < kPer; ++t) ak[t] = av[t] = 0;
  for (std::int64_t si = 0; si < nseg; ++si) {
    const Seg g = segs[si];
    if (col < g.kv_start || col >= g.kv_start + g.kv_len) continue;
    const std::int64_t j = col - g.kv_start;
    // Rows i that see key j: all, or (causal) i >= j + kv_pos0 - q_pos0.
    const std::int64_t i_lo = first_row_seeing(g, j, causal);
    for (std::int64_t h = hk * grp; h < (hk + 1) * grp; ++h)
      for (std::int64_t i0 = i_lo; i0 < g.q_len; i0 += 32) {
        const std::int64_t i = i0 + lane, row = g.q_start + i;
        A p = 0, ds = 0;
        if (i < g.q_len) {
          const A L = lse[row * H + h];
          if (!(isinf(L) && L < 0)) {
            const A s = dot_row(k_sh[warp], q + (row * H + h) * D, D) * scale;
            const A dp = dot_row(v_sh[warp], dout + (row * H + h) * D, D);
            p = exp(s - L);
            ds = p * (dp - delta[row * H + h]) * scale;
          }
        }
        const std::int64_t n = g.q_len - i0 < 32 ? g.q_len - i0 : 32;
        for (std::int64_t ii = 0; ii < n; ++ii) {
          const A pi = __shfl_sync(0xffffffffu, p, static_cast<int>(ii));
          const A dsi = __shfl_sync(0xffffffffu, ds, static_cast<int>(ii));
          const std::int64_t rr = g.q_start + i0 + ii;
          const S* qr = q + (rr * H + h) * D;
          const S* dor = dout + (rr * H + h) * D;
          for (int t = 0; t < kPer; ++t) {
            const std::int64_t d = lane + 32 * t;
            if (d < D) {
              av[t] += pi * ld(dor + d);
              ak[t] += dsi * ld(qr + d);
            }
          }
        }
      }
  }
  for (int t = 0; t < kPer; ++t) {
    const std::int64_t d = lane + 32 * t;
    if (d < D) {
      st(dk + (col * Hkv + hk) * D + d, ak[t]);
      st(dv + (col * Hkv + hk) * D + d, av[t]);
    }
  }
}

// o may be a wider accumulator than o_b (fp32 o, bf16 o_b: CP's ring merges without rounding).
template <class SO, class SB, class A>
__global__ void merge_k(SO* o, A* lse, const SB* ob, const A* lseb, std::int64_t rows, std::int64_t D) {
  const std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const A b = lseb[r], a = lse[r];
  if (isinf(b) && b < 0) return;
  if (isinf(a) && a < 0) {
    lse[r] = b;
    for (std::int64_t d = 0; d < D; ++d) st(o + r * D + d, ld(ob + r * D + d));
    return;
  }
  const A mx = max(a, b), mn = min(a, b);
  const A l = mx + log1p(exp(mn - mx));
  const A wa = exp(a - l), wb = exp(b - l);
  for (std::int64_t d = 0; d < D; ++d) st(o + r * D + d, ld(o + r * D + d) * wa + ld(ob + r * D + d) * wb);
  lse[r] = l;
}

// Segments and the flattened (segment, row) list, built on the host, on the device (stream-ordered).
struct HostPlan {
  std::vector<Seg> segs;
  std::vector<std::int64_t> row_seg, row_i;
  explicit HostPlan(const AttnParams& p) : segs(p.segments) {
    for (std::size_t gi = 0; gi < p.segments.size(); ++gi) {
      const auto& g = p.segments[gi];
      for (std::int64_t i = 0; i < g.q_len; ++i) {
        row_seg.push_back(static_cast<std::int64_t>(gi));
        row_i.push_back(i);
      }
    }
  }
};
struct SegPlan : HostPlan {
  DeviceArray<Seg> d_segs;
  DeviceIndex d_row_seg, d_row_i;
  std::int64_t nseg = 0, nrows = 0;
  explicit SegPlan(const AttnParams& p)
      : HostPlan(p),
        d_segs(&segs),
        d_row_seg(&row_seg),
        d_row_i(&row_i),
        nseg(static_cast<std::int64_t>(segs.size())),
        nrows(static_cast<std::int64_t>(row_seg.size())) {}
};

void check_types(const Tensor& q, std::initializer_list<const Tensor*> same, std::initializer_list<const Tensor*> lses,
                 const char* what) {
  const DType acc = q.dtype() == DType::F64 ? DType::F64 : DType::F32;
  require_cuda(q, what);
  for (const Tensor* t : same) {
    require_cuda(*t, what);
    HCP_CHECK(t->dtype() == q.dtype(), what, ": q, k, v, o, dout and gradients must share q's dtype (",
              to_string(q.dtype()), ")");
  }
  for (const Tensor* t : lses) {
    require_cuda(*t, what);
    HCP_CHECK(t->dtype() == acc, what, ": lse must be ", to_string(acc), " for ", to_string(q.dtype()), " inputs");
  }
}
attn_tc::Dims tc_dims(const AttnParams& p, std::int64_t tq, std::int64_t tkv) {
  return {&p.segments,
          static_cast<int>(p.heads),
          static_cast<int>(p.kv_heads),
          static_cast<int>(p.head_dim),
          tq,
          tkv,
          static_cast<float>(p.effective_scale()),
          p.mask == Mask::Causal};
}
unsigned warp_blocks(std::int64_t items) { return static_cast<unsigned>((items + kWarps - 1) / kWarps); }
}  // namespace

void attention_fwd(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const AttnParams& p) {
  check_types(q, {&o, &k, &v}, {&lse}, "attention_fwd");
  HCP_CHECK(p.head_dim <= kMaxD, "attention (CUDA): head_dim ", p.head_dim, " > ", kMaxD, " is not supported");
  const std::int64_t H = p.heads, Hkv = p.kv_heads, D = p.head_dim, tq = q.numel() / (H * D);
  if (tq == 0) return;
  const std::int64_t tkv = k.numel() / (Hkv * D);
  if (attn_tc::supported(q.dtype(), D, H, Hkv) && attn_tc::operands_ok({o.raw(), q.raw(), k.raw(), v.raw()}, tq, tkv)) {
    init_k<__nv_bfloat16, float>
        <<<blocks_for(tq * H * D, 256), 256>>>(dptr<__nv_bfloat16>(o), dptr<float>(lse), tq * H, D);
    attn_tc::fwd({dptr<__nv_bfloat16>(o), dptr<float>(lse), dptr<__nv_bfloat16>(q), dptr<__nv_bfloat16>(k),
                  dptr<__nv_bfloat16>(v), tc_dims(p, tq, tkv)});
    return;
  }
  SegPlan plan(p);
  HCP_CUDA_DISPATCH(q, {
    using A = typename Acc<S>::type;
    init_k<S, A><<<blocks_for(tq * H * D, 256), 256>>>(dptr<S>(o), dptr<A>(lse), tq * H, D);
    if (plan.nrows > 0)
      fwd_k<S, A><<<warp_blocks(plan.nrows * H), 32 * kWarps>>>(
          dptr<S>(o), dptr<A>(lse), dptr<S>(q), dptr<S>(k), dptr<S>(v), plan.d_segs.p, plan.d_row_seg.p, plan.d_row_i.p,
          plan.nrows, H, Hkv, D, A(p.effective_scale()), p.mask == Mask::Causal);
  });
  check_launch("attention_fwd");
}

void attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& o, const Tensor& lse, const Tensor& dout, const AttnParams& p) {
  check_types(q, {&dq, &dk, &dv, &k, &v, &o, &dout}, {&lse}, "attention_bwd");
  HCP_CHECK(p.head_dim <= kMaxD, "attention (CUDA): head_dim ", p.head_dim, " > ", kMaxD, " is not supported");
  const std::int64_t H = p.heads, Hkv = p.kv_heads, D = p.head_dim, tq = q.numel() / (H * D),
                     tkv = k.numel() / (Hkv * D);
  HCP_CUDA_CHECK(cudaMemsetAsync(dq.raw(), 0, dq.nbytes(), 0));
  if (attn_tc::supported(q.dtype(), D, H, Hkv) &&
      attn_tc::operands_ok({dq.raw(), dk.raw(), dv.raw(), q.raw(), k.raw(), v.raw(), o.raw(), dout.raw()}, tq, tkv)) {
    using B = __nv_bfloat16;
    attn_tc::bwd({dptr<B>(dq), dptr<B>(dk), dptr<B>(dv), dptr<B>(q), dptr<B>(k), dptr<B>(v), dptr<B>(o),
                  dptr<float>(lse), dptr<B>(dout), tc_dims(p, tq, tkv), p.bwd_kernel});
    return;
  }
  SegPlan plan(p);
  HCP_CUDA_DISPATCH(q, {
    using A = typename Acc<S>::type;
    const DeviceArray<A> dbuf(nullptr, static_cast<std::size_t>(std::max<std::int64_t>(tq * H, 1)));
    A* delta = dbuf.p;
    if (tq > 0) delta_k<S, A><<<blocks_for(tq * H, 256), 256>>>(delta, dptr<S>(dout), dptr<S>(o), tq * H, D);
    const A sc = A(p.effective_scale());
    const bool causal = p.mask == Mask::Causal;
    if (plan.nrows > 0)
      dq_k<S, A><<<warp_blocks(plan.nrows * H), 32 * kWarps>>>(
          dptr<S>(dq), dptr<S>(q), dptr<S>(k), dptr<S>(v), dptr<A>(lse), delta, dptr<S>(dout), plan.d_segs.p,
          plan.d_row_seg.p, plan.d_row_i.p, plan.nrows, H, Hkv, D, sc, causal);
    if (tkv > 0)
      dkv_k<S, A><<<warp_blocks(tkv * Hkv), 32 * kWarps>>>(dptr<S>(dk), dptr<S>(dv), dptr<S>(q), dptr<S>(k), dptr<S>(v),
                                                           dptr<A>(lse), delta, dptr<S>(dout), plan.d_segs.p, plan.nseg,
                                                           tkv, H, Hkv, D, sc, causal);
    check_launch("attention_bwd");
  });
}

void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_b, const Tensor& lse_b) {
  const std::int64_t rows = lse.numel(), D = o.numel() / rows;
  if (o.dtype() == DType::F32 && o_b.dtype() == DType::BF16) {  // fp32 accumulator, bf16 partial result
    check_types(o, {}, {&lse, &lse_b}, "attention_merge");
    require_cuda(o_b, "attention_merge");
    merge_k<float, __nv_bfloat16, float><<<blocks_for(rows, 256), 256>>>(
        dptr<float>(o), dptr<float>(lse), dptr<__nv_bfloat16>(o_b), dptr<float>(lse_b), rows, D);
  } else {
    check_types(o, {&o_b}, {&lse, &lse_b}, "attention_merge");
    HCP_CUDA_DISPATCH(o, {
      using A = typename Acc<S>::type;
      merge_k<S, S, A><<<blocks_for(rows, 256), 256>>>(dptr<S>(o), dptr<A>(lse), dptr<S>(o_b), dptr<A>(lse_b), rows, D);
    });
  }
  check_launch("attention_merge");
}

}  // namespace hcp::kernels::cuda_impl
