// Tensor-core flash attention for bf16, head_dim 64 or 128 (FlashAttention-2 structure; the products on
// Hopper wgmma, or on mma.sync when HCP_ATTN_MMA_SYNC is set in the environment, for side-by-side runs):
//
// forward   one block per (128-row query tile, head). Default (fwd_ws_k, FlashAttention-3 structure):
//           one block per SM, a producer warp loading Q and 128-key K/V tiles by TMA into mbarrier-
//           guarded stages, two consumer warpgroups of 64 rows that overlap the softmax of one tile
//           with the P·V product of the previous one and take turns on the tensor cores (1.16 against
//           1.77 ms at D 128 on the H200). HCP_ATTN_FWD_TWO_BLOCKS: two blocks per SM (fwd_wg_k), two
//           warpgroups sharing K/V tiles of 64 keys (128 at D = 64) double-buffered with cp.async;
//           mma.sync, 4 warps of 32 rows (fwd_k). S = Q·K^T and O += P·V on the tensor cores (P stays
//           in registers), online softmax in the exp2 domain, fp32 LSE.
// backward  deterministic: (1) delta = rowsum(dO∘O), a warp per row; split (default at D 64): (2) dQ: one
//           block per (query tile, head) recomputing P from the saved LSE and streaming K/V like the
//           forward; (3) dK/dV: one block per (tile of 16·NW keys on the kv token axis, kv head),
//           visiting every (segment, head of the group, query tile) that can see its keys in a fixed
//           order, with Q/dO/LSE/delta double-buffered. Fused (default at D 128): the dK/dV kernel on 128-key
//           tiles also forms dS·K per job and a dQ warp adds it to an fp32 accumulator by L2 bulk
//           reductions, key tile after key tile in a fixed order (per-block counters; the first share
//           of a row is stored, not added, where every row gets one), a producer warp loads each job's
//           Q and dO by TMA, then (4) one pass converts dQ to bf16. Every output element has one
//           summation order: bitwise repeatable.
// Segments are the host kernels' (q/kv ranges with position offsets; causal: kv_pos0 + j <= q_pos0 + i),
// so varlen THD batches and every CP strategy's blocks run on this path unchanged. Rows without a
// visible key get o = 0, lse = -inf (the caller pre-fills rows no segment covers).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cuda/attention_tc.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/tensor_map.hpp"
#include "kernels/cuda/wgmma.cuh"

namespace hcp::kernels::cuda_impl::attn_tc {
using namespace hcp::cuda;
using namespace hcp::cuda::tc;

namespace {
using bf16 = __nv_bfloat16;
constexpr int kBN = 64;  // keys per K/V tile (forward, dQ); queries per Q tile (dK/dV)
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ std::int64_t lmin(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ std::int64_t lmax(std::int64_t a, std::int64_t b) { return a > b ? a : b; }

struct SegD {
  std::int64_t q_start, q_len, kv_start, kv_len, q_pos0, kv_pos0;
  std::int64_t dq_blk;  // the segment's first 64-row block in the fused backward's dQ semaphores
};
struct QTile {
  std::int64_t seg, i0;
};

// Keys [0, n) of segment g that any of the query rows [i0, i0 + rows) may see.
__device__ __forceinline__ std::int64_t kv_end(const SegD& g, std::int64_t i0, int rows, bool causal) {
  if (!causal) return g.kv_len;
  std::int64_t n = g.q_pos0 + i0 + rows - g.kv_pos0;
  return n < 0 ? 0 : (n > g.kv_len ? g.kv_len : n);
}

// acc[m][NT8][4] += rows [r0 + 16m, +16) of X (tile [.][D]) times Y^T, Y a [NT8·8][D] tile stored
// [n][k], for MT row tiles m sharing each B fragment (fewer shared-memory reads per MMA).
template <int D, int NT8, int MT>
__device__ __forceinline__ void mm_abt(float (&acc)[MT][NT8][4], const bf16* X, int r0, const bf16* Y) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) load_a<D>(a[m], X, r0 + 16 * m, kk * 16);
#pragma unroll
    for (int np = 0; np < NT8 / 2; ++np) {
      unsigned b[4];
      load_b_nk<D>(b, Y, np * 16, kk * 16);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma(acc[m][2 * np], a[m], b[0], b[1]);
        mma(acc[m][2 * np + 1], a[m], b[2], b[3]);
      }
    }
  }
}
// acc[m][D/8][4] += P_m (16 x 8·NT8, C fragments in registers) times Y, Y a [8·NT8][D] tile stored [k][n].
template <int D, int NT8, int MT>
__device__ __forceinline__ void mm_pb(float (&acc)[MT][D / 8][4], const float (&p)[MT][NT8][4], const bf16* Y) {
#pragma unroll
  for (int kk = 0; kk < NT8 / 2; ++kk) {
    unsigned a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) c_to_a(a[m], p[m][2 * kk], p[m][2 * kk + 1]);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      unsigned b[4];
      load_b_kn<D>(b, Y, kk * 16, dp * 16);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma(acc[m][2 * dp], a[m], b[0], b[1]);
        mma(acc[m][2 * dp + 1], a[m], b[2], b[3]);
      }
    }
  }
}
// One row tile (MT = 1) as used by the backward kernels.
template <int N> using Frag1 = float[1][N][4];
template <int N> __device__ __forceinline__ Frag1<N>& one(float (&x)[N][4]) { return reinterpret_cast<Frag1<N>&>(x); }
template <int N> __device__ __forceinline__ const Frag1<N>& one(const float (&x)[N][4]) {
  return reinterpret_cast<const Frag1<N>&>(x);
}
template <int N> __device__ __forceinline__ void zero(float (&x)[N][4]) {
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
      *reinterpret_cast<__nv_bfloat162*>(out + (r0 + g) * ld + c) = __floats2bfloat162_rn(acc[nt][0] * f0, acc[nt][1] * f0);
    if (r0 + g + 8 < valid)
      *reinterpret_cast<__nv_bfloat162*>(out + (r0 + g + 8) * ld + c) =
          __floats2bfloat162_rn(acc[nt][2] * f1, acc[nt][3] * f1);
  }
}

// A cp.async double buffer's hand-over: issue the next fill (when there is one) as its own group, then
// wait until every earlier group, the current buffer's, has landed.
template <class Issue> __device__ __forceinline__ void cp_async_next_then_wait(bool next, Issue&& issue) {
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
// kSplit: tiles stored as D/64 blocks [rows][64] (the wgmma 128-byte-swizzle layout), and the async
// proxy sees the landed tiles (wgmma reads shared memory through it). BN: keys per K/V tile.
template <int D, int NT, bool kSplit = false, int BN = kBN> struct QTileStream {
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
    ntiles = static_cast<int>((kv_end(g, i0, bm, causal) + BN - 1) / BN);
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
    if constexpr (kSplit) {
#pragma unroll
      for (int hb = 0; hb < D / 64; ++hb) {
        load_tile_async<64, NT>(Ks + buf * BN * D + hb * BN * 64, kbase + j0 * kld + 64 * hb, kld, BN, valid);
        load_tile_async<64, NT>(Vs + buf * BN * D + hb * BN * 64, vbase + j0 * kld + 64 * hb, kld, BN, valid);
      }
    } else {
      load_tile_async<D, NT>(Ks + buf * BN * D, kbase + j0 * kld, kld, BN, valid);
      load_tile_async<D, NT>(Vs + buf * BN * D, vbase + j0 * kld, kld, BN, valid);
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
    if constexpr (kSplit) hcp::cuda::wg::fence_proxy_async();
    __syncthreads();
    return buf;
  }
};

// ---- the products of a warpgroup of 4 warps on 64-row tiles, one 16-row fragment tile per warp ----
// kWg false: mma.sync from [rows][D] tiles (`at<D>` swizzle), warp rows r0..; true: Hopper wgmma from
// tiles stored as D/64 blocks [64][64] in the 128-byte swizzle (1024-byte aligned), the warpgroup's 64
// rows at once. Both leave the same fragment layout.
template <int D, int NT, bool kWg> __device__ __forceinline__ void load_rows(bf16* dst, const bf16* src, std::int64_t ld, int valid) {
  if constexpr (kWg) {
#pragma unroll
    for (int hb = 0; hb < D / 64; ++hb) load_tile_async<64, NT>(dst + hb * 64 * 64, src + 64 * hb, ld, 64, valid);
  } else {
    load_tile_async<D, NT>(dst, src, ld, 64, valid);
  }
}
// acc (16 rows x BN per warp) = X · Y^T, X a 64 x D and Y a BN x D tile (rows: the fragment rows /
// columns); BN other than kBN on wgmma only.
template <int D, bool kWg, int BN = kBN>
__device__ __forceinline__ void mm_xyt(float (&acc)[BN / 8][4], const bf16* X, int r0, const bf16* Y) {
  static_assert(kWg || BN == kBN, "the mma.sync products take 64-row tiles");
  zero(acc);
  if constexpr (kWg) {
    namespace wg = hcp::cuda::wg;
    float(&flat)[BN / 2] = reinterpret_cast<float(&)[BN / 2]>(acc);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int hb = kk / 4, ks = kk % 4;  // 64-column block, k16 slice in it (+32 bytes each)
      wg::mma_ss<BN, false, false>(flat, wg::desc_k128(X + hb * 64 * 64) + 2 * ks, wg::desc_k128(Y + hb * BN * 64) + 2 * ks);
    }
    wg::commit();
    wg::wait<0>();
  } else {
    mm_abt<D, kBN / 8, 1>(one(acc), X, r0, Y);
  }
}
// acc (16 rows x D per warp) += P · Y, P the C fragments of a previous product (16 x BN per warp), Y a
// BN x D tile (rows: the contraction); BN other than kBN on wgmma only.
template <int D, bool kWg, int BN = kBN>
__device__ __forceinline__ void mm_py(float (&acc)[D / 8][4], const float (&p)[BN / 8][4], const bf16* Y) {
  static_assert(kWg || BN == kBN, "the mma.sync products take 64-row tiles");
  if constexpr (kWg) {
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
  } else {
    mm_pb<D, kBN / 8, 1>(one(acc), one(p), Y);
  }
}
// Shared memory of the tile kernels: 1024-byte aligned for the wgmma layout.
template <bool kWg> __device__ __forceinline__ unsigned char* tile_smem(unsigned char* raw) {
  return kWg ? wg::align1024(raw) : raw;
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
template <int NT8, int MT, bool kFtz, class Rescale>
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
      const auto e2 = [](float x) { return kFtz ? ex2(x) : exp2f(x); };
      const float corr = e2(mx[m][hf] - base);
      mx[m][hf] = mt;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt) {
        s[m][nt][2 * hf] = e2(fmaf(s[m][nt][2 * hf], sl2, -base));
        s[m][nt][2 * hf + 1] = e2(fmaf(s[m][nt][2 * hf + 1], sl2, -base));
        sum += s[m][nt][2 * hf] + s[m][nt][2 * hf + 1];
      }
      l[m][hf] = l[m][hf] * corr + sum;
      rescale(m, hf, corr);
    }
  }
}
// acc rows (fragment layout) of half hf scaled by corr.
template <int D> __device__ __forceinline__ void rescale_rows(float (&acc)[D / 8][4], int hf, float corr) {
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    acc[dt][2 * hf] *= corr;
    acc[dt][2 * hf + 1] *= corr;
  }
}
// softmax_tile with the output accumulators rescaled at once.
template <int D, int NT8, int MT, bool kFtz = false>
__device__ __forceinline__ void online_softmax(float (&s)[MT][NT8][4], float (&mx)[MT][2], float (&l)[MT][2],
                                               float (&acc)[MT][D / 8][4], bool edge, int kv_rem, int diag, float sl2) {
  softmax_tile<NT8, MT, kFtz>(s, mx, l, edge, kv_rem, diag, sl2,
                              [&](int m, int hf, float corr) { rescale_rows<D>(acc[m], hf, corr); });
}

