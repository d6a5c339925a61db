// The attention backward's row kernels: delta = rowsum(dO∘O), the split backward's dQ kernel, and the
// fused backward's conversion of its fp32 dQ accumulator.
// Private to kernels/cuda/attention/attention_tc.cu (its one translation unit).
#pragma once
#include "kernels/cuda/attention/tile.cuh"

namespace hcp::kernels::cuda_impl::attn_tc {
__global__ void delta_k(float* delta, const bf16* dout, const bf16* o, std::int64_t rows, int D) {
  const std::int64_t r = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  float s = 0.f;
  for (int d = 2 * lane; d < D; d += 64) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dout + r * D + d));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(o + r * D + d));
    s += a.x * b.x + a.y * b.y;
  }
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) delta[r] = s;
}

template <int D, int NW>
__global__ void __launch_bounds__(NW * 32)
    dq_k(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const float* lse, const float* delta, const bf16* dout,
         const SegD* segs, const QTile* tiles, int H, int Hkv, float sl2, float scale, bool causal) {
  // NW = 8 (wgmma only): two warpgroups of 64 query rows sharing each K/V tile, as in the forward.
  constexpr int BM = 16 * NW, NT = 32 * NW, NT8 = kBN / 8;
  static_assert(kBN == 64 && (BM == 64 || BM == 128), "the product helpers take 64-row tiles");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(wg::align1024(smem_raw));
  bf16* dOs = Qs + BM * D;
  bf16* Ks = dOs + BM * D;
  const QTileStream<D, NT> qt(segs, tiles, H, Hkv, BM, causal, k, v, Ks, Ks + 2 * kBN * D);
  const SegD& g = qt.g;
  const std::int64_t i0 = qt.i0, qld = qt.qld, qoff = qt.q_offset();
  const int h = qt.h, qvalid = qt.qvalid;
#pragma unroll
  for (int w = 0; w < BM / 64; ++w) {
    load_rows<D, NT>(Qs + w * 64 * D, q + qoff + w * 64 * qld, qld, qvalid - 64 * w);
    load_rows<D, NT>(dOs + w * 64 * D, dout + qoff + w * 64 * qld, qld, qvalid - 64 * w);
  }
  qt.start();
  cp_async_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3, wgi = warp >> 2;
  const int r0 = warp * 16;
  // This warpgroup's 64 rows of Q and dO, and its last visible key (it skips the tiles past it).
  const bf16* Qw = Qs + wgi * 64 * D;
  const bf16* dOw = dOs + wgi * 64 * D;
  const std::int64_t wg_end = BM == 64            ? g.kv_len
                              : qvalid > 64 * wgi ? keys_seen_by_rows(g, i0 + 64 * wgi, 64, causal)
                                                  : 0;
  float L[2], Dl[2];
  std::int64_t qp[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = r0 + gr + 8 * hf;
    const std::int64_t row = (g.q_start + i0 + r) * H + h;
    L[hf] = r < qvalid ? lse2(lse[row]) : INFINITY;
    Dl[hf] = r < qvalid ? delta[row] : 0.f;
    qp[hf] = g.q_pos0 + i0 + r;
  }
  float acc[D / 8][4];
  zero(acc);
  for (int t = 0; t < qt.ntiles; ++t) {
    const int buf = qt.acquire(t);
    const bf16* Kt = qt.Ks + buf * kBN * D;
    const bf16* Vt = qt.Vs + buf * kBN * D;
    const std::int64_t j0 = static_cast<std::int64_t>(t) * kBN;
    if (j0 < wg_end) {  // uniform over the warpgroup (always true with one warpgroup)
      float s[NT8][4], dp[NT8][4];
      mm_xyt<D>(s, Qw, Kt);
      mm_xyt<D>(dp, dOw, Vt);
      const bool edge = j0 + kBN > g.kv_len || (causal && g.kv_pos0 + j0 + kBN - 1 > g.q_pos0 + i0 + r0);
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int hf = e >> 1;
          float p = ex2(s[nt][e] * sl2 - L[hf]);
          if (edge) {
            const std::int64_t j = j0 + nt * 8 + 2 * tg + (e & 1);
            if (j >= g.kv_len || (causal && g.kv_pos0 + j > qp[hf])) p = 0.f;
          }
          s[nt][e] = p * (dp[nt][e] - Dl[hf]);  // dS (unscaled)
        }
      mm_py<D>(acc, s, Kt);
    }
    __syncthreads();
  }
  store_rows<D>(dq + qoff, qld, qvalid, r0, acc, scale, scale);
}

// dq = bf16(dq_acc · scale), the fused backward's last step.
__global__ void dq_out_k(bf16* dq, const float* acc, std::int64_t n, float scale) {
  const std::int64_t i = 2 * (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x);
  if (i < n) {
    const float2 a = *reinterpret_cast<const float2*>(acc + i);
    *reinterpret_cast<__nv_bfloat162*>(dq + i) = __floats2bfloat162_rn(a.x * scale, a.y * scale);
  }
}
}  // namespace hcp::kernels::cuda_impl::attn_tc
