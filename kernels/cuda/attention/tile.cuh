// The tensor-core attention kernels' building blocks: segment and query-tile records, the K/V tile
// stream of the forward and dQ kernels, warpgroup products on 128-byte-swizzled tiles, the online
// softmax and the forward's epilogue.
// Private to kernels/cuda/attention/attention_tc.cu (its one translation unit).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/attention_segment.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hcp::kernels::cuda_impl::attn_tc {
using namespace hcp::cuda;
using namespace hcp::cuda::tc;
using bf16 = __nv_bfloat16;
constexpr int kBN = 64;  // keys per K/V tile (forward, dQ); queries per Q tile (dK/dV)
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ std::int64_t lmin(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ std::int64_t lmax(std::int64_t a, std::int64_t b) { return a > b ? a : b; }

// A segment (kernels/attention_segment.hpp) with its place in the fused backward's dQ semaphores.
struct SegD : AttnSegment {
  std::int64_t dq_blk = 0;  // the segment's first 64-row block
};
struct QTile {
  std::int64_t seg, i0;
};

// One row tile (MT = 1) as used by the backward kernels.
template <int N>
__device__ __forceinline__ void zero(float (&x)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.f;
}
// Store rows (16 per warp, fragment layout) scaled by f[half] to out[(row0 + r)·ld + c]; rows >= valid skipped.
template <int D>
__device__ __forceinline__ void store_rows(bf16* out, std::int64_t ld, int valid, int r0, const float (&acc)[D / 8][4],
                                           float f0, float f1) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) {
    const int c = nt * 8 + 2 * t;
    if (r0 + g < valid)
      *reinterpret_cast<__nv_bfloat162*>(out + (r0 + g) * ld + c) =
          __floats2bfloat162_rn(acc[nt][0] * f0, acc[nt][1] * f0);
    if (r0 + g + 8 < valid)
      *reinterpret_cast<__nv_bfloat162*>(out + (r0 + g + 8) * ld + c) =
          __floats2bfloat162_rn(acc[nt][2] * f1, acc[nt][3] * f1);
  }
}
// The same in fp32 (the partial sums of a head-split backward).
template <int D>
__device__ __forceinline__ void store_rows_f32(float* out, std::int64_t ld, int valid, int r0,
                                               const float (&acc)[D / 8][4], float f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) {
    const int c = nt * 8 + 2 * t;
    if (r0 + g < valid)
      *reinterpret_cast<float2*>(out + (r0 + g) * ld + c) = make_float2(acc[nt][0] * f, acc[nt][1] * f);
    if (r0 + g + 8 < valid)
      *reinterpret_cast<float2*>(out + (r0 + g + 8) * ld + c) = make_float2(acc[nt][2] * f, acc[nt][3] * f);
  }
}