// The forward's epilogue for MT row tiles of 16 rows per warp from row r0 of the query tile: O = acc / l
// into out (row stride ld), LSE (natural log) into lse[r · lse_ld]; rows >= valid skipped.
template <int D, int MT>
__device__ __forceinline__ void finish_rows(const float (&acc)[MT][D / 8][4], const float (&mx)[MT][2], float (&l)[MT][2],
                                            bf16* out, std::int64_t ld, int valid, int r0, float* lse, std::int64_t lse_ld) {
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

// Named barriers (0 is __syncthreads): n threads meet at barrier id; bar_arrive does not wait.
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

// ---- forward --------------------------------------------------------------------------------------
// Each warp owns MT row tiles of 16 query rows; BM = 16·MT·NW rows per block.
template <int D, int NW, int MT>
__global__ void __launch_bounds__(NW * 32) fwd_k(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                                 const SegD* segs, const QTile* tiles, int H, int Hkv, float sl2,
                                                 bool causal) {
  constexpr int BM = 16 * MT * NW, NT = 32 * NW, NT8 = kBN / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + BM * D;
  const QTileStream<D, NT> qt(segs, tiles, H, Hkv, BM, causal, k, v, Ks, Ks + 2 * kBN * D);
  const SegD& g = qt.g;
  const std::int64_t i0 = qt.i0, qld = qt.qld;
  const int h = qt.h, qvalid = qt.qvalid;
  load_tile_async<D, NT>(Qs, q + qt.q_offset(), qld, BM, qvalid);
  qt.start();
  cp_async_commit();

  const int warp = threadIdx.x >> 5, gr = (threadIdx.x & 31) >> 2;
  const int r0 = warp * 16 * MT;
  float acc[MT][D / 8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m) zero(acc[m]);
  // Per row tile m and half hf (fragment rows gr and gr + 8): running max (exp2 domain), partial sum.
  float mx[MT][2], l[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) mx[m][0] = mx[m][1] = -INFINITY, l[m][0] = l[m][1] = 0.f;
  const std::int64_t qp0 = g.q_pos0 + i0 + r0 + gr;  // position of row (m, hf): qp0 + 16m + 8hf

  for (int t = 0; t < qt.ntiles; ++t) {
    const int buf = qt.acquire(t);
    const bf16* Kt = qt.Ks + buf * kBN * D;
    const bf16* Vt = qt.Vs + buf * kBN * D;
    float s[MT][NT8][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) zero(s[m]);
    mm_abt<D, NT8, MT>(s, Qs, r0, Kt);
    const std::int64_t j0 = static_cast<std::int64_t>(t) * kBN;
    const bool edge = j0 + kBN > g.kv_len || (causal && g.kv_pos0 + j0 + kBN - 1 > g.q_pos0 + i0 + r0);
    // In tile-local 32-bit terms: key c is kept iff c < kv_rem and (!causal or c <= diag + 16m + 8hf).
    const int kv_rem = static_cast<int>(lmin(kBN, g.kv_len - j0));
    const int diag = causal ? static_cast<int>(lmax(lmin(qp0 - g.kv_pos0 - j0, 1 << 20), -(1 << 20))) : (1 << 20);
    online_softmax<D, NT8, MT>(s, mx, l, acc, edge, kv_rem, diag, sl2);
    mm_pb<D, NT8, MT>(acc, s, Vt);
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }
  finish_rows<D, MT>(acc, mx, l, o + qt.q_offset(), qld, qvalid, r0, lse + (g.q_start + i0) * H + h, H);
}

// Hopper forward: two warpgroups per block of 128 query rows sharing each streamed K/V tile (a 64-row
// block would bring every K/V tile from L2 twice as often: 64 flops per byte, the bound of the
// one-warpgroup version). Warp w owns rows 16 w .. 16 w + 15 (the fragment layout of fwd_k with MT = 1,
// so the masking, online softmax and epilogue are shared). Q and the K/V tiles are stored as [rows][64]
// blocks in the 128-byte swizzle, each warpgroup's 64 Q rows as their own D/64 blocks; S = Q·K^T is
// wgmma m64n64k16 with both operands in shared memory (K-major), O += P·V is wgmma m64nDk16 with P from
// registers and V N-major in shared memory. A warpgroup skips the causal tiles past its own rows' last
// visible key (it still takes part in the block's tile hand-over).
// BN: keys per K/V tile, 64, or 128 at D = 64 (S then m64n128k16: half the tile hand-overs, product
// waits and row reductions per key; 80 KB of shared memory, two blocks per SM still).
constexpr int kWgRows = 128;
template <int D, int BN = kBN> constexpr std::size_t fwd_wg_smem() {
  return static_cast<std::size_t>(kWgRows + 4 * BN) * D * sizeof(bf16) + 1024;
}
template <int D, bool kFtz, int BN = kBN>
__global__ void __launch_bounds__(256, 2) fwd_wg_k(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                                   const SegD* segs, const QTile* tiles, int H, int Hkv, float sl2,
                                                   bool causal) {
  constexpr int BM = kWgRows, NT = 256, NT8 = BN / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(tile_smem<true>(smem_raw));  // [2][D/64][64][64]
  bf16* Ks = Qs + BM * D;                                          // [2][D/64][BN][64]
  const QTileStream<D, NT, true, BN> qt(segs, tiles, H, Hkv, BM, causal, k, v, Ks, Ks + 2 * BN * D);
  const SegD& g = qt.g;
  const std::int64_t i0 = qt.i0, qld = qt.qld;
  const int h = qt.h, qvalid = qt.qvalid;
#pragma unroll
  for (int w = 0; w < 2; ++w) load_rows<D, NT, true>(Qs + w * 64 * D, q + qt.q_offset() + w * 64 * qld, qld, qvalid - 64 * w);
  qt.start();
  cp_async_commit();

  const int warp = threadIdx.x >> 5, gr = (threadIdx.x & 31) >> 2, wgi = warp >> 2;
  const int r0 = warp * 16;
  const bf16* Qw = Qs + wgi * 64 * D;
  const std::int64_t wg_end = qvalid > 64 * wgi ? kv_end(g, i0 + 64 * wgi, 64, causal) : 0;
  float acc[1][D / 8][4];
  zero(acc[0]);
  float mx[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.f, 0.f}};
  const std::int64_t qp0 = g.q_pos0 + i0 + r0 + gr;

  for (int t = 0; t < qt.ntiles; ++t) {
    const int buf = qt.acquire(t);
    const std::int64_t j0 = static_cast<std::int64_t>(t) * BN;
    if (j0 < wg_end) {  // uniform over the warpgroup
      const bf16* Kt = qt.Ks + buf * BN * D;
      const bf16* Vt = qt.Vs + buf * BN * D;
      float s[1][NT8][4];
      mm_xyt<D, true, BN>(s[0], Qw, r0, Kt);
      const bool edge = j0 + BN > g.kv_len || (causal && g.kv_pos0 + j0 + BN - 1 > g.q_pos0 + i0 + r0);
      const int kv_rem = static_cast<int>(lmin(BN, g.kv_len - j0));
      const int diag = causal ? static_cast<int>(lmax(lmin(qp0 - g.kv_pos0 - j0, 1 << 20), -(1 << 20))) : (1 << 20);
      online_softmax<D, NT8, 1, kFtz>(s, mx, l, acc, edge, kv_rem, diag, sl2);
      mm_py<D, true, BN>(acc[0], s[0], Vt);
    }
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }
  finish_rows<D, 1>(acc, mx, l, o + qt.q_offset(), qld, qvalid, r0, lse + (g.q_start + i0) * H + h, H);
}

// ---- forward, warp-specialised (Hopper; the default) ----------------------------------------------
// One block per (128-row query tile, head), one block per SM, 384 threads. Warpgroup 0 hands its
// registers to the others (setmaxnreg) and one of its warps produces: Q once by TMA, then per K/V tile
// of BN keys K and V by TMA into rings of S stages (2; 3 fit at D = 128, HCP_ATTN_FWD_STAGES3, and
// measured the same), each stage guarded by a "full" and an "empty" mbarrier; K_t goes out with
// V_{t-1}, which a consumer needs together. A segment's last V tile, when partial, is loaded by that
// warp with the keys past the segment zeroed (their P is 0, which must not meet a non-finite value; K
// needs no care: S is masked there). Warpgroups 1 and 2 consume 64 query rows each: in iteration t a consumer issues
// S_t = Q·K_t^T and O += P_{t-1}·V_{t-1} back to back, works the softmax of S_t while the second
// product still runs, and rescales O once it is done (P_{t-1} waits in registers as bf16); with
// `turns` the two consumers take turns to issue (two named barriers), so that one's softmax runs under
// the other's products (HCP_ATTN_FWD_NO_TURNS drops them: the same time within run-to-run noise on
// the H200). Both consumers walk all the block's K/V tiles (a warpgroup's tiles past its rows' last
// visible key are masked out), which keeps the turns paired.
constexpr int kWsProdRegs = 24, kWsConsRegs = 240;
static_assert(2 * (kWsConsRegs - 168) <= 168 - kWsProdRegs, "setmaxnreg: the consumers take what the producers free");
constexpr int kBarTurn = 1;  // +consumer warpgroup: "your turn to issue products"
template <int D, int BN, int S> constexpr std::size_t fwd_ws_smem() {
  return static_cast<std::size_t>(kWgRows + 2 * S * BN) * D * sizeof(bf16) + (1 + 4 * S) * sizeof(std::uint64_t) + 1024;
}
template <int D, int BN, int S>
__global__ void __launch_bounds__(384, 1)
    fwd_ws_k(bf16* o, float* lse, const bf16* v, const SegD* segs, const QTile* tiles, int H, int Hkv, float sl2,
             bool causal, bool turns, const __grid_constant__ TensorMap qmap, const __grid_constant__ TensorMap kmap,
             const __grid_constant__ TensorMap vmap) {
  namespace wg = hcp::cuda::wg;
  constexpr int BM = kWgRows, NT8 = BN / 8;
  constexpr unsigned kTileBytes = BN * D * sizeof(bf16);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(tile_smem<true>(smem_raw));  // [2][D/64][64][64]
  bf16* Ks = Qs + BM * D;                                          // [S][D/64][BN][64]
  bf16* Vs = Ks + S * BN * D;                                      // [S][D/64][BN][64]
  auto* bars = reinterpret_cast<std::uint64_t*>(Vs + S * BN * D);
  std::uint64_t *q_full = bars, *k_full = bars + 1, *v_full = k_full + S, *k_empty = v_full + S, *v_empty = k_empty + S;
  const QTile tl = tiles[blockIdx.x / H];
  const int h = blockIdx.x % H, hk = h / (H / Hkv);
  const SegD g = segs[tl.seg];
  const std::int64_t i0 = tl.i0;
  const int qvalid = static_cast<int>(lmin(BM, g.q_len - i0));
  const int ntiles = static_cast<int>((kv_end(g, i0, BM, causal) + BN - 1) / BN);
  if (threadIdx.x == 0) {
    wg::mbar_init(q_full, 1);
#pragma unroll
    for (int st = 0; st < S; ++st) {
      wg::mbar_init(&k_full[st], 1);    // the producer's expect_tx; the TMA bytes
      wg::mbar_init(&v_full[st], 32);   // every producer lane (TMA bytes, or its stores of a partial tile)
      wg::mbar_init(&k_empty[st], 8);   // one lane per consumer warp
      wg::mbar_init(&v_empty[st], 8);
    }
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < 4) {  // the producer warpgroup
    wg::reg_dealloc<kWsProdRegs>();
    if (warp != 0) return;
    if (lane == 0) {
      wg::mbar_arrive_expect_tx(q_full, BM * D * sizeof(bf16));
#pragma unroll
      for (int w = 0; w < 2; ++w)
#pragma unroll
        for (int hb = 0; hb < D / 64; ++hb)
          wg::tma_load_2d(Qs + (w * (D / 64) + hb) * 64 * 64, &qmap, h * D + 64 * hb,
                          static_cast<int>(g.q_start + i0 + 64 * w), q_full);
    }
    const std::int64_t kld = static_cast<std::int64_t>(Hkv) * D;
    // Tile t's stage, its first key row, and the phase in which the consumers released the stage's
    // previous tile (t - S).
    const auto stage = [&](int t) { return t % S; };
    const auto row_of = [&](int t) { return static_cast<int>(g.kv_start + static_cast<std::int64_t>(t) * BN); };
    const auto freed = [&](int t) { return static_cast<unsigned>((t / S) - 1) & 1u; };
    // K_t, then V_{t-1}: a consumer's iteration t takes both, and they need only iteration t - 2 done.
    for (int t = 0; t <= ntiles; ++t) {
      if (t < ntiles && lane == 0) {
        const int st = stage(t);
        if (t >= S) wg::mbar_wait(&k_empty[st], freed(t));
        wg::mbar_arrive_expect_tx(&k_full[st], kTileBytes);
#pragma unroll
        for (int hb = 0; hb < D / 64; ++hb)
          wg::tma_load_2d(Ks + (st * (D / 64) + hb) * BN * 64, &kmap, hk * D + 64 * hb, row_of(t), &k_full[st]);
      }
      if (t == 0) continue;
      const int tv = t - 1, st = stage(tv);
      if (tv >= S) wg::mbar_wait(&v_empty[st], freed(tv));
      bf16* vt = Vs + st * BN * D;
      const std::int64_t j0 = static_cast<std::int64_t>(tv) * BN;
      const int valid = static_cast<int>(lmin(BN, g.kv_len - j0));
      if (valid == BN) {
        if (lane == 0) {
          wg::mbar_arrive_expect_tx(&v_full[st], kTileBytes);
#pragma unroll
          for (int hb = 0; hb < D / 64; ++hb)
            wg::tma_load_2d(vt + hb * BN * 64, &vmap, hk * D + 64 * hb, row_of(tv), &v_full[st]);
        } else {
          wg::mbar_arrive(&v_full[st]);
        }
      } else {
#pragma unroll
        for (int hb = 0; hb < D / 64; ++hb)
          load_tile_async<64, 32>(vt + hb * BN * 64, v + (g.kv_start + j0) * kld + hk * D + 64 * hb, kld, BN, valid);
        cp_async_commit();
        cp_async_wait<0>();
        wg::fence_proxy_async();  // the products read the tile through the async proxy
        wg::mbar_arrive(&v_full[st]);
      }
    }
    return;
  }
  wg::reg_alloc<kWsConsRegs>();
  const int cw = warp - 4, wgi = cw >> 2, gr = lane >> 2;  // consumer warp, its warpgroup, fragment row
  const int r0 = cw * 16;
  const bf16* Qw = Qs + wgi * 64 * D;
  const std::int64_t qp0 = g.q_pos0 + i0 + r0 + gr;
  float acc[1][D / 8][4];
  zero(acc[0]);
  float(&oflat)[D / 2] = reinterpret_cast<float(&)[D / 2]>(acc[0]);
  float mx[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.f, 0.f}};
  unsigned pa[BN / 16][4];  // P of the previous tile, the A operand of its P·V
  const int me = kBarTurn + wgi, other = kBarTurn + (wgi ^ 1);
  // O += P_{t-1}·V_{t-1} (issued, not waited for).
  const auto issue_pv = [&](int t) {
    const bf16* Vt = Vs + (t % S) * BN * D;
    const std::uint64_t dv = wg::desc_mn128(Vt, BN * 64 * sizeof(bf16));  // N-major: D/64 blocks [BN][64]
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) wg::mma_rs<D, true>(oflat, pa[kk], dv + 128 * kk);
    wg::commit();
  };
  const auto release = [&](std::uint64_t* bar) {
    __syncwarp();
    if (lane == 0) wg::mbar_arrive(bar);
  };
  // S_t = Q·K_t^T (issued, not waited for).
  float s[1][NT8][4];
  float(&sflat)[BN / 2] = reinterpret_cast<float(&)[BN / 2]>(s[0]);
  const auto issue_s = [&](int t) {
    const bf16* Kt = Ks + (t % S) * BN * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int hb = kk / 4, ks = kk % 4;  // 64-column block, k16 slice in it (+32 bytes each)
      const std::uint64_t da = wg::desc_k128(Qw + hb * 64 * 64) + 2 * ks, db = wg::desc_k128(Kt + hb * BN * 64) + 2 * ks;
      if (kk == 0) wg::mma_ss<BN, false, false, true>(sflat, da, db);
      else wg::mma_ss<BN, false, false>(sflat, da, db);
    }
    wg::commit();
  };
  // The softmax of S_t (P_t in s); corr: the factors for O.
  float corr[2];
  const auto softmax = [&](int t) {
    const std::int64_t j0 = static_cast<std::int64_t>(t) * BN;
    const bool edge = j0 + BN > g.kv_len || (causal && g.kv_pos0 + j0 + BN - 1 > g.q_pos0 + i0 + r0);
    const int kv_rem = static_cast<int>(lmin(BN, g.kv_len - j0));
    const int diag = causal ? static_cast<int>(lmax(lmin(qp0 - g.kv_pos0 - j0, 1 << 20), -(1 << 20))) : (1 << 20);
    softmax_tile<NT8, 1, true>(s, mx, l, edge, kv_rem, diag, sl2, [&](int, int hf, float c) { corr[hf] = c; });
  };
  const auto keep_p = [&] {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) c_to_a(pa[kk], s[0][2 * kk], s[0][2 * kk + 1]);
  };
  if (turns && wgi == 1) bar_arrive(kBarTurn, 256);  // warpgroup 0 issues first
  wg::mbar_wait(q_full, 0);
  if (ntiles > 0) {  // tile 0: S only (O is still zero)
    wg::mbar_wait(&k_full[0], 0);
    if (turns) bar_sync(me, 256);
    wg::fence();
    issue_s(0);
    if (turns) bar_arrive(other, 256);
    wg::wait<0>();
    release(&k_empty[0]);
    softmax(0);
    keep_p();
  }
  for (int t = 1; t < ntiles; ++t) {
    const int st = t % S, pst = (t - 1) % S;
    wg::mbar_wait(&k_full[st], (t / S) & 1);
    wg::mbar_wait(&v_full[pst], ((t - 1) / S) & 1);
    if (turns) bar_sync(me, 256);
    wg::fence();
    issue_s(t);
    issue_pv(t - 1);
    if (turns) bar_arrive(other, 256);
    wg::wait<1>();  // S_t
    release(&k_empty[st]);
    softmax(t);
    wg::wait<0>();  // O += P_{t-1}·V_{t-1}
    release(&v_empty[pst]);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) rescale_rows<D>(acc[0], hf, corr[hf]);
    keep_p();
  }
  if (turns && wgi == 0) bar_sync(me, 256);  // warpgroup 1's last "your turn"
  if (ntiles > 0) {
    const int lst = (ntiles - 1) % S;
    wg::mbar_wait(&v_full[lst], ((ntiles - 1) / S) & 1);
    wg::fence();
    issue_pv(ntiles - 1);
    wg::wait<0>();
  }
  const std::int64_t qld = static_cast<std::int64_t>(H) * D;
  finish_rows<D, 1>(acc, mx, l, o + (g.q_start + i0) * qld + static_cast<std::int64_t>(h) * D, qld, qvalid, r0,
                    lse + (g.q_start + i0) * H + h, H);
}