// A cp.async double buffer's hand-over: issue the next fill (when there is one) as its own group, then
// wait until every earlier group, the current buffer's, has landed.
template <class Issue>
__device__ __forceinline__ void cp_async_next_then_wait(bool next, Issue&& issue) {
  if (next) {
    issue();
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

// The query tile of a (query tile, head) block of the forward and dQ kernels, and the K/V tiles of its
// segment streamed through a double buffer in shared memory (cp.async, one tile ahead).
// Tiles stored as D/64 blocks [rows][64] (the wgmma 128-byte-swizzle layout); the async proxy sees the
// landed tiles (wgmma reads shared memory through it). BN: keys per K/V tile.
template <int D, int NT, int BN = kBN>
struct QTileStream {
  SegD g;
  std::int64_t i0, qld, kld;
  int h, qvalid, ntiles;
  const bf16 *kbase, *vbase;
  bf16 *Ks, *Vs;  // [2][BN][D] each
  __device__ QTileStream(const SegD* segs, const QTile* tiles, int H, int Hkv, int bm, bool causal, const bf16* k,
                         const bf16* v, bf16* ks, bf16* vs)
      : Ks(ks), Vs(vs) {
    const QTile tl = tiles[blockIdx.x / H];
    h = blockIdx.x % H;
    const int hk = h / (H / Hkv);
    g = segs[tl.seg];
    i0 = tl.i0;
    qvalid = static_cast<int>(lmin(bm, g.q_len - i0));
    ntiles = static_cast<int>((keys_seen_by_rows(g, i0, bm, causal) + BN - 1) / BN);
    qld = static_cast<std::int64_t>(H) * D;
    kld = static_cast<std::int64_t>(Hkv) * D;
    kbase = k + (g.kv_start * Hkv + hk) * D;
    vbase = v + (g.kv_start * Hkv + hk) * D;
  }
  // Offset of the tile's first row (this head) in q / o / dout.
  __device__ std::int64_t q_offset() const { return (g.q_start + i0) * qld + static_cast<std::int64_t>(h) * D; }
  __device__ void load_kv(int t, int buf) const {
    const std::int64_t j0 = static_cast<std::int64_t>(t) * BN;
    const int valid = static_cast<int>(lmin(BN, g.kv_len - j0));
#pragma unroll
    for (int hb = 0; hb < D / 64; ++hb) {
      load_tile_async<64, NT>(Ks + buf * BN * D + hb * BN * 64, kbase + j0 * kld + 64 * hb, kld, BN, valid);
      load_tile_async<64, NT>(Vs + buf * BN * D + hb * BN * 64, vbase + j0 * kld + 64 * hb, kld, BN, valid);
    }
  }
  // Starts tile 0 (call after the block's own loads, before the first commit).
  __device__ void start() const {
    if (ntiles > 0) load_kv(0, 0);
  }
  // Waits until K/V tile t is in shared memory for every thread, having issued tile t+1 into the
  // other buffer; returns t's buffer. The caller syncs again before the buffer is refilled.
  __device__ int acquire(int t) const {
    const int buf = t & 1;
    cp_async_next_then_wait(t + 1 < ntiles, [&] { load_kv(t + 1, buf ^ 1); });
    ptx::fence_proxy_async();
    __syncthreads();
    return buf;
  }
};

// ---- the products of a warpgroup of 4 warps on 64-row tiles, one 16-row fragment tile per warp ----
// Hopper wgmma from tiles stored as D/64 blocks [64][64] in the 128-byte swizzle (1024-byte aligned),
// the warpgroup's 64 rows at once; the results in the mma.sync fragment layout (warp rows r0..).
template <int D, int NT>
__device__ __forceinline__ void load_rows(bf16* dst, const bf16* src, std::int64_t ld, int valid) {
#pragma unroll
  for (int hb = 0; hb < D / 64; ++hb) load_tile_async<64, NT>(dst + hb * 64 * 64, src + 64 * hb, ld, 64, valid);
}
// acc (16 rows x BN per warp) = X · Y^T, X a 64 x D and Y a BN x D tile (rows: the fragment rows /
// columns).
template <int D, int BN = kBN>
__device__ __forceinline__ void mm_xyt(float (&acc)[BN / 8][4], const bf16* X, const bf16* Y) {
  namespace wg = hcp::cuda::wg;
  zero(acc);
  float(&flat)[BN / 2] = reinterpret_cast<float(&)[BN / 2]>(acc);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int hb = kk / 4, ks = kk % 4;  // 64-column block, k16 slice in it (+32 bytes each)
    wg::mma_ss<BN, false, false>(flat, wg::desc_k128(X + hb * 64 * 64) + 2 * ks,
                                 wg::desc_k128(Y + hb * BN * 64) + 2 * ks);
  }
  wg::commit();
  wg::wait<0>();
}
// acc (16 rows x D per warp) += P · Y, P the C fragments of a previous product (16 x BN per warp), Y a
// BN x D tile (rows: the contraction).
template <int D, int BN = kBN>
__device__ __forceinline__ void mm_py(float (&acc)[D / 8][4], const float (&p)[BN / 8][4], const bf16* Y) {
  namespace wg = hcp::cuda::wg;
  unsigned pa[BN / 16][4];
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) c_to_a(pa[kk], p[2 * kk], p[2 * kk + 1]);
  float(&flat)[D / 2] = reinterpret_cast<float(&)[D / 2]>(acc);
  wg::fence();  // accumulators and P written by this thread before the products read them
  const std::uint64_t dy = wg::desc_mn128(Y, BN * 64 * sizeof(bf16));  // N-major: D/64 blocks [BN][64]
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) wg::mma_rs<D, true>(flat, pa[kk], dy + 128 * kk);  // 16 rows: +2048 bytes
  wg::commit();
  wg::wait<0>();
}