// ---- backward ---------------------------------------------------------------------------------------
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
// lse in the exp2 domain; a row with lse = -inf (sees nothing) maps to +inf so that P = exp2(s - L) = 0.
__device__ __forceinline__ float lse2(float L) { return L == -INFINITY ? INFINITY : L * kLog2e; }

template <int D, int NW, bool kWg>
__global__ void __launch_bounds__(NW * 32) dq_k(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                                                const float* delta, const bf16* dout, const SegD* segs,
                                                const QTile* tiles, int H, int Hkv, float sl2, float scale,
                                                bool causal) {
  // NW = 8 (wgmma only): two warpgroups of 64 query rows sharing each K/V tile, as in the forward.
  constexpr int BM = 16 * NW, NT = 32 * NW, NT8 = kBN / 8;
  static_assert(kBN == 64 && (BM == 64 || (kWg && BM == 128)), "the product helpers take 64-row tiles");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(tile_smem<kWg>(smem_raw));
  bf16* dOs = Qs + BM * D;
  bf16* Ks = dOs + BM * D;
  const QTileStream<D, NT, kWg> qt(segs, tiles, H, Hkv, BM, causal, k, v, Ks, Ks + 2 * kBN * D);
  const SegD& g = qt.g;
  const std::int64_t i0 = qt.i0, qld = qt.qld, qoff = qt.q_offset();
  const int h = qt.h, qvalid = qt.qvalid;
#pragma unroll
  for (int w = 0; w < BM / 64; ++w) {
    load_rows<D, NT, kWg>(Qs + w * 64 * D, q + qoff + w * 64 * qld, qld, qvalid - 64 * w);
    load_rows<D, NT, kWg>(dOs + w * 64 * D, dout + qoff + w * 64 * qld, qld, qvalid - 64 * w);
  }
  qt.start();
  cp_async_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3, wgi = warp >> 2;
  const int r0 = warp * 16;
  // This warpgroup's 64 rows of Q and dO, and its last visible key (it skips the tiles past it).
  const bf16* Qw = Qs + wgi * 64 * D;
  const bf16* dOw = dOs + wgi * 64 * D;
  const std::int64_t wg_end = BM == 64 ? g.kv_len : qvalid > 64 * wgi ? kv_end(g, i0 + 64 * wgi, 64, causal) : 0;
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
    mm_xyt<D, kWg>(s, Qw, r0, Kt);
    mm_xyt<D, kWg>(dp, dOw, r0, Vt);
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
    mm_py<D, kWg>(acc, s, Kt);
    }
    __syncthreads();
  }
  store_rows<D>(dq + qoff, qld, qvalid, r0, acc, scale, scale);
}

// The fused backward's dQ: ordered fp32 adds of each job's dS·K to dq_acc by a dQ warp (below).
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
// dst[0, bytes) += src[0, bytes) (fp32, an L2 reduction by the bulk-copy engine; 16-byte aligned, bytes % 16 == 0).
__device__ __forceinline__ void bulk_reduce_add(float* dst, const float* src, unsigned bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(src));
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(s), "r"(bytes)
               : "memory");
}
// dst[0, bytes) = src[0, bytes) (a bulk copy to global memory; same alignment rules).
__device__ __forceinline__ void bulk_store(float* dst, const float* src, unsigned bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(src));
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(s), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Named barriers of the fused kernel (0 is __syncthreads): the consumers' own, and per dQ buffer an
// "empty" and a "full" one between the consumers and the dQ warp.
constexpr int kBarCons = 1, kBarEmpty = 2, kBarFull = 4;  // +buffer for the last two
constexpr int kBarDsFree = 6;  // kDqTma: +warpgroup, "my reads of dS^T are done"
// Registers per thread of the fused kernel's dQ warpgroup and consumers. The block starts at 168 per
// thread (65536 / 384, in steps of 8) and the consumers can only take what the dQ warpgroup gives
// up: 2 (cons - 168) <= 168 - warp. (With 32 and 240 the H200 run stalled: every dQ warp trapped
// waiting for its predecessor's counter, as consumers blocked in setmaxnreg.inc would make it.)
// ptxas reports (C7508) "'setmaxnreg' ignored; unable to determine register count at entry" for the
// D 64 kDqCpAsync instantiation only (launch bounds without a block count); at D 128 it plans the
// consumers in 240 registers either way (the same spills with a block count, and the same time:
// 5.71-5.72 against 5.67-5.72 ms on the H200).
constexpr int kDqWarpRegs = 24, kDqConsRegs = 240;
static_assert(2 * (kDqConsRegs - 168) <= 168 - kDqWarpRegs, "setmaxnreg: the consumers take what the dQ warpgroup frees");
// The dK/dV kernel's dQ modes: none (the split backward); fused, 8 consumer warps and a dQ warpgroup
// (384 threads) that gives its registers to the consumers by setmaxnreg — kDqCpAsync, the consumers
// load each job's Q, dO, LSE and delta rows themselves (cp.async, double-buffered; three consumer
// barriers per job); kDqTma, a producer warp of the dQ warpgroup loads them (Q and dO by TMA, LSE and
// delta by loads and stores) into two mbarrier-guarded stages, so that the consumers meet once per
// job (dS^T complete) and a warpgroup may run into the next job's products while the other finishes
// its dQ share (it waits, on a named barrier, only before it overwrites its rows of dS^T); its consumers hold
// no load addresses (ptxas: 28 spill stores in the kernel's SASS against 82). kDqTma takes launch
// bounds with a block count (setmaxnreg needs the count at entry); kDqCpAsync keeps the bounds it was
// measured with (the same SASS spills either way).
enum DqMode : int { kDqNone = 0, kDqCpAsync = 1, kDqTma = 2 };

// dq = bf16(dq_acc · scale), the fused backward's last step.
__global__ void dq_out_k(bf16* dq, const float* acc, std::int64_t n, float scale) {
  const std::int64_t i = 2 * (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x);
  if (i < n) {
    const float2 a = *reinterpret_cast<const float2*>(acc + i);
    *reinterpret_cast<__nv_bfloat162*>(dq + i) = __floats2bfloat162_rn(a.x * scale, a.y * scale);
  }
}

// Work list of one kv tile: the segments that hold any of its keys (CSR over tiles).
// NW = 8: 128 keys per block, two warpgroups of 64 keys sharing each Q/dO job.
// kDq (the fused backward; wgmma, NW = 8): the kernel also forms dQ's share of its key tile, dS·K
// (the consumers write dS^T to shared memory and multiply it by K, one warpgroup per 64 columns of
// D), and a dQ warp (a fourth warpgroup that gives its registers to the consumers) adds it in fp32 to
// dq_acc [tq][H][D] by bulk L2 reductions, in a fixed order — key tile by key tile, ascending — by
// waiting on a per (segment 64-row block, head) counter that the previous key tile of the segment
// advanced. Two fp32 buffers let the consumers run a job ahead of the adds. The jobs run from the
// last query block down (heads innermost), so that neighbouring key tiles reach a block at about the
// same time. Bitwise repeatable like the separate dQ kernel, with 5 products per tile pair instead of 7.
template <int D, int NW, bool kWg, int kDqMode = kDqNone>
__global__ void __launch_bounds__(NW * 32 + (kDqMode != kDqNone ? 128 : 0), kDqMode == kDqTma ? 1 : 0)
    dkv_k(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const float* lse, const float* delta,
          const bf16* dout, const SegD* segs, const std::int64_t* tile_off, const std::int64_t* tile_segs,
          std::int64_t tkv, int H, int Hkv, float sl2, float scale, bool causal, bool mask_all, float* dq_acc,
          unsigned* dq_sem, bool dq_store_first, const __grid_constant__ TensorMap qmap,
          const __grid_constant__ TensorMap omap) {
  constexpr bool kDq = kDqMode != kDqNone, kTma = kDqMode == kDqTma;
  constexpr int BNk = 16 * NW, NT = 32 * NW, BQ = kBN, NT8 = BQ / 8;
  static_assert(BQ == 64 && (BNk == 64 || (kWg && BNk == 128)), "the product helpers take 64-row tiles");
  static_assert(!kDq || (kWg && BNk == 128), "the fused dQ: wgmma products, 128-key tiles");
  constexpr int kDqLd = D + 8;  // fp32 row stride of a dQ buffer (8 pad floats: conflict-free stores)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* Ks = reinterpret_cast<bf16*>(tile_smem<kWg>(smem_raw));
  bf16* Vs = Ks + BNk * D;
  bf16* Qs = Vs + BNk * D;    // [2][BQ][D]
  bf16* dOs = Qs + 2 * BQ * D;  // [2][BQ][D]
  bf16* dSs = dOs + 2 * BQ * D;  // kDq: dS^T [BNk keys][BQ queries], the M-major A operand of dS·K
  float* Ls = reinterpret_cast<float*>(dSs + (kDq ? BNk * BQ : 0));  // [2][BQ]
  float* Ds = Ls + 2 * BQ;                                 // [2][BQ]
  float* dQs = Ds + 2 * BQ;                                // kDq: [2][BQ][kDqLd] fp32
  // kTma: the stages' mbarriers, full[2] (the producer's TMA bytes and its 32 lanes' LSE / delta
  // stores) and empty[2] (every consumer thread).
  auto* mbar = reinterpret_cast<std::uint64_t*>(dQs + (kDq ? 2 * BQ * kDqLd : 0));
  const std::int64_t tile = blockIdx.x / Hkv;
  const int hk = blockIdx.x % Hkv, grp = H / Hkv;
  const std::int64_t c0 = tile * BNk;
  const int kvalid = static_cast<int>(lmin(BNk, tkv - c0));
  const std::int64_t kld = static_cast<std::int64_t>(Hkv) * D, qld = static_cast<std::int64_t>(H) * D;
  if (!kDq || threadIdx.x < NT) {  // the consumers load (kDq: the dQ warpgroup has threads from NT)
#pragma unroll
    for (int w = 0; w < BNk / 64; ++w) {
      load_rows<D, NT, kWg>(Ks + w * 64 * D, k + ((c0 + 64 * w) * Hkv + hk) * D, kld, kvalid - 64 * w);
      load_rows<D, NT, kWg>(Vs + w * 64 * D, v + ((c0 + 64 * w) * Hkv + hk) * D, kld, kvalid - 64 * w);
    }
  }
  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      hcp::cuda::wg::mbar_init(&mbar[0], 33);
      hcp::cuda::wg::mbar_init(&mbar[1], 33);
      hcp::cuda::wg::mbar_init(&mbar[2], NT);
      hcp::cuda::wg::mbar_init(&mbar[3], NT);
    }
    __syncthreads();
  }

  // Jobs: (segment s of this tile's list, head h of the group, query tile starting at i).
  struct Job {
    std::int64_t s, i;
    int h;
  };
  const std::int64_t s_lo = tile_off[tile], s_hi = tile_off[tile + 1];
  auto first_row = [&](const SegD& g) -> std::int64_t {  // first query row that can see a key of the tile
    if (!causal) return 0;
    const std::int64_t jl = lmax(c0 - g.kv_start, 0);
    const std::int64_t i = jl + g.kv_pos0 - g.q_pos0;
    // kDq: jobs on the segment's 64-row blocks, so that every key tile adds to the same blocks.
    return i < 0 ? 0 : kDq ? i / BQ * BQ : i;
  };
  auto last_block = [&](std::int64_t s) -> std::int64_t {  // kDq: the segment's last 64-row block (-1: none)
    const std::int64_t n = segs[tile_segs[s]].q_len;
    return n > 0 ? (n - 1) / BQ * BQ : -1;
  };
  // The first job at or after jb (in this kernel's order) that has rows; false when none is left.
  // Not fused: segments ascending, heads, query tiles ascending. kDq: segments descending, 64-row
  // blocks descending, heads ascending (the key tiles of a segment visit a prefix of its blocks from
  // the top, each block once per head).
  auto settle = [&](Job& jb) -> bool {
    if constexpr (kDq) {
      while (jb.s >= s_lo) {
        if (jb.i >= 0 && jb.i >= first_row(segs[tile_segs[jb.s]])) return true;
        if (--jb.s >= s_lo) {
          jb.i = last_block(jb.s);
          jb.h = 0;
        }
      }
      return false;
    } else {
      while (jb.s < s_hi) {
        const SegD g = segs[tile_segs[jb.s]];
        if (jb.i < g.q_len) return true;
        if (++jb.h < grp) {
          jb.i = first_row(g);
          continue;
        }
        ++jb.s;
        jb.h = 0;
        if (jb.s < s_hi) jb.i = first_row(segs[tile_segs[jb.s]]);
      }
      return false;
    }
  };
  auto first_job = [&]() -> Job {
    if constexpr (kDq) return Job{s_hi - 1, s_hi > s_lo ? last_block(s_hi - 1) : -1, 0};
    else return Job{s_lo, s_lo < s_hi ? first_row(segs[tile_segs[s_lo]]) : 0, 0};
  };
  auto next_job = [&](const Job& jb) -> Job {
    if constexpr (kDq) return jb.h + 1 < grp ? Job{jb.s, jb.i, jb.h + 1} : Job{jb.s, jb.i - BQ, 0};
    else return Job{jb.s, jb.i + BQ, jb.h};
  };
  // A job's query rows: its segment, head, valid rows (of BQ) and first row of q / dout / lse / delta.
  struct JobRows {
    SegD g;
    int h, valid;
    std::int64_t row0;
  };
  auto job_rows = [&](const Job& jb) -> JobRows {
    const SegD g = segs[tile_segs[jb.s]];
    return {g, hk * grp + jb.h, static_cast<int>(lmin(BQ, g.q_len - jb.i)), g.q_start + jb.i};
  };

  if constexpr (kDq) {
    namespace wg = hcp::cuda::wg;
    if (threadIdx.x >= NT) {  // the dQ warpgroup: one warp adds, three leave
      wg::reg_dealloc<kDqWarpRegs>();
      const int lane = threadIdx.x & 31;
      if constexpr (kTma) {
        if (threadIdx.x >= NT + 32 && threadIdx.x < NT + 64) {  // the producer warp
          Job jb = first_job();
          bool more = settle(jb);
          for (int jn = 0; more; ++jn) {
            const int b = jn & 1;
            if (jn >= 2) wg::mbar_wait(&mbar[2 + b], ((jn >> 1) - 1) & 1);  // the consumers are done with stage b
            const auto [g, h, valid, row0] = job_rows(jb);
            for (int r = lane; r < BQ; r += 32) {
              const bool ok = r < valid;
              Ls[b * BQ + r] = ok ? lse[(row0 + r) * H + h] : 0.f;
              Ds[b * BQ + r] = ok ? delta[(row0 + r) * H + h] : 0.f;
            }
            wg::mbar_arrive(&mbar[b]);  // release: this lane's stores
            if (lane == 0) {
              // Rows past the job's valid ones hold other segments' rows (finite; masked) or zeros.
              wg::mbar_arrive_expect_tx(&mbar[b], 2 * BQ * D * sizeof(bf16));
#pragma unroll
              for (int hb = 0; hb < D / 64; ++hb) {
                wg::tma_load_2d(Qs + b * BQ * D + hb * 64 * 64, &qmap, h * D + 64 * hb, static_cast<int>(row0), &mbar[b]);
                wg::tma_load_2d(dOs + b * BQ * D + hb * 64 * 64, &omap, h * D + 64 * hb, static_cast<int>(row0), &mbar[b]);
              }
            }
            jb = next_job(jb);
            more = settle(jb);
          }
        }
      }
      if (threadIdx.x >= NT + 32) return;
      bar_arrive(kBarEmpty, NT + 32);  // both buffers start empty
      bar_arrive(kBarEmpty + 1, NT + 32);
      Job cur = first_job();
      bool have = settle(cur);
      for (int b = 0; have; b ^= 1) {
        const SegD g = segs[tile_segs[cur.s]];
        const int h = hk * grp + cur.h;
        const int valid = static_cast<int>(lmin(BQ, g.q_len - cur.i));
        unsigned* sem = dq_sem + (g.dq_blk + cur.i / BQ) * H + h;
        const unsigned rank = static_cast<unsigned>(tile - g.kv_start / BNk);
        if (lane == 0) {  // the previous key tile's adds to this block are done
          long long spins = 0;
          while (ld_acquire(sem) != rank)
            if (++spins > (1ll << 24)) __trap();  // an order that never comes: fail instead of hanging
        }
        __syncwarp();
        bar_sync(kBarFull + b, NT + 32);  // the consumers' dS·K of this job is in buffer b
        fence_proxy_async_global();  // the previous tile's adds, observed, before this one's
        const float* src = dQs + b * BQ * kDqLd;
        float* dst = dq_acc + ((g.q_start + cur.i) * H + h) * static_cast<std::int64_t>(D);
        // dq_store_first: every row of dq_acc gets its first share from key tile 0 of its segment,
        // which stores it (dq_acc is not zeroed).
        if (dq_store_first && rank == 0) {
          for (int r = lane; r < valid; r += 32)
            bulk_store(dst + static_cast<std::int64_t>(r) * H * D, src + r * kDqLd, D * sizeof(float));
        } else {
          for (int r = lane; r < valid; r += 32)
            bulk_reduce_add(dst + static_cast<std::int64_t>(r) * H * D, src + r * kDqLd, D * sizeof(float));
        }
        bulk_commit();
        bulk_wait_read_all();
        __syncwarp();
        bar_arrive(kBarEmpty + b, NT + 32);  // buffer b may be refilled
        bulk_wait_all();                     // the adds are done in L2
        fence_proxy_async_global();
        __threadfence();
        __syncwarp();
        if (lane == 0) st_release(sem, rank + 1);
        cur = next_job(cur);
        have = settle(cur);
      }
      return;
    }
    wg::reg_alloc<kDqConsRegs>();
  }
  // The consumers' block-wide barrier (the dQ warp does not take part in it).
  auto sync_all = [] {
    if constexpr (kDq) bar_sync(kBarCons, NT);
    else __syncthreads();
  };

  auto load_job = [&](const Job& jb, int buf) {
    const auto [g, h, valid, row0] = job_rows(jb);
    load_rows<D, NT, kWg>(Qs + buf * BQ * D, q + (row0 * H + h) * D, qld, valid);
    load_rows<D, NT, kWg>(dOs + buf * BQ * D, dout + (row0 * H + h) * D, qld, valid);
    for (int r = threadIdx.x; r < BQ; r += NT) {
      const bool ok = r < valid;
      cp_async4(Ls + buf * BQ + r, ok ? lse + (row0 + r) * H + h : lse, ok);
      cp_async4(Ds + buf * BQ + r, ok ? delta + (row0 + r) * H + h : delta, ok);
    }
  };
  Job cur = first_job();
  bool have = settle(cur);
  if (!kTma && have) load_job(cur, 0);
  cp_async_commit();
  if constexpr (kTma) {  // K and V (the consumers' own copies); the jobs come through the mbarriers
    cp_async_wait<0>();
    hcp::cuda::wg::fence_proxy_async();
    sync_all();
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3, wgi = warp >> 2;
  const int r0 = warp * 16;
  // This warpgroup's 64 keys [cw, cw + 64) of K and V.
  const std::int64_t cw = c0 + 64 * wgi;
  const bf16* Kw = Ks + wgi * 64 * D;
  const bf16* Vw = Vs + wgi * 64 * D;
  float adk[D / 8][4], adv[D / 8][4];
  zero(adk);
  zero(adv);
  int buf = 0, qb = 0;  // Q/dO buffer; kDq: dQ buffer
  unsigned jn = 0;  // kTma: this job's index (stage buf, phase jn / 2)
  while (have) {
    Job nxt = next_job(cur);
    const bool more = settle(nxt);
    if constexpr (kTma) {
      hcp::cuda::wg::mbar_wait(&mbar[buf], (jn >> 1) & 1);
    } else {
      cp_async_next_then_wait(more, [&] { load_job(nxt, buf ^ 1); });
      if constexpr (kWg) hcp::cuda::wg::fence_proxy_async();
      sync_all();
    }
    const SegD g = segs[tile_segs[cur.s]];
    const bf16* Qt = Qs + buf * BQ * D;
    const bf16* dOt = dOs + buf * BQ * D;
    const float* Lt = Ls + buf * BQ;
    const float* Dt = Ds + buf * BQ;
    // A warpgroup whose keys no row of the job can see (causal: the job ends before its first key's
    // position; or its keys lie outside the segment) skips the job (uniform over the warpgroup).
    const bool wg_sees = BNk == 64 || (cw < g.kv_start + g.kv_len && cw + 64 > g.kv_start &&
                                       (!causal || g.kv_pos0 + lmax(cw - g.kv_start, 0) <= g.q_pos0 + lmin(cur.i + BQ, g.q_len) - 1));
    if (wg_sees) {
    float st[NT8][4], dpt[NT8][4];
    mm_xyt<D, kWg>(st, Kw, r0, Qt);   // S^T: keys x queries
    mm_xyt<D, kWg>(dpt, Vw, r0, dOt);  // dP^T
    // Key j (segment-local) of this thread's two rows; query i of each column.
    std::int64_t jl[2];
    bool kin[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const std::int64_t cg = c0 + r0 + gr + 8 * hf;
      jl[hf] = cg - g.kv_start;
      kin[hf] = jl[hf] >= 0 && jl[hf] < g.kv_len;
    }
    // Interior tile (uniform over the warpgroup): every key of its 64 in the segment, every query row
    // of the job valid and, when causal, seeing the last key — no per-element mask.
    const std::int64_t jlast = cw + 63 - g.kv_start;
    const bool interior = !mask_all && cw >= g.kv_start && jlast < g.kv_len && cur.i + BQ <= g.q_len &&
                          (!causal || g.kv_pos0 + jlast <= g.q_pos0 + cur.i);
    if (interior) {
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = nt * 8 + 2 * tg + (e & 1);
          const float p = ex2(st[nt][e] * sl2 - lse2(Lt[c]));
          st[nt][e] = p;
          dpt[nt][e] = p * (dpt[nt][e] - Dt[c]);
        }
    } else {
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int hf = e >> 1, c = nt * 8 + 2 * tg + (e & 1);
          const std::int64_t i = cur.i + c;
          const bool ok = kin[hf] && i < g.q_len && (!causal || g.kv_pos0 + jl[hf] <= g.q_pos0 + i);
          const float p = ok ? ex2(st[nt][e] * sl2 - lse2(Lt[c])) : 0.f;
          st[nt][e] = p;
          dpt[nt][e] = p * (dpt[nt][e] - Dt[c]);
        }
    }
    if constexpr (kDq) {  // dS^T into shared memory (bf16, as the products take it), for dS·K below
      if constexpr (kTma)
        if (jn > 0) bar_sync(kBarDsFree + (wgi ^ 1), NT);  // the other warpgroup's dQ product has read the last dS^T
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          *reinterpret_cast<__nv_bfloat162*>(at<64>(dSs, r0 + gr + 8 * hf, nt * 8 + 2 * tg)) =
              __floats2bfloat162_rn(dpt[nt][2 * hf], dpt[nt][2 * hf + 1]);
    }
    mm_py<D, kWg>(adv, st, dOt);
    mm_py<D, kWg>(adk, dpt, Qt);
    } else if constexpr (kDq) {  // no key of this warpgroup seen: its rows of dS^T are zero
      if constexpr (kTma)
        if (jn > 0) bar_sync(kBarDsFree + (wgi ^ 1), NT);
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          *reinterpret_cast<__nv_bfloat162*>(at<64>(dSs, r0 + gr + 8 * hf, nt * 8 + 2 * tg)) = __floats2bfloat162_rn(0.f, 0.f);
    }
    if constexpr (kTma)  // this thread has read the stage's LSE and delta, its products Q and dO (waited)
      hcp::cuda::wg::mbar_arrive(&mbar[2 + buf]);
    if constexpr (kDq) {
      namespace wg = hcp::cuda::wg;
      wg::fence_proxy_async();  // this thread's dS^T stores, before the products read them
      sync_all();               // both warpgroups' rows of dS^T
      // Warpgroup w < D/64: columns [64 w, +64) of dS·K over the 128 keys (dS^T M-major, K N-major).
      float dq[32];
#pragma unroll
      for (int x = 0; x < 32; ++x) dq[x] = 0.f;
      if (wgi < D / 64) {
        wg::fence();
        const std::uint64_t da = wg::desc_mn128(dSs, 64 * 64 * sizeof(bf16));
#pragma unroll
        for (int kk = 0; kk < BNk / 16; ++kk) {  // 16 keys: +2048 bytes in dS^T and in a 64-key block of K
          const std::uint64_t db = wg::desc_mn128(Ks + (kk / 4) * 64 * D + wgi * 64 * 64, 64 * 64 * sizeof(bf16));
          wg::mma_ss<64, true, true>(dq, da + 128 * kk, db + 128 * (kk % 4));
        }
        wg::commit();
        wg::wait<0>();
      }
      if constexpr (kTma)
        if (more) bar_arrive(kBarDsFree + wgi, NT);  // this warpgroup's reads of dS^T are done
      bar_sync(kBarEmpty + qb, NT + 32);  // the dQ warp has read this buffer's previous job
      if (wgi < D / 64) {
        float* o = dQs + qb * BQ * kDqLd + 64 * wgi;
        const int row = (warp & 3) * 16 + gr;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf)
            *reinterpret_cast<float2*>(o + (row + 8 * hf) * kDqLd + 8 * j + 2 * tg) = make_float2(dq[4 * j + 2 * hf], dq[4 * j + 2 * hf + 1]);
        wg::fence_proxy_async();  // before the bulk reductions read the buffer
      }
      bar_arrive(kBarFull + qb, NT + 32);
      qb ^= 1;
    }
    if constexpr (!kTma) sync_all();
    cur = nxt;
    have = more;
    buf ^= 1;
    ++jn;
  }
  store_rows<D>(dk + (c0 * Hkv + hk) * D, kld, kvalid, r0, adk, scale, scale);
  store_rows<D>(dv + (c0 * Hkv + hk) * D, kld, kvalid, r0, adv, 1.f, 1.f);
  if constexpr (kDq) {  // complete the "empty" barriers' last generations (the dQ warp arrived on them)
    bar_sync(kBarEmpty + qb, NT + 32);
    bar_sync(kBarEmpty + (qb ^ 1), NT + 32);
  }
}