// 2^x as the single MUFU instruction (flush-to-zero: results below 2^-126 become 0, which no softmax
// weight here can tell from a denormal; exp2f adds a denormal scaling around it).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// One K/V tile of the forward's online softmax on S fragments (MT row tiles of 16 rows per warp):
// masks S (tile-local key c kept iff c < kv_rem and, on a causal edge, c <= diag + 16 m + 8 hf), turns
// it into P = exp2(s·sl2 − running max) in place and updates the running max / sum; rescale(m, hf, corr)
// takes each row half's factor for the output accumulators (exp2 of the old max minus the new).
template <int NT8, int MT, class Rescale>
__device__ __forceinline__ void softmax_tile(float (&s)[MT][NT8][4], float (&mx)[MT][2], float (&l)[MT][2], bool edge,
                                             int kv_rem, int diag, float sl2, Rescale&& rescale) {
  const int tg = threadIdx.x & 3;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (edge) {
          const int c = nt * 8 + 2 * tg + (e & 1);
          if (c >= kv_rem || c > diag + 16 * m + 8 * (e >> 1)) s[m][nt][e] = -INFINITY;
        }
      }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      // Max of the raw scores, then the exp2 domain (sl2 > 0): p = exp2(s·sl2 - max) as one FFMA.
      float raw = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt) raw = fmaxf(raw, fmaxf(s[m][nt][2 * hf], s[m][nt][2 * hf + 1]));
      const float mt = fmaxf(mx[m][hf], quad_max(raw) * sl2);
      const float base = mt == -INFINITY ? 0.f : mt;  // nothing visible yet: keep exp2 finite
      const float corr = ex2(mx[m][hf] - base);
      mx[m][hf] = mt;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt) {
        s[m][nt][2 * hf] = ex2(fmaf(s[m][nt][2 * hf], sl2, -base));
        s[m][nt][2 * hf + 1] = ex2(fmaf(s[m][nt][2 * hf + 1], sl2, -base));
        sum += s[m][nt][2 * hf] + s[m][nt][2 * hf + 1];
      }
      l[m][hf] = l[m][hf] * corr + sum;
      rescale(m, hf, corr);
    }
  }
}
// acc rows (fragment layout) of half hf scaled by corr.
template <int D>
__device__ __forceinline__ void rescale_rows(float (&acc)[D / 8][4], int hf, float corr) {
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    acc[dt][2 * hf] *= corr;
    acc[dt][2 * hf + 1] *= corr;
  }
}
// The forward's epilogue for MT row tiles of 16 rows per warp from row r0 of the query tile: O = acc / l
// into out (row stride ld), LSE (natural log) into lse[r · lse_ld]; rows >= valid skipped.
template <int D, int MT>
__device__ __forceinline__ void finish_rows(const float (&acc)[MT][D / 8][4], const float (&mx)[MT][2],
                                            float (&l)[MT][2], bf16* out, std::int64_t ld, int valid, int r0,
                                            float* lse, std::int64_t lse_ld) {
  const int lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    float inv[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      l[m][hf] = quad_sum(l[m][hf]);
      inv[hf] = l[m][hf] > 0.f ? 1.f / l[m][hf] : 0.f;
    }
    const int rm = r0 + 16 * m;
    store_rows<D>(out, ld, valid, rm, acc[m], inv[0], inv[1]);
    if (tg == 0)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = rm + gr + 8 * hf;
        if (r < valid) lse[r * lse_ld] = l[m][hf] > 0.f ? (mx[m][hf] + log2f(l[m][hf])) / kLog2e : -INFINITY;
      }
  }
}

// lse in the exp2 domain; a row with lse = -inf (sees nothing) maps to +inf so that P = exp2(s - L) = 0.
__device__ __forceinline__ float lse2(float L) { return L == -INFINITY ? INFINITY : L * kLog2e; }
}  // namespace hcp::kernels::cuda_impl::attn_tc