// ---- host side ----------------------------------------------------------------------------------------
constexpr int kNW = 4;     // warps per block: 64 query rows (dQ) or 64 keys (dK/dV) per block
constexpr int kFwdMT = 2;  // forward: 32 query rows per warp, 128 per block

// One device buffer for the small plan arrays, stream-ordered (freed after the launches that use it).
struct Plan {
  void* mem = nullptr;
  SegD* segs = nullptr;
  QTile* qtiles = nullptr;
  std::int64_t nqtiles = 0;
  std::int64_t* tile_off = nullptr;
  std::int64_t* tile_segs = nullptr;
  std::int64_t nktiles = 0;
  std::int64_t ndqblk = 0;  // 64-row query blocks over all segments
  Plan(const std::vector<AttnSegment>& in, int bm, std::int64_t tkv, bool with_kv) {
    std::vector<SegD> s;
    std::vector<QTile> qt;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const auto& a = in[i];
      s.push_back({a.q_start, a.q_len, a.kv_start, a.kv_len, a.q_pos0, a.kv_pos0, ndqblk});
      ndqblk += (std::max<std::int64_t>(a.q_len, 0) + kBN - 1) / kBN;
      for (std::int64_t i0 = 0; i0 < a.q_len; i0 += bm) qt.push_back({static_cast<std::int64_t>(i), i0});
    }
    // Heaviest query tiles (latest rows: most causal keys) first, for a better tail.
    std::stable_sort(qt.begin(), qt.end(), [&](const QTile& x, const QTile& y) {
      return s[x.seg].q_pos0 + x.i0 - s[x.seg].kv_pos0 > s[y.seg].q_pos0 + y.i0 - s[y.seg].kv_pos0;
    });
    // Per kv tile, the segments (in segment order) that hold any of its keys and have queries:
    // O(segments + tiles covered), also for packed batches of many sequences.
    std::vector<std::int64_t> off{0}, lst;
    if (with_kv) {
      nktiles = (tkv + bm - 1) / bm;
      std::vector<std::vector<std::int64_t>> per(static_cast<std::size_t>(nktiles));
      for (std::size_t i = 0; i < in.size(); ++i) {
        const auto& a = in[i];
        if (a.q_len <= 0 || a.kv_len <= 0) continue;  // no (query, key) pair: contributes nothing
        for (std::int64_t t = a.kv_start / bm; t <= (a.kv_start + a.kv_len - 1) / bm && t < nktiles; ++t)
          per[static_cast<std::size_t>(t)].push_back(static_cast<std::int64_t>(i));
      }
      for (const auto& v : per) {
        lst.insert(lst.end(), v.begin(), v.end());
        off.push_back(static_cast<std::int64_t>(lst.size()));
      }
    }
    nqtiles = static_cast<std::int64_t>(qt.size());
    const std::size_t b_seg = s.size() * sizeof(SegD), b_qt = qt.size() * sizeof(QTile),
                      b_off = off.size() * sizeof(std::int64_t), b_lst = lst.size() * sizeof(std::int64_t);
    std::vector<unsigned char> host(b_seg + b_qt + b_off + b_lst + 8);
    std::memcpy(host.data(), s.data(), b_seg);
    std::memcpy(host.data() + b_seg, qt.data(), b_qt);
    std::memcpy(host.data() + b_seg + b_qt, off.data(), b_off);
    if (b_lst) std::memcpy(host.data() + b_seg + b_qt + b_off, lst.data(), b_lst);
    HCP_CUDA_CHECK(cudaMallocAsync(&mem, host.size(), 0));
    HCP_CUDA_CHECK(cudaMemcpyAsync(mem, host.data(), host.size(), cudaMemcpyHostToDevice, 0));
    auto* base = static_cast<unsigned char*>(mem);
    segs = reinterpret_cast<SegD*>(base);
    qtiles = reinterpret_cast<QTile*>(base + b_seg);
    tile_off = reinterpret_cast<std::int64_t*>(base + b_seg + b_qt);
    tile_segs = reinterpret_cast<std::int64_t*>(base + b_seg + b_qt + b_off);
    // From pageable memory the copy has read `host` when cudaMemcpyAsync returns.
  }
  ~Plan() { cudaFreeAsync(mem, 0); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
};

// Whether a bf16 tensor of `rows` rows at p can back a TMA map here: 16-byte aligned base and
// 1 <= rows < 2^31 (the maps' extents must be positive; the kernels pass int32 row coordinates).
bool tma_ok(const void* p, std::int64_t rows) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && rows > 0 && rows < (std::int64_t{1} << 31);
}

template <class K> void set_smem(K kernel, std::size_t bytes) {
  HCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <int D> void fwd_d(const Fwd& a) {
  // The wgmma kernel; HCP_ATTN_MMA_SYNC set in the environment selects the mma.sync kernel.
  static const bool keep_sync = std::getenv("HCP_ATTN_MMA_SYNC") != nullptr;
  if (!keep_sync) {
    const Dims& d = a.dims;
    Plan plan(*d.segments, kWgRows, d.tkv, false);
    if (plan.nqtiles == 0) return;
    // The warp-specialised kernel (Q, K and V as TMA maps, `tma_ok`):
    // the default; HCP_ATTN_FWD_TWO_BLOCKS keeps the two-blocks-per-SM kernel below (whose variants
    // HCP_ATTN_FWD_EXP2F and HCP_ATTN_FWD_BN64 select).
    static const bool ws_want = std::getenv("HCP_ATTN_FWD_TWO_BLOCKS") == nullptr;
    static const bool turns = std::getenv("HCP_ATTN_FWD_NO_TURNS") == nullptr;  // side-by-side runs
    static const bool stages3 = std::getenv("HCP_ATTN_FWD_STAGES3") != nullptr;
    if (ws_want && tma_ok(a.q, d.tq) && tma_ok(a.k, d.tkv) && tma_ok(a.v, d.tkv)) {
      constexpr int BN = 128;
      const TensorMap qmap = make_map(a.q, d.tq, d.H * D, d.H * D, 64, 64);
      const TensorMap kmap = make_map(a.k, d.tkv, d.Hkv * D, d.Hkv * D, BN, 64);
      const TensorMap vmap = make_map(a.v, d.tkv, d.Hkv * D, d.Hkv * D, BN, 64);
      const auto launch = [&](auto kern, std::size_t smem) {
        set_smem(kern, smem);
        kern<<<static_cast<unsigned>(plan.nqtiles * d.H), 384, smem>>>(a.o, a.lse, a.v, plan.segs, plan.qtiles, d.H, d.Hkv,
                                                                       d.scale * kLog2e, d.causal, turns, qmap, kmap, vmap);
      };
      if (stages3) launch(fwd_ws_k<D, BN, 3>, fwd_ws_smem<D, BN, 3>());
      else launch(fwd_ws_k<D, BN, 2>, fwd_ws_smem<D, BN, 2>());
      check_launch("attention_fwd (warp-specialised)");
      return;
    }
    static const bool exp2f_fwd = std::getenv("HCP_ATTN_FWD_EXP2F") != nullptr;
    // D = 64 on 128-key tiles unless HCP_ATTN_FWD_BN64 keeps 64 (side-by-side runs).
    static const bool bn64 = std::getenv("HCP_ATTN_FWD_BN64") != nullptr;
    const auto run = [&](auto kern, std::size_t smem) {
      set_smem(kern, smem);
      kern<<<static_cast<unsigned>(plan.nqtiles * d.H), 256, smem>>>(a.o, a.lse, a.q, a.k, a.v, plan.segs, plan.qtiles, d.H,
                                                                      d.Hkv, d.scale * kLog2e, d.causal);
    };
    constexpr int kBnD = D == 64 ? 128 : kBN;  // keys per tile (D = 128: the 64-key kernel either way)
    if (!bn64) run(exp2f_fwd ? fwd_wg_k<D, false, kBnD> : fwd_wg_k<D, true, kBnD>, fwd_wg_smem<D, kBnD>());
    else run(exp2f_fwd ? fwd_wg_k<D, false> : fwd_wg_k<D, true>, fwd_wg_smem<D>());
    check_launch("attention_fwd (wgmma)");
    return;
  }
  constexpr int BM = 16 * kFwdMT * kNW;
  const Dims& d = a.dims;
  Plan plan(*d.segments, BM, d.tkv, false);
  if (plan.nqtiles == 0) return;
  const std::size_t smem = static_cast<std::size_t>(BM + 4 * kBN) * D * sizeof(bf16);
  auto* kern = fwd_k<D, kNW, kFwdMT>;
  set_smem(kern, smem);
  kern<<<static_cast<unsigned>(plan.nqtiles * d.H), 32 * kNW, smem>>>(a.o, a.lse, a.q, a.k, a.v, plan.segs, plan.qtiles,
                                                                      d.H, d.Hkv, d.scale * kLog2e, d.causal);
  check_launch("attention_fwd (tensor cores)");
}
// Whether the segments' query rows tile [0, tq) exactly and key tile 0 of every segment sees all of
// its rows: then every row of the fused backward's dq_acc gets its first share from that tile, which
// stores it instead of adding (no zeroing pass over dq_acc).
bool dq_rows_first_from_tile0(const std::vector<AttnSegment>& segs, std::int64_t tq, bool causal) {
  std::vector<std::pair<std::int64_t, std::int64_t>> r;
  for (const auto& g : segs) {
    if (g.q_len <= 0) continue;
    if (g.kv_len <= 0 || (causal && g.kv_pos0 > g.q_pos0)) return false;
    r.emplace_back(g.q_start, g.q_len);
  }
  std::sort(r.begin(), r.end());
  std::int64_t end = 0;
  for (const auto& [start, len] : r) {
    if (start != end) return false;  // a gap or an overlap
    end = start + len;
  }
  return end == tq;
}

template <int D> void bwd_d(const Bwd& a) {
  constexpr int BM = 16 * kNW;
  const Dims& d = a.dims;
  float* delta = nullptr;
  const std::int64_t rows = d.tq * d.H;
  HCP_CUDA_CHECK(cudaMallocAsync(&delta, static_cast<std::size_t>(std::max<std::int64_t>(rows, 1)) * sizeof(float), 0));
  if (rows > 0) delta_k<<<blocks_for(rows * 32, 256), 256>>>(delta, a.dout, a.o, rows, D);
  const float sl2 = d.scale * kLog2e;
  // The wgmma kernels; HCP_ATTN_MMA_SYNC set in the environment keeps the mma.sync ones.
  static const bool wgmma = std::getenv("HCP_ATTN_MMA_SYNC") == nullptr;
  const std::size_t align = wgmma ? 1024 : 0;
  // The fused backward (dQ formed inside the dK/dV kernel: 5 products per tile pair instead of 7, a dQ
  // warp adding each job's share in fp32 in a fixed order) is the default at D 128: 4.98 against 5.73 ms
  // for the split dQ + dK/dV kernels on the H200 (B2 H16 L8192, causal; same run); at D 64 the split
  // kernels stay (3.37 against 4.64 ms: the fused block holds 8 product warps per SM, the split ones 12).
  // HCP_ATTN_BWD_FUSED_DQ / HCP_ATTN_BWD_SPLIT_DQ set in the environment force one or the other.
  static const bool force_fused = std::getenv("HCP_ATTN_BWD_FUSED_DQ") != nullptr;
  static const bool force_split = std::getenv("HCP_ATTN_BWD_SPLIT_DQ") != nullptr;
  // Split-path variants (they select the split kernels): HCP_ATTN_DQ_WG2, the dQ kernel on 128-row
  // query tiles (two warpgroups sharing each K/V tile); HCP_ATTN_DKV_WG2, the dK/dV kernel on 128-key
  // tiles (two warpgroups sharing each Q/dO job). Neither measured faster on the H200.
  static const bool dq_wg2 = std::getenv("HCP_ATTN_DQ_WG2") != nullptr;
  static const bool dkv_wg2 = std::getenv("HCP_ATTN_DKV_WG2") != nullptr;
  const bool fused = wgmma && !force_split && !dq_wg2 && !dkv_wg2 && (force_fused || D == 128);
  // The fused kernel loads each job's Q and dO by TMA from a producer warp (kDqTma: 4.98 against 5.67-5.72
  // ms with the consumers' own cp.async loads, same run); HCP_ATTN_BWD_DQ_CP_ASYNC keeps the cp.async
  // form (kDqCpAsync; also taken where Q or dO is not 16-byte aligned). HCP_ATTN_BWD_DQ_ZERO zeroes
  // dq_acc and adds every share, also where the first could be stored.
  static const bool dq_cp_async = std::getenv("HCP_ATTN_BWD_DQ_CP_ASYNC") != nullptr;
  static const bool dq_zero = std::getenv("HCP_ATTN_BWD_DQ_ZERO") != nullptr;
  // HCP_ATTN_BWD_MASK_ALL masks every element of every tile (the interior-tile fast path off).
  static const bool mask_all = std::getenv("HCP_ATTN_BWD_MASK_ALL") != nullptr;
  if (fused) {
    // 128 keys per block, two consumer warpgroups of 64 sharing each Q/dO job; dS^T [128 keys][kBN
    // queries] and two fp32 dQ buffers [kBN][D + 8] in shared memory; the dQ warpgroup.
    Plan plan(*d.segments, 128, d.tkv, true);
    const std::int64_t n = d.tq * d.H * D;  // fp32 dQ accumulator [tq][H][D]
    const std::size_t nsem = static_cast<std::size_t>(std::max<std::int64_t>(plan.ndqblk * d.H, 1));
    const bool store_first = !dq_zero && dq_rows_first_from_tile0(*d.segments, d.tq, d.causal);
    float* acc = nullptr;
    unsigned* sem = nullptr;  // per (64-row block, head): the next key tile to add
    HCP_CUDA_CHECK(cudaMallocAsync(&acc, static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(float), 0));
    HCP_CUDA_CHECK(cudaMallocAsync(&sem, nsem * sizeof(unsigned), 0));
    if (!store_first) HCP_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<std::size_t>(n) * sizeof(float), 0));
    HCP_CUDA_CHECK(cudaMemsetAsync(sem, 0, nsem * sizeof(unsigned), 0));
    if (plan.nktiles > 0) {
      const std::size_t smem = static_cast<std::size_t>(2 * 128 + 4 * kBN) * D * sizeof(bf16) + 4 * kBN * sizeof(float) +
                               128 * kBN * sizeof(bf16) + 2 * kBN * (D + 8) * sizeof(float) + 4 * sizeof(std::uint64_t) + align;
      TensorMap qmap{}, omap{};
      // kDqTma: Q and dO as [tq][H·D] maps, boxes [64 rows][64 columns].
      const bool tma = !dq_cp_async && tma_ok(a.q, d.tq) && tma_ok(a.dout, d.tq);
      if (tma) {
        qmap = make_map(a.q, d.tq, d.H * D, d.H * D, 64, 64);
        omap = make_map(a.dout, d.tq, d.H * D, d.H * D, 64, 64);
      }
      const auto run = [&](auto kern) {
        set_smem(kern, smem);
        kern<<<static_cast<unsigned>(plan.nktiles * d.Hkv), 64 * kNW + 128, smem>>>(
            a.dk, a.dv, a.q, a.k, a.v, a.lse, delta, a.dout, plan.segs, plan.tile_off, plan.tile_segs, d.tkv, d.H,
            d.Hkv, sl2, d.scale, d.causal, mask_all, acc, sem, store_first, qmap, omap);
      };
      if (tma) run(dkv_k<D, 2 * kNW, true, kDqTma>);
      else run(dkv_k<D, 2 * kNW, true, kDqCpAsync>);
    }
    if (n > 0) dq_out_k<<<blocks_for(n / 2, 256), 256>>>(a.dq, acc, n, d.scale);
    HCP_CUDA_CHECK(cudaFreeAsync(sem, 0));
    HCP_CUDA_CHECK(cudaFreeAsync(acc, 0));
  } else {
    Plan plan(*d.segments, BM, d.tkv, true);
    if (wgmma && dq_wg2) {
      // HCP_ATTN_DQ_WG2: 128 query rows per dQ block, two warpgroups sharing each K/V tile.
      Plan plan2(*d.segments, 128, d.tkv, false);
      if (plan2.nqtiles > 0) {
        const std::size_t smem = static_cast<std::size_t>(2 * 128 + 4 * kBN) * D * sizeof(bf16) + align;
        auto* kern = dq_k<D, 2 * kNW, true>;
        set_smem(kern, smem);
        kern<<<static_cast<unsigned>(plan2.nqtiles * d.H), 64 * kNW, smem>>>(a.dq, a.q, a.k, a.v, a.lse, delta, a.dout,
                                                                             plan2.segs, plan2.qtiles, d.H, d.Hkv, sl2,
                                                                             d.scale, d.causal);
      }
    } else if (plan.nqtiles > 0) {
      const std::size_t smem = static_cast<std::size_t>(2 * BM + 4 * kBN) * D * sizeof(bf16) + align;
      auto* kern = wgmma ? dq_k<D, kNW, true> : dq_k<D, kNW, false>;
      set_smem(kern, smem);
      kern<<<static_cast<unsigned>(plan.nqtiles * d.H), 32 * kNW, smem>>>(a.dq, a.q, a.k, a.v, a.lse, delta, a.dout,
                                                                          plan.segs, plan.qtiles, d.H, d.Hkv, sl2,
                                                                          d.scale, d.causal);
    }
    if (wgmma && dkv_wg2) {
      // HCP_ATTN_DKV_WG2: 128 keys per dK/dV block, two warpgroups of 64 sharing each Q/dO job.
      Plan plan2(*d.segments, 128, d.tkv, true);
      if (plan2.nktiles > 0) {
        const std::size_t smem = static_cast<std::size_t>(2 * 128 + 4 * kBN) * D * sizeof(bf16) + 4 * kBN * sizeof(float) + align;
        auto* kern = dkv_k<D, 2 * kNW, true>;
        set_smem(kern, smem);
        kern<<<static_cast<unsigned>(plan2.nktiles * d.Hkv), 64 * kNW, smem>>>(
            a.dk, a.dv, a.q, a.k, a.v, a.lse, delta, a.dout, plan2.segs, plan2.tile_off, plan2.tile_segs, d.tkv, d.H,
            d.Hkv, sl2, d.scale, d.causal, mask_all, nullptr, nullptr, false, TensorMap{}, TensorMap{});
      }
    } else if (plan.nktiles > 0) {
      const std::size_t smem = static_cast<std::size_t>(2 * BM + 4 * kBN) * D * sizeof(bf16) + 4 * kBN * sizeof(float) + align;
      auto* kern = wgmma ? dkv_k<D, kNW, true> : dkv_k<D, kNW, false>;
      set_smem(kern, smem);
      kern<<<static_cast<unsigned>(plan.nktiles * d.Hkv), 32 * kNW, smem>>>(
          a.dk, a.dv, a.q, a.k, a.v, a.lse, delta, a.dout, plan.segs, plan.tile_off, plan.tile_segs, d.tkv, d.H, d.Hkv,
          sl2, d.scale, d.causal, mask_all, nullptr, nullptr, false, TensorMap{}, TensorMap{});
    }
  }
  check_launch("attention_bwd (tensor cores)");
  HCP_CUDA_CHECK(cudaFreeAsync(delta, 0));
}
}  // namespace

bool supported(DType dtype, std::int64_t head_dim, std::int64_t heads, std::int64_t kv_heads) {
  return dtype == DType::BF16 && (head_dim == 64 || head_dim == 128) && kv_heads > 0 && heads % kv_heads == 0;
}
void fwd(const Fwd& a) {
  if (a.dims.D == 64) fwd_d<64>(a);
  else fwd_d<128>(a);
}
void bwd(const Bwd& a) {
  if (a.dims.D == 64) bwd_d<64>(a);
  else bwd_d<128>(a);
}

}  // namespace hcp::kernels::cuda_impl::attn_tc
