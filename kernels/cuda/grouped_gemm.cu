// Grouped GEMM: one launch computes C_g = op(A_g) op(B_g) for every group g (the experts of a MoE
// layer). The blocks cover (tile list) x (N tiles); the tile list names each block's group and M
// offset, so groups of any size (also empty ones) share one launch without padding. bf16 runs on the
// tensor cores: when every operand's contiguous extent and leading dimension are multiples of 8
// elements (the MoE shapes), Hopper wgmma on a 256x192x64 block tile: one producer thread fills a
// 4-stage ring with TMA copies and two consumer warpgroups of 128 rows multiply and store through
// shared memory (gemm_tma_wide_k). Set in the environment for side-by-side timing:
// HCP_GEMM_TMA_DIRECT_STORE stores from the accumulators instead, HCP_GEMM_TMA_128 runs the
// 128x256x64 form (gemm_tma_k, consumer warpgroups of 64 rows), HCP_GEMM_TMA_CLUSTER that form in
// clusters of two sharing B by multicast, HCP_GEMM_WG selects the 4-stage cp.async pipeline with
// block barriers (gemm_wg_k), HCP_GEMM_WS its warp-specialised form (gemm_ws_k), HCP_GEMM_MMA_SYNC the earlier 128x128x64
// mma.sync kernel (4 warps of 64x64, ldmatrix, 3 stages); otherwise WMMA 16x16x16 tiles loaded
// element-wise. fp32/fp64 run on FMA with 4x4 register tiles. Every output element has one owner and
// a fixed K order: bitwise repeatable, no atomics. A group with K = 0 writes zeros (an expert that
// received no tokens gets a zero weight gradient).
#include <mma.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/tensor_map.hpp"
#include "kernels/cuda/wgmma.cuh"

namespace hcp::kernels::cuda_impl {
using namespace hcp::cuda;

namespace {
constexpr int BM = 64, BN = 64, BK = 32, kThreads = 256;

template <class S> struct Group {
  const S* A;
  const S* B;
  S* C;
  std::int64_t M, N, K, lda, ldb, ldc;
};
struct Tile {
  int group;
  int m0;      // < 0: no tile (the idle partner of a cluster pair)
  int shared;  // gemm_tma_k with clusters: this pair of tiles shares its B tile (multicast halves)
};

// A tile of op(A) [BM x BK] and op(B) [BK x BN] into shared memory (zero outside the matrix).
template <bool TA, bool TB, class S, class T, int LDA, int LDB>
__device__ __forceinline__ void load_tiles(T (*As)[LDA], T (*Bs)[LDB], const Group<S>& g, std::int64_t m0, std::int64_t n0,
                                           std::int64_t k0, bool a_km) {
  for (int i = threadIdx.x; i < BM * BK; i += blockDim.x) {
    // Walk along the contiguous axis of the source for coalescing.
    const int m = TA ? i % BM : i / BK, k = TA ? i / BM : i % BK;
    const std::int64_t gm = m0 + m, gk = k0 + k;
    float v = 0;
    if (gm < g.M && gk < g.K) v = ld(TA ? g.A + gk * g.lda + gm : g.A + gm * g.lda + gk);
    if (a_km) As[k][m] = T(v);
    else As[m][k] = T(v);
  }
  for (int i = threadIdx.x; i < BK * BN; i += blockDim.x) {
    const int n = TB ? i / BK : i % BN, k = TB ? i % BK : i / BN;
    const std::int64_t gn = n0 + n, gk = k0 + k;
    float v = 0;
    if (gn < g.N && gk < g.K) v = ld(TB ? g.B + gn * g.ldb + gk : g.B + gk * g.ldb + gn);
    Bs[k][n] = T(v);
  }
}
// fp64 keeps fp64 through the load (the float path above would round it).
template <bool TA, bool TB>
__device__ __forceinline__ void load_tiles_f64(double (*As)[BM], double (*Bs)[BN], const Group<double>& g, std::int64_t m0,
                                               std::int64_t n0, std::int64_t k0) {
  for (int i = threadIdx.x; i < BM * BK; i += blockDim.x) {
    const int m = TA ? i % BM : i / BK, k = TA ? i / BM : i % BK;
    const std::int64_t gm = m0 + m, gk = k0 + k;
    As[k][m] = (gm < g.M && gk < g.K) ? (TA ? g.A[gk * g.lda + gm] : g.A[gm * g.lda + gk]) : 0.0;
  }
  for (int i = threadIdx.x; i < BK * BN; i += blockDim.x) {
    const int n = TB ? i / BK : i % BN, k = TB ? i % BK : i / BN;
    const std::int64_t gn = n0 + n, gk = k0 + k;
    Bs[k][n] = (gn < g.N && gk < g.K) ? (TB ? g.B[gn * g.ldb + gk] : g.B[gk * g.ldb + gn]) : 0.0;
  }
}

// FMA path (fp32, fp64): 256 threads, each a 4x4 block of the 64x64 tile.
template <class S, class A, bool TA, bool TB> __global__ void gemm_fma_k(const Group<S>* groups, const Tile* tiles) {
  __shared__ A As[BK][BM];
  __shared__ A Bs[BK][BN];
  const Tile tl = tiles[blockIdx.x];
  const Group<S> g = groups[tl.group];
  const std::int64_t m0 = tl.m0, n0 = static_cast<std::int64_t>(blockIdx.y) * BN;
  if (n0 >= g.N) return;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  A acc[4][4] = {};
  for (std::int64_t k0 = 0; k0 < g.K; k0 += BK) {
    if constexpr (std::is_same_v<S, double>) load_tiles_f64<TA, TB>(As, Bs, g, m0, n0, k0);
    else load_tiles<TA, TB, S, A, BM, BN>(As, Bs, g, m0, n0, k0, true);
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < BK; ++kk) {
      A a[4], b[4];
      for (int i = 0; i < 4; ++i) a[i] = As[kk][ty * 4 + i], b[i] = Bs[kk][tx * 4 + i];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      const std::int64_t m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
      if (m < g.M && n < g.N) st(g.C + m * g.ldc + n, acc[i][j]);
    }
}

// Tensor-core path (bf16): 8 warps, warp w owns rows (w/2)*16 and columns (w%2)*32 of the tile.
template <bool TA, bool TB> __global__ void gemm_wmma_k(const Group<__nv_bfloat16>* groups, const Tile* tiles) {
  using namespace nvcuda;
  constexpr int LA = BK + 8, LB = BN + 8, LC = BN + 4;
  __shared__ __align__(32) __nv_bfloat16 As[BM][LA];
  __shared__ __align__(32) __nv_bfloat16 Bs[BK][LB];
  __shared__ __align__(32) float Cs[BM][LC];
  const Tile tl = tiles[blockIdx.x];
  const Group<__nv_bfloat16> g = groups[tl.group];
  const std::int64_t m0 = tl.m0, n0 = static_cast<std::int64_t>(blockIdx.y) * BN;
  if (n0 >= g.N) return;
  const int w = threadIdx.x / 32, wm = w / 2, wn = w % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
  for (auto& f : acc) wmma::fill_fragment(f, 0.0f);
  for (std::int64_t k0 = 0; k0 < g.K; k0 += BK) {
    load_tiles<TA, TB, __nv_bfloat16, __nv_bfloat16, LA, LB>(As, Bs, g, m0, n0, k0, false);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
      wmma::load_matrix_sync(fa, &As[wm * 16][kk], LA);
      for (int j = 0; j < 2; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
        wmma::load_matrix_sync(fb, &Bs[kk][wn * 32 + j * 16], LB);
        wmma::mma_sync(acc[j], fa, fb, acc[j]);
      }
    }
    __syncthreads();
  }
  for (int j = 0; j < 2; ++j) wmma::store_matrix_sync(&Cs[wm * 16][wn * 32 + j * 16], acc[j], LC, wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < BM * BN; i += blockDim.x) {
    const int m = i / BN, n = i % BN;
    if (m0 + m < g.M && n0 + n < g.N) st(g.C + (m0 + m) * g.ldc + n0 + n, Cs[m][n]);
  }
}

// Pipelined tensor-core path (bf16, 16-byte aligned operands).
constexpr int TBM = 128, TBN = 128, TBK = 64, kStages = 3, kTcThreads = 128;
constexpr std::size_t kTcSmem = static_cast<std::size_t>(kStages) * (TBM + TBN) * TBK * sizeof(__nv_bfloat16);
// Raster: a 1-D grid whose consecutive blocks are the N tiles of one M tile, so the A rows stay in L2
// while every N tile reads them and a group's B (an expert's weights) stays in L2 across its M tiles.
template <bool TA, bool TB>
__global__ void __launch_bounds__(kTcThreads) gemm_tc_k(const Group<__nv_bfloat16>* groups, const Tile* tiles, int ntn) {
  using namespace hcp::cuda::tc;
  using bf16 = __nv_bfloat16;
  extern __shared__ __align__(128) unsigned char gemm_sm[];
  bf16* As = reinterpret_cast<bf16*>(gemm_sm);  // [kStages][TBM x TBK] ([m][k], or [k][m] when TA)
  bf16* Bs = As + kStages * TBM * TBK;          // [kStages][TBK x TBN] ([k][n], or [n][k] when TB)
  const Tile tl = tiles[blockIdx.x / ntn];
  const Group<__nv_bfloat16> g = groups[tl.group];
  const std::int64_t m0 = tl.m0, n0 = static_cast<std::int64_t>(blockIdx.x % ntn) * TBN;
  if (n0 >= g.N) return;
  const int nk = static_cast<int>((g.K + TBK - 1) / TBK);
  auto load = [&](int kt, int stage) {
    const std::int64_t k0 = static_cast<std::int64_t>(kt) * TBK;
    bf16* a = As + stage * TBM * TBK;
    bf16* b = Bs + stage * TBK * TBN;
    if (TA) load_tile_async<TBM, kTcThreads>(a, g.A + k0 * g.lda + m0, g.lda, TBK, g.K - k0, g.M - m0);
    else load_tile_async<TBK, kTcThreads>(a, g.A + m0 * g.lda + k0, g.lda, TBM, g.M - m0, g.K - k0);
    if (TB) load_tile_async<TBK, kTcThreads>(b, g.B + n0 * g.ldb + k0, g.ldb, TBN, g.N - n0, g.K - k0);
    else load_tile_async<TBN, kTcThreads>(b, g.B + k0 * g.ldb + n0, g.ldb, TBK, g.K - k0, g.N - n0);
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < nk) load(st, st);
    cp_async_commit();
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = (warp >> 1) * 64, wn = (warp & 1) * 64;
  float acc[4][8][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for everyone; stage kt-1 is no longer read
    if (kt + kStages - 1 < nk) load(kt + kStages - 1, (kt + kStages - 1) % kStages);
    cp_async_commit();
    const bf16* a = As + (kt % kStages) * TBM * TBK;
    const bf16* b = Bs + (kt % kStages) * TBK * TBN;
#pragma unroll
    for (int kk = 0; kk < TBK; kk += 16) {
      unsigned fa[4][4], fb[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (TA) load_a_km<TBM>(fa[i], a, kk, wm + 16 * i);
        else load_a<TBK>(fa[i], a, wm + 16 * i, kk);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (TB) load_b_nk<TBK>(fb[j], b, wn + 16 * j, kk);
        else load_b_kn<TBN>(fb[j], b, kk, wn + 16 * j);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          mma(acc[i][2 * j], fa[i], fb[j][0], fb[j][1]);
          mma(acc[i][2 * j + 1], fa[i], fb[j][2], fb[j][3]);
        }
    }
  }
  cp_async_wait<0>();
  const int gr = lane >> 2, tg = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const std::int64_t m = m0 + wm + 16 * i + gr + 8 * hf;
      if (m >= g.M) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const std::int64_t n = n0 + wn + 8 * j + 2 * tg;  // N % 8 == 0: n < N implies n + 1 < N
        if (n < g.N)
          *reinterpret_cast<__nv_bfloat162*>(g.C + m * g.ldc + n) =
              __floats2bfloat162_rn(acc[i][j][2 * hf], acc[i][j][2 * hf + 1]);
      }
    }
}
// Hopper path: a 128x256x64 block tile, two warpgroups of 64 rows each issuing wgmma m64n256k16 on
// 128-byte-swizzled shared-memory tiles (no register operands), a 4-stage cp.async pipeline that every
// thread feeds two stages ahead, one wgmma batch in flight across the next stage's wait. The 256-wide
// tile brings 85 flops per byte from L2 against 64 for 128x128, at which this kernel ran no faster
// than the mma.sync one (~250 TFLOP/s on the H200; 320 at 128x256). K-major
// operands (A [M][K], B [N][K]) are stored [rows][64]; MN-major ones (TA: A [K][M], !TB: B [K][N]) as
// [64 k][64] blocks of 64 M/N each, read through the transpose immediates.
// Accumulation order per output element is fixed: bitwise repeatable.
constexpr int WBM = 128, WBN = 256, WBK = 64, kWgStages = 4, kWgThreads = 256;
constexpr int kWgHalf = 64 * WBK;  // elements of one [64][64] block
constexpr std::size_t kWgSmem = static_cast<std::size_t>(kWgStages) * (WBM + WBN) * WBK * sizeof(__nv_bfloat16) + 1024;
// One stage of a wgmma consumer warpgroup as one committed batch: acc += its 64 rows of the A stage
// (rows 64 c.. of the K-major tile, or block c of the M-major one) times the first WN columns of the
// B stage, WBK deep.
template <int WN, bool TA, bool TB>
__device__ __forceinline__ void stage_mma(float (&acc)[WN / 2], const __nv_bfloat16* As, const __nv_bfloat16* Bs, int c) {
  namespace wg = hcp::cuda::wg;
  const __nv_bfloat16* a = As + (TA ? c * kWgHalf : 64 * c * WBK);
  const std::uint64_t da = TA ? wg::desc_mn128(a, kWgHalf * sizeof(__nv_bfloat16)) : wg::desc_k128(a);
  const std::uint64_t db = TB ? wg::desc_k128(Bs) : wg::desc_mn128(Bs, kWgHalf * sizeof(__nv_bfloat16));
  constexpr std::uint64_t kStepA = TA ? 128 : 2, kStepB = TB ? 2 : 128;  // one k16 slice, in 16-byte units
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < WBK / 16; ++kk) wg::mma_ss<WN, TA, !TB>(acc, da + kStepA * kk, db + kStepB * kk);
  wg::commit();
}
// Stores a warpgroup's 64 x WN fp32 accumulator (wgmma fragment order) as bf16 into rows m_row0.. and
// columns n0.. of the group's C, inside its extents (I: the caller's index type).
template <int WN, class I>
__device__ __forceinline__ void store_acc(const Group<__nv_bfloat16>& g, const float (&acc)[WN / 2], I m_row0, I n0) {
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const std::int64_t m = m_row0 + 16 * w + gr + 8 * hf;
    if (m >= g.M) continue;
#pragma unroll
    for (int j = 0; j < WN / 8; ++j) {
      const std::int64_t n = n0 + 8 * j + 2 * tg;  // N % 8 == 0: n < N implies n + 1 < N
      if (n < g.N)
        *reinterpret_cast<__nv_bfloat162*>(g.C + m * g.ldc + n) =
            __floats2bfloat162_rn(acc[4 * j + 2 * hf], acc[4 * j + 2 * hf + 1]);
    }
  }
}
// Shared memory of the pipelined wgmma kernels: the A and B stage rings from the first 1024-byte
// boundary, then (the warp-specialised kernels) one `full` and one `empty` mbarrier per stage.
struct StageRing {
  __nv_bfloat16* As;     // [stage][WBM * WBK]
  __nv_bfloat16* Bs;     // [stage][WBN * WBK]
  std::uint64_t* full;   // [stage]
  std::uint64_t* empty;  // [stage]
};
__device__ __forceinline__ StageRing stage_ring(unsigned char* raw) {
  auto* as = reinterpret_cast<__nv_bfloat16*>(hcp::cuda::wg::align1024(raw));
  __nv_bfloat16* bs = as + kWgStages * WBM * WBK;
  auto* full = reinterpret_cast<std::uint64_t*>(bs + kWgStages * WBN * WBK);
  return {as, bs, full, full + kWgStages};
}
template <bool TA, bool TB>
__global__ void __launch_bounds__(kWgThreads, 1) gemm_wg_k(const Group<__nv_bfloat16>* groups, const Tile* tiles, int ntn) {
  using namespace hcp::cuda::tc;
  namespace wg = hcp::cuda::wg;
  using bf16 = __nv_bfloat16;
  extern __shared__ __align__(128) unsigned char wg_sm[];
  const StageRing ring = stage_ring(wg_sm);
  bf16 *const As = ring.As, *const Bs = ring.Bs;
  const Tile tl = tiles[blockIdx.x / ntn];
  const Group<bf16> g = groups[tl.group];
  const std::int64_t m0 = tl.m0, n0 = static_cast<std::int64_t>(blockIdx.x % ntn) * WBN;
  if (n0 >= g.N) return;
  const int nk = static_cast<int>((g.K + WBK - 1) / WBK);
  auto load = [&](int kt, int stage) {
    const std::int64_t k0 = static_cast<std::int64_t>(kt) * WBK;
    bf16* a = As + stage * WBM * WBK;
    bf16* b = Bs + stage * WBN * WBK;
    if (TA)
      for (int h = 0; h < 2; ++h)  // [k][64 m] blocks
        load_tile_async<64, kWgThreads>(a + h * kWgHalf, g.A + k0 * g.lda + m0 + 64 * h, g.lda, WBK, g.K - k0, g.M - m0 - 64 * h);
    else
      load_tile_async<WBK, kWgThreads>(a, g.A + m0 * g.lda + k0, g.lda, WBM, g.M - m0, g.K - k0);
    if (TB)
      load_tile_async<WBK, kWgThreads>(b, g.B + n0 * g.ldb + k0, g.ldb, WBN, g.N - n0, g.K - k0);
    else
      for (int h = 0; h < WBN / 64; ++h)  // [k][64 n] blocks
        load_tile_async<64, kWgThreads>(b + h * kWgHalf, g.B + k0 * g.ldb + n0 + 64 * h, g.ldb, WBK, g.K - k0, g.N - n0 - 64 * h);
  };
  // Loads run kDist stages ahead; one wgmma batch stays in flight (wait<1>), so the stage a load
  // refills, (kt + kDist) % kWgStages = (kt - 2) % kWgStages, was read by a batch every warpgroup has
  // finished before the barrier.
  constexpr int kDist = kWgStages - 2;
#pragma unroll
  for (int st = 0; st < kDist; ++st) {
    if (st < nk) load(st, st);
    cp_async_commit();
  }
  const int wgi = threadIdx.x >> 7;  // this warpgroup's rows: [64 wgi, +64)
  float acc[WBN / 2];
#pragma unroll
  for (int i = 0; i < WBN / 2; ++i) acc[i] = 0.f;
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kDist - 1>();
    wg::fence_proxy_async();
    __syncthreads();  // stage kt landed for everyone; every warpgroup finished its batch on stage kt - 2
    if (kt + kDist < nk) load(kt + kDist, (kt + kDist) % kWgStages);
    cp_async_commit();
    stage_mma<WBN, TA, TB>(acc, As + (kt % kWgStages) * WBM * WBK, Bs + (kt % kWgStages) * WBN * WBK, wgi);
    wg::wait<1>();
  }
  wg::wait<0>();
  cp_async_wait<0>();
  store_acc<WBN>(g, acc, m0 + 64 * wgi, n0);
}
// Warp-specialised variant of gemm_wg_k (same tile, layouts and accumulation order, so the same bits):
// warpgroup 0 only loads (cp.async into kWgStages stages, each stage's landing signalled on a `full`
// mbarrier), warpgroups 1 and 2 only multiply (64 rows each), waiting on `full` and releasing a stage on
// its `empty` mbarrier once the wgmma batch that read it has retired. No block-wide barrier in the K
// loop, so loads run up to kWgStages ahead of the tensor cores; registers move from the producer to
// the consumers (setmaxnreg). Selected by HCP_GEMM_WS (measured slower than gemm_wg_k).
constexpr int kWsThreads = 384;
template <bool TA, bool TB>
__global__ void __launch_bounds__(kWsThreads, 1) gemm_ws_k(const Group<__nv_bfloat16>* groups, const Tile* tiles, int ntn) {
  using namespace hcp::cuda::tc;
  namespace wg = hcp::cuda::wg;
  using bf16 = __nv_bfloat16;
  extern __shared__ __align__(128) unsigned char ws_sm[];
  const auto [As, Bs, full, empty] = stage_ring(ws_sm);
  const Tile tl = tiles[blockIdx.x / ntn];
  const Group<bf16> g = groups[tl.group];
  const std::int64_t m0 = tl.m0, n0 = static_cast<std::int64_t>(blockIdx.x % ntn) * WBN;
  if (n0 >= g.N) return;
  const int nk = static_cast<int>((g.K + WBK - 1) / WBK);
  if (threadIdx.x == 0)
    for (int st = 0; st < kWgStages; ++st) {
      wg::mbar_init(full + st, 128);  // one cp.async arrival per producer thread
      wg::mbar_init(empty + st, 256);  // one arrival per consumer thread
    }
  __syncthreads();
  const int wgi = threadIdx.x >> 7;
  if (wgi == 0) {
    wg::reg_dealloc<56>();
    for (int kt = 0; kt < nk; ++kt) {
      const int st = kt % kWgStages;
      if (kt >= kWgStages) wg::mbar_wait(empty + st, ((kt / kWgStages) - 1) & 1);
      const std::int64_t k0 = static_cast<std::int64_t>(kt) * WBK;
      bf16* a = As + st * WBM * WBK;
      bf16* b = Bs + st * WBN * WBK;
      if (TA)
        for (int h = 0; h < WBM / 64; ++h)
          load_tile_async<64, 128>(a + h * kWgHalf, g.A + k0 * g.lda + m0 + 64 * h, g.lda, WBK, g.K - k0, g.M - m0 - 64 * h);
      else
        load_tile_async<WBK, 128>(a, g.A + m0 * g.lda + k0, g.lda, WBM, g.M - m0, g.K - k0);
      if (TB)
        load_tile_async<WBK, 128>(b, g.B + n0 * g.ldb + k0, g.ldb, WBN, g.N - n0, g.K - k0);
      else
        for (int h = 0; h < WBN / 64; ++h)
          load_tile_async<64, 128>(b + h * kWgHalf, g.B + k0 * g.ldb + n0 + 64 * h, g.ldb, WBK, g.K - k0, g.N - n0 - 64 * h);
      wg::mbar_arrive_cp_async(full + st);
    }
    return;
  }
  wg::reg_alloc<224>();
  const int c = wgi - 1;  // this consumer's rows: [64 c, +64)
  float acc[WBN / 2];
#pragma unroll
  for (int i = 0; i < WBN / 2; ++i) acc[i] = 0.f;
  for (int kt = 0; kt < nk; ++kt) {
    const int st = kt % kWgStages;
    wg::mbar_wait(full + st, (kt / kWgStages) & 1);
    wg::fence_proxy_async();  // the landed cp.async data, for wgmma's reads through the async proxy
    stage_mma<WBN, TA, TB>(acc, As + st * WBM * WBK, Bs + st * WBN * WBK, c);
    wg::wait<1>();  // the batch on the previous stage has retired: release that stage
    if (kt > 0) wg::mbar_arrive(empty + (kt - 1) % kWgStages);
  }
  wg::wait<0>();
  store_acc<WBN>(g, acc, m0 + 64 * c, n0);
}
constexpr std::size_t kWsSmem = kWgSmem + 2 * kWgStages * sizeof(std::uint64_t);
// gemm_tma_k's staging buffers for the results: [2 consumer warpgroups][64][128] bf16 after the barriers.
constexpr std::size_t kStgSmem = 2 * 64 * 128 * sizeof(__nv_bfloat16);
static_assert(kWsSmem + kStgSmem <= 227 * 1024, "the ring and the staging buffers fit one block's shared memory");

// gemm_ws_k with TMA: one thread of the producer warpgroup fills a stage with 2-D tensor-map copies
// (the 128-byte swizzle of the wgmma layouts, zeros beyond each group's extents) that complete the
// stage's `full` barrier by their byte count. maps[2 g], maps[2 g + 1]: group g's A and B, boxes of
// [128 rows][64 k] (A K-major), [64 k][64 m] (A M-major), [256 rows][64 k] (B K-major), [64 k][64 n]
// (B N-major); gemm_tma_wide_k's K-major boxes are [256 rows][64 k] (A) and [192 rows][64 k] (B).
// Same tiles and accumulation order as gemm_wg_k (the same bits). HCP_GEMM_TMA_128.
// The TMA producers' copies of one stage (k0: its first k), completing `bar`: A rows [m0, m0 + kBM)
// as one [kBM rows][64 k] box (K-major) or kBM / 64 boxes [64 k][64 m] (M-major, TA); B columns
// [n0, n0 + kBN) as kParts boxes of [kBN / kParts rows][64 k] (K-major, TB: the cluster form's map
// holds half tiles) or kBN / 64 boxes [64 k][64 n] (N-major).
template <int kBM, bool TA>
__device__ __forceinline__ void tma_stage_a(__nv_bfloat16* a, const TensorMap* ma, int m0, int k0, std::uint64_t* bar) {
  if (TA)
    for (int h = 0; h < kBM / 64; ++h) hcp::cuda::wg::tma_load_2d(a + h * kWgHalf, ma, m0 + 64 * h, k0, bar);
  else
    hcp::cuda::wg::tma_load_2d(a, ma, k0, m0, bar);
}
template <int kBN, int kParts, bool TB>
__device__ __forceinline__ void tma_stage_b(__nv_bfloat16* b, const TensorMap* mb, int n0, int k0, std::uint64_t* bar) {
  if (TB)
    for (int h = 0; h < kParts; ++h)
      hcp::cuda::wg::tma_load_2d(b + h * (kBN / kParts) * WBK, mb, k0, n0 + h * (kBN / kParts), bar);
  else
    for (int h = 0; h < kBN / 64; ++h) hcp::cuda::wg::tma_load_2d(b + h * kWgHalf, mb, n0 + 64 * h, k0, bar);
}
// store_acc through shared memory: stg is this warpgroup's [64][128] bf16 buffer, its 16-byte chunks
// XOR-swizzled by row (chunk q of row r at q ^ (r & 7)) so that both the fragment writes (8 rows, one
// chunk each) and the row reads are free of bank conflicts; bar: the warpgroup's named barrier.
template <int WN>
__device__ __forceinline__ void store_acc_staged(const Group<__nv_bfloat16>& g, const float (&acc)[WN / 2], int m_row0, int n0,
                                                 __nv_bfloat16* stg, int bar) {
  const int t = threadIdx.x & 127, w = t >> 5, lane = t & 31, gr = lane >> 2, tg = lane & 3;
  auto* s32 = reinterpret_cast<std::uint32_t*>(stg);
  const auto* s128 = reinterpret_cast<const uint4*>(stg);
#pragma unroll
  for (int h = 0; h < (WN + 127) / 128; ++h) {
    constexpr int kCw0 = WN < 128 ? WN / 8 : 16;  // 16-byte chunks per row of this half
#pragma unroll
    for (int j = 0; j < kCw0; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = 16 * w + gr + 8 * hf, jj = 16 * h + j;
        __nv_bfloat162 v = __floats2bfloat162_rn(acc[4 * jj + 2 * hf], acc[4 * jj + 2 * hf + 1]);
        s32[r * 64 + (j ^ gr) * 4 + tg] = *reinterpret_cast<std::uint32_t*>(&v);
      }
    asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");
#pragma unroll
    for (int i = t; i < 64 * kCw0; i += 128) {
      const int r = i / kCw0, q = i % kCw0;
      const std::int64_t m = static_cast<std::int64_t>(m_row0) + r, n = n0 + 128 * h + 8 * q;
      if (m < g.M && n < g.N) *reinterpret_cast<uint4*>(g.C + m * g.ldc + n) = s128[r * 16 + (q ^ (r & 7))];
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");  // the buffer is free for the next half or tile
  }
}
// One consumer warpgroup of gemm_tma_k: rows [64 c, +64) of the tile at (m0, n0), its first WN
// columns (WN <= WBN), stage by stage as the producer fills them; then the bf16 stores.
// A stage is released by one arrival per consumer warp once its products have retired, on this CTA's
// `empty` barrier and, when the cluster pair shares B (both = true), on the partner's as well.
// kEpi: the stores staged through stg (store_acc_staged).
template <int WN, bool TA, bool TB, bool kEpi>
__device__ __forceinline__ void tma_consume(const Group<__nv_bfloat16>& g, const __nv_bfloat16* As, const __nv_bfloat16* Bs,
                                            std::uint64_t* full, std::uint64_t* empty, int nk, int c, int m0, int n0, bool live,
                                            bool both, __nv_bfloat16* stg) {
  namespace wg = hcp::cuda::wg;
  float acc[WN / 2];
#pragma unroll
  for (int i = 0; i < WN / 2; ++i) acc[i] = 0.f;
  for (int kt = 0; kt < nk; ++kt) {
    const int st = kt % kWgStages;
    wg::mbar_wait(full + st, (kt / kWgStages) & 1);
    if (live) stage_mma<WN, TA, TB>(acc, As + st * WBM * WBK, Bs + st * WBN * WBK, c);
    wg::wait<1>();  // the batch on the previous stage has retired: release that stage
    if (kt > 0 && (threadIdx.x & 31) == 0) {
      std::uint64_t* e = empty + (kt - 1) % kWgStages;
      if (both) {
        wg::mbar_arrive_cluster(e, 0);
        wg::mbar_arrive_cluster(e, 1);
      } else {
        wg::mbar_arrive(e);
      }
    }
  }
  wg::wait<0>();
  if constexpr (kEpi) {
    if (live) store_acc_staged<WN>(g, acc, m0 + 64 * c, n0, stg, 1 + c);  // live is uniform over the warpgroup
  } else if (live) {
    store_acc<WN>(g, acc, m0 + 64 * c, n0);
  }
}
template <bool TA, bool TB, bool kMc, bool kEpi = false>
__global__ void __launch_bounds__(kWsThreads, 1) gemm_tma_k(const Group<__nv_bfloat16>* groups, const Tile* tiles, int ntn,
                                                            const TensorMap* maps) {
  using namespace hcp::cuda::tc;
  namespace wg = hcp::cuda::wg;
  using bf16 = __nv_bfloat16;
  extern __shared__ __align__(128) unsigned char tm_sm[];
  // stage_ring's layout, spelled out: through stage_ring or wg::align1024 the staged-store forms of
  // this kernel compile to different sm_90a code (same length, most instructions changed), while the
  // code as it stands is what passed on the H200.
  bf16* As = reinterpret_cast<bf16*>(tm_sm + ((1024u - (smem_u32(tm_sm) & 1023u)) & 1023u));  // [stage][WBM * WBK]
  bf16* Bs = As + kWgStages * WBM * WBK;                                                        // [stage][WBN * WBK]
  auto* full = reinterpret_cast<std::uint64_t*>(Bs + kWgStages * WBN * WBK);                    // [stage]
  std::uint64_t* empty = full + kWgStages;                                                      // [stage]
  // Without clusters block b is (tile b / ntn, N tile b % ntn); with them cluster b / 2 is (tile pair
  // (b / 2) / ntn, N tile (b / 2) % ntn) and the CTA's rank picks the pair's tile.
  const unsigned rank = kMc ? wg::cluster_rank() : 0;
  const unsigned bi = kMc ? blockIdx.x / 2 : blockIdx.x;
  const Tile tl = tiles[kMc ? 2 * (bi / ntn) + rank : bi / ntn];
  const bool shared = kMc && tl.shared != 0;
  const Group<bf16> g = groups[tl.group];
  const int m0 = tl.m0, n0 = static_cast<int>(bi % ntn) * WBN;
  const bool idle = m0 < 0 || n0 >= g.N;
  if (!kMc && idle) return;
  const int nk = static_cast<int>((g.K + WBK - 1) / WBK);
  if (threadIdx.x == 0)
    for (int st = 0; st < kWgStages; ++st) {
      wg::mbar_init(full + st, 1);                 // the producer's arrive; the copies complete the bytes
      wg::mbar_init(empty + st, shared ? 16 : 8);  // one arrival per consumer warp (of both CTAs when shared)
    }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  if constexpr (kMc) wg::cluster_sync();  // the partner's barriers exist before any copy or arrival names them
  else __syncthreads();
  const int wgi = threadIdx.x >> 7;
  if (idle) {
  } else if (wgi == 0) {
    wg::reg_dealloc<56>();
    if (threadIdx.x == 0) {
      const TensorMap* ma = maps + 2 * tl.group;
      const TensorMap* mb = ma + 1;
      constexpr unsigned kBytes = (WBM + WBN) * WBK * sizeof(bf16);
      for (int kt = 0; kt < nk; ++kt) {
        const int st = kt % kWgStages;
        if (kt >= kWgStages) wg::mbar_wait(empty + st, ((kt / kWgStages) - 1) & 1);
        const int k0 = kt * WBK;
        bf16* a = As + st * WBM * WBK;
        bf16* b = Bs + st * WBN * WBK;
        wg::mbar_arrive_expect_tx(full + st, kBytes);
        tma_stage_a<WBM, TA>(a, ma, m0, k0, full + st);
        if (shared) {  // this CTA's half of B (its 64-column blocks [hb, hb + WBN / 128)), into both CTAs
          const int hb = static_cast<int>(rank) * (WBN / 128);
          if (TB)
            wg::tma_load_2d_mc(b + hb * kWgHalf, mb, k0, n0 + 64 * hb, full + st, 3);
          else
            for (int h = hb; h < hb + WBN / 128; ++h) wg::tma_load_2d_mc(b + h * kWgHalf, mb, n0 + 64 * h, k0, full + st, 3);
        } else {
          tma_stage_b<WBN, kMc ? 2 : 1, TB>(b, mb, n0, k0, full + st);  // with clusters the map's box is half the tile
        }
      }
    }
  } else {
    wg::reg_alloc<224>();
    const int c = wgi - 1;  // this consumer's rows: [64 c, +64)
    // The tile's last columns on a narrower product (64, 128 or 256 wide, not all 256 every time); a
    // consumer whose 64 rows all lie beyond the group multiplies nothing (it still releases each stage).
    const bool live = m0 + 64 * c < g.M;
    const int w = static_cast<int>(g.N - n0);
    bf16* stg = reinterpret_cast<bf16*>(empty + kWgStages) + c * 64 * 128;  // kEpi: [2][64 * 128] after the barriers
    if (w <= 64) tma_consume<64, TA, TB, kEpi>(g, As, Bs, full, empty, nk, c, m0, n0, live, shared, stg);
    else if (w <= 128) tma_consume<128, TA, TB, kEpi>(g, As, Bs, full, empty, nk, c, m0, n0, live, shared, stg);
    else tma_consume<WBN, TA, TB, kEpi>(g, As, Bs, full, empty, nk, c, m0, n0, live, shared, stg);
  }
  if constexpr (kMc) wg::cluster_sync();  // no CTA leaves while its partner may still signal it
}

// gemm_tma_wide_k (the default): 256 x 192 block tiles. A 128 x 256 stage brings 85 flops per byte
// from L2, a 256 x 192 one 110; gemm_tma_k's L2 traffic (~7 TB/s at 1.85 ms on the MoE shape) is
// about what dense cuBLAS moves with its clusters. Two consumer warpgroups own 128 rows each (two
// 64-row halves, m64n192k16 per half: 192 fp32 accumulators per thread) and one thread of the
// producer warpgroup fills the 4-stage ring by TMA; the producer gives up registers (setmaxnreg) so
// that each consumer thread may hold kXConsRegs. Each output element sums its k16 products in the
// same order as gemm_tma_k's. On the H200, MoE shape: 1.52 against 1.83 ms for gemm_tma_k (same
// run). In wide_consume each branch has its own fence / products / commit: with one fence ahead of
// a branch between both halves and the first alone, ptxas serialised the wgmma batches (warning
// C7520: a compiler-inserted warpgroup arrive on a divergent path) and the kernel took 1.67-1.73 ms.
constexpr int XBM = 256, XBN = 192, kXThreads = 384, kXProdRegs = 40, kXConsRegs = 232;
static_assert(kXProdRegs + 2 * kXConsRegs <= 512, "per SM sub-partition: one producer and two consumer warps' registers");
constexpr std::size_t kXSmem = static_cast<std::size_t>(kWgStages) * (XBM + XBN) * WBK * sizeof(__nv_bfloat16) + 1024 +
                               2 * kWgStages * sizeof(std::uint64_t);
static_assert(kXSmem <= 227 * 1024 && 2 * 64 * 128 <= kWgStages * XBN * WBK, "the ring fits; the staging buffers fit its B part");
// A 64 x WN accumulator's columns [128 h, +128) (or fewer) through store_acc_staged.
template <int WN>
__device__ __forceinline__ void store_wide_half(const Group<__nv_bfloat16>& g, const float (&acc)[WN / 2], int m_row0, int n0,
                                                __nv_bfloat16* stg, int bar) {
  if constexpr (WN <= 128) {
    store_acc_staged<WN>(g, acc, m_row0, n0, stg, bar);
  } else {
    static_assert(WN == 192, "192 = 128 + 64 columns");
    store_acc_staged<128>(g, *reinterpret_cast<const float(*)[64]>(&acc[0]), m_row0, n0, stg, bar);
    store_acc_staged<64>(g, *reinterpret_cast<const float(*)[32]>(&acc[64]), m_row0, n0 + 128, stg, bar);
  }
}
template <int WN, bool TA, bool TB, bool kEpi>
__device__ __forceinline__ void wide_consume(const Group<__nv_bfloat16>& g, const __nv_bfloat16* As, const __nv_bfloat16* Bs,
                                             std::uint64_t* full, std::uint64_t* empty, int nk, int c, int m0, int n0,
                                             __nv_bfloat16* stg) {
  namespace wg = hcp::cuda::wg;
  float acc0[WN / 2], acc1[WN / 2];
#pragma unroll
  for (int i = 0; i < WN / 2; ++i) acc0[i] = acc1[i] = 0.f;
  // This warpgroup's halves: rows [128 c, +64) and [128 c + 64, +64) of the tile (uniform per warpgroup).
  const bool live0 = m0 + 128 * c < g.M, live1 = m0 + 128 * c + 64 < g.M;
  constexpr std::uint64_t kStepA = TA ? 128 : 2, kStepB = TB ? 2 : 128;  // one k16 slice, in 16-byte units
  for (int kt = 0; kt < nk; ++kt) {
    const int st = kt % kWgStages;
    wg::mbar_wait(full + st, (kt / kWgStages) & 1);
    const __nv_bfloat16* a = As + st * XBM * WBK;
    const __nv_bfloat16* b = Bs + st * XBN * WBK;
    const __nv_bfloat16 *a0 = a + (TA ? 2 * c * kWgHalf : 128 * c * WBK), *a1 = a0 + (TA ? kWgHalf : 64 * WBK);
    const std::uint64_t da0 = TA ? wg::desc_mn128(a0, kWgHalf * sizeof(__nv_bfloat16)) : wg::desc_k128(a0);
    const std::uint64_t da1 = TA ? wg::desc_mn128(a1, kWgHalf * sizeof(__nv_bfloat16)) : wg::desc_k128(a1);
    const std::uint64_t db = TB ? wg::desc_k128(b) : wg::desc_mn128(b, kWgHalf * sizeof(__nv_bfloat16));
    if (live1) {
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < WBK / 16; ++kk) {
        wg::mma_ss<WN, TA, !TB>(acc0, da0 + kStepA * kk, db + kStepB * kk);
        wg::mma_ss<WN, TA, !TB>(acc1, da1 + kStepA * kk, db + kStepB * kk);
      }
      wg::commit();
    } else if (live0) {
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < WBK / 16; ++kk) wg::mma_ss<WN, TA, !TB>(acc0, da0 + kStepA * kk, db + kStepB * kk);
      wg::commit();
    }
    wg::wait<1>();  // the batch on the previous stage has retired: release that stage
    if (kt > 0 && (threadIdx.x & 31) == 0) wg::mbar_arrive(empty + (kt - 1) % kWgStages);
  }
  wg::wait<0>();
  const int r0 = m0 + 128 * c;
  if constexpr (kEpi) {
    asm volatile("bar.sync 3, 256;\n" ::: "memory");  // both warpgroups' products have retired: the ring is idle
    if (live0) store_wide_half<WN>(g, acc0, r0, n0, stg, 1 + c);
    if (live1) store_wide_half<WN>(g, acc1, r0 + 64, n0, stg, 1 + c);
  } else {
    if (live0) store_acc<WN>(g, acc0, r0, n0);
    if (live1) store_acc<WN>(g, acc1, r0 + 64, n0);
  }
}
template <bool TA, bool TB, bool kEpi>
__global__ void __launch_bounds__(kXThreads, 1) gemm_tma_wide_k(const Group<__nv_bfloat16>* groups, const Tile* tiles, int ntn,
                                                                const TensorMap* maps) {
  namespace wg = hcp::cuda::wg;
  using bf16 = __nv_bfloat16;
  extern __shared__ __align__(128) unsigned char tx_sm[];
  bf16* As = reinterpret_cast<bf16*>(wg::align1024(tx_sm));  // [stage][XBM * WBK]
  bf16* Bs = As + kWgStages * XBM * WBK;                     // [stage][XBN * WBK]
  auto* full = reinterpret_cast<std::uint64_t*>(Bs + kWgStages * XBN * WBK);
  std::uint64_t* empty = full + kWgStages;
  const Tile tl = tiles[blockIdx.x / ntn];
  const Group<bf16> g = groups[tl.group];
  const int m0 = tl.m0, n0 = static_cast<int>(blockIdx.x % ntn) * XBN;
  if (n0 >= g.N) return;
  const int nk = static_cast<int>((g.K + WBK - 1) / WBK);
  if (threadIdx.x == 0)
    for (int st = 0; st < kWgStages; ++st) {
      wg::mbar_init(full + st, 1);   // the producer's arrive; the copies complete the bytes
      wg::mbar_init(empty + st, 8);  // one arrival per consumer warp
    }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
  if (threadIdx.x < 128) {
    wg::reg_dealloc<kXProdRegs>();
    if (threadIdx.x == 0) {
      const TensorMap* ma = maps + 2 * tl.group;
      const TensorMap* mb = ma + 1;
      constexpr unsigned kBytes = (XBM + XBN) * WBK * sizeof(bf16);
      for (int kt = 0; kt < nk; ++kt) {
        const int st = kt % kWgStages;
        if (kt >= kWgStages) wg::mbar_wait(empty + st, ((kt / kWgStages) - 1) & 1);
        const int k0 = kt * WBK;
        bf16* a = As + st * XBM * WBK;
        bf16* b = Bs + st * XBN * WBK;
        wg::mbar_arrive_expect_tx(full + st, kBytes);
        tma_stage_a<XBM, TA>(a, ma, m0, k0, full + st);
        tma_stage_b<XBN, 1, TB>(b, mb, n0, k0, full + st);
      }
    }
    return;
  }
  wg::reg_alloc<kXConsRegs>();
  const int c = (threadIdx.x >> 7) - 1;
  // The tile's last columns on a narrower product (64, 128 or 192 wide).
  const int w = static_cast<int>(g.N - n0);
  bf16* stg = Bs + c * 64 * 128;  // kEpi: this warpgroup's [64 * 128] staging buffer, in the idle ring
  if (w <= 64) wide_consume<64, TA, TB, kEpi>(g, As, Bs, full, empty, nk, c, m0, n0, stg);
  else if (w <= 128) wide_consume<128, TA, TB, kEpi>(g, As, Bs, full, empty, nk, c, m0, n0, stg);
  else wide_consume<XBN, TA, TB, kEpi>(g, As, Bs, full, empty, nk, c, m0, n0, stg);
}

static_assert(sizeof(TensorMap) == sizeof(CUtensorMap), "a TensorMap holds one CUtensorMap");
// The pipelined path needs 16-byte rows: contiguous extents, leading dimensions and bases aligned to 8 elements.
bool tc_ok(bool ta, bool tb, const std::vector<GemmGroupDesc>& desc) {
  for (const GemmGroupDesc& d : desc) {
    const bool ext = (ta ? d.M : d.K) % 8 == 0 && (tb ? d.K : d.N) % 8 == 0 && d.N % 8 == 0;
    const bool lds = d.lda % 8 == 0 && d.ldb % 8 == 0 && d.ldc % 8 == 0;
    if (d.M > 0 && !(ext && lds && aligned16(d.A) && aligned16(d.B) && aligned16(d.C))) return false;
  }
  return true;
}

template <class S, bool TA, bool TB> void launch(const std::vector<GemmGroupDesc>& desc, std::int64_t N) {
  constexpr bool kBf16 = std::is_same_v<S, __nv_bfloat16>;
  const bool tc = kBf16 && tc_ok(TA, TB, desc);
  // The wgmma kernel for every operand layout; HCP_GEMM_MMA_SYNC set in the environment keeps the
  // mma.sync kernel (side-by-side timing and testing while the wgmma kernel is new).
  static const bool keep_sync = std::getenv("HCP_GEMM_MMA_SYNC") != nullptr;
  const bool wg = tc && !keep_sync;
  static const bool cp_async = std::getenv("HCP_GEMM_WG") != nullptr, ws = std::getenv("HCP_GEMM_WS") != nullptr,
                    tma = !cp_async && !ws;
  // HCP_GEMM_TMA_CLUSTER set in the environment: clusters of two CTAs sharing B tiles by multicast.
  // Correct (tests, memcheck) but slower on the H200: 2.77 against 1.92 ms on the MoE benchmark
  // shape (each pair runs in lockstep, every stage waiting for the slower CTA's release).
  static const bool mc = std::getenv("HCP_GEMM_TMA_CLUSTER") != nullptr;
  // 256 x 192 block tiles (gemm_tma_wide_k) unless HCP_GEMM_TMA_128 keeps 128 x 256 (gemm_tma_k).
  static const bool tma128 = std::getenv("HCP_GEMM_TMA_128") != nullptr;
  const bool wide = kBf16 && wg && tma && !mc && !tma128;
  const int bm = wide ? XBM : tc ? TBM : BM, bn = wide ? XBN : wg ? WBN : tc ? TBN : BN;
  static_assert(WBM == TBM, "the wgmma and mma.sync kernels share the tile list (but for the 256-row wide tiles)");
  std::vector<Group<S>> groups;
  std::vector<Tile> tiles;
  for (const GemmGroupDesc& d : desc) {
    HCP_CHECK(d.N == N, "grouped_gemm: every group must have the same N (", N, "), got ", d.N);
    const int gi = static_cast<int>(groups.size());
    groups.push_back({static_cast<const S*>(d.A), static_cast<const S*>(d.B), static_cast<S*>(d.C), d.M, d.N, d.K, d.lda, d.ldb, d.ldc});
    for (std::int64_t m0 = 0; m0 < d.M; m0 += bm) tiles.push_back({gi, static_cast<int>(m0)});
  }
  if (tiles.empty() || N == 0) return;
  Group<S>* dg = nullptr;
  Tile* dt = nullptr;
  HCP_CUDA_CHECK(cudaMallocAsync(&dg, groups.size() * sizeof(Group<S>), 0));
  HCP_CUDA_CHECK(cudaMallocAsync(&dt, tiles.size() * sizeof(Tile), 0));
  HCP_CUDA_CHECK(cudaMemcpyAsync(dg, groups.data(), groups.size() * sizeof(Group<S>), cudaMemcpyHostToDevice, 0));
  HCP_CUDA_CHECK(cudaMemcpyAsync(dt, tiles.data(), tiles.size() * sizeof(Tile), cudaMemcpyHostToDevice, 0));
  const dim3 grid(static_cast<unsigned>(tiles.size()), static_cast<unsigned>((N + bn - 1) / bn));
  // The pipelined kernels: one block per (tile, N tile), grid.x * grid.y blocks on a 1-D grid, with
  // `smem` bytes of dynamic shared memory.
  const auto launch_flat = [&grid](auto kern, int threads, std::size_t smem, auto... args) {
    HCP_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    const std::int64_t blocks = static_cast<std::int64_t>(grid.x) * grid.y;
    HCP_CHECK(blocks < (1ll << 31), "grouped_gemm: ", blocks, " blocks exceed one launch");
    kern<<<static_cast<unsigned>(blocks), threads, smem>>>(args...);
  };
  if constexpr (kBf16) {
    if (wg && tma) {
      // The results leave through a shared-memory staging buffer in 16-byte row stores (1.85 against
      // 1.91-1.95 ms on the MoE benchmark shape, same run); HCP_GEMM_TMA_DIRECT_STORE set in the
      // environment keeps the 4-byte stores straight from the accumulator (as the cluster form does).
      static const bool direct = std::getenv("HCP_GEMM_TMA_DIRECT_STORE") != nullptr;
      // Per group: A [M][K] (K-major) or [K][M]; B [N][K] or [K][N] (groups with no rows: no tile reads them).
      std::vector<TensorMap> maps(2 * groups.size());
      for (std::size_t i = 0; i < groups.size(); ++i) {
        const Group<S>& gr = groups[i];
        if (gr.M <= 0 || gr.K <= 0) continue;
        maps[2 * i] = TA ? make_map(gr.A, gr.K, gr.M, gr.lda, 64, 64) : make_map(gr.A, gr.M, gr.K, gr.lda, bm, WBK);
        maps[2 * i + 1] = TB ? make_map(gr.B, gr.N, gr.K, gr.ldb, mc ? WBN / 2 : bn, WBK) : make_map(gr.B, gr.K, gr.N, gr.ldb, 64, 64);
      }
      TensorMap* dm = nullptr;
      HCP_CUDA_CHECK(cudaMallocAsync(&dm, maps.size() * sizeof(TensorMap), 0));
      HCP_CUDA_CHECK(cudaMemcpyAsync(dm, maps.data(), maps.size() * sizeof(TensorMap), cudaMemcpyHostToDevice, 0));
      if (mc) {
        // Pairs of tiles: two consecutive tiles of one group share B; a group's odd last tile pairs
        // with the next such tile (unshared), and a final one with an idle partner.
        std::vector<Tile> pairs;
        pairs.reserve(tiles.size() + 2);
        Tile odd{};
        bool have_odd = false;
        for (std::size_t i = 0; i < tiles.size();) {
          if (i + 1 < tiles.size() && tiles[i + 1].group == tiles[i].group) {
            pairs.push_back({tiles[i].group, tiles[i].m0, 1});
            pairs.push_back({tiles[i + 1].group, tiles[i + 1].m0, 1});
            i += 2;
            continue;
          }
          if (have_odd) {
            pairs.push_back(odd);
            pairs.push_back({tiles[i].group, tiles[i].m0, 0});
          } else {
            odd = {tiles[i].group, tiles[i].m0, 0};
          }
          have_odd = !have_odd;
          ++i;
        }
        if (have_odd) {
          pairs.push_back(odd);
          pairs.push_back({odd.group, -1, 0});
        }
        Tile* dp = nullptr;
        HCP_CUDA_CHECK(cudaMallocAsync(&dp, pairs.size() * sizeof(Tile), 0));
        HCP_CUDA_CHECK(cudaMemcpyAsync(dp, pairs.data(), pairs.size() * sizeof(Tile), cudaMemcpyHostToDevice, 0));
        auto* kern = gemm_tma_k<TA, TB, true>;
        HCP_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kWsSmem)));
        const std::int64_t blocks = static_cast<std::int64_t>(pairs.size()) * grid.y;
        HCP_CHECK(blocks < (1ll << 31), "grouped_gemm: ", blocks, " blocks exceed one launch");
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(static_cast<unsigned>(blocks));
        cfg.blockDim = dim3(kWsThreads);
        cfg.dynamicSmemBytes = kWsSmem;
        cfg.stream = 0;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 2;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        HCP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, static_cast<const Group<S>*>(dg), static_cast<const Tile*>(dp),
                                          static_cast<int>(grid.y), static_cast<const TensorMap*>(dm)));
        HCP_CUDA_CHECK(cudaFreeAsync(dp, 0));
      } else if (wide) {
        if (direct) launch_flat(gemm_tma_wide_k<TA, TB, false>, kXThreads, kXSmem, dg, dt, static_cast<int>(grid.y), dm);
        else launch_flat(gemm_tma_wide_k<TA, TB, true>, kXThreads, kXSmem, dg, dt, static_cast<int>(grid.y), dm);
      } else {
        if (direct)
          launch_flat(gemm_tma_k<TA, TB, false>, kWsThreads, kWsSmem, dg, dt, static_cast<int>(grid.y), dm);
        else
          launch_flat(gemm_tma_k<TA, TB, false, true>, kWsThreads, kWsSmem + kStgSmem, dg, dt, static_cast<int>(grid.y), dm);
      }
      HCP_CUDA_CHECK(cudaFreeAsync(dm, 0));
    } else if (wg && ws) {
      launch_flat(gemm_ws_k<TA, TB>, kWsThreads, kWsSmem, dg, dt, static_cast<int>(grid.y));
    } else if (wg) {
      launch_flat(gemm_wg_k<TA, TB>, kWgThreads, kWgSmem, dg, dt, static_cast<int>(grid.y));
    } else if (tc) {
      launch_flat(gemm_tc_k<TA, TB>, kTcThreads, kTcSmem, dg, dt, static_cast<int>(grid.y));
    } else {
      gemm_wmma_k<TA, TB><<<grid, kThreads>>>(dg, dt);
    }
  } else {
    gemm_fma_k<S, typename Acc<S>::type, TA, TB><<<grid, kThreads>>>(dg, dt);
  }
  check_launch("grouped_gemm");
  // The host vectors above are pageable: cudaMemcpyAsync has copied them before returning.
  HCP_CUDA_CHECK(cudaFreeAsync(dg, 0));
  HCP_CUDA_CHECK(cudaFreeAsync(dt, 0));
}
template <class S> void launch_t(bool ta, bool tb, const std::vector<GemmGroupDesc>& desc, std::int64_t N) {
  if (ta && tb) launch<S, true, true>(desc, N);
  else if (ta) launch<S, true, false>(desc, N);
  else if (tb) launch<S, false, true>(desc, N);
  else launch<S, false, false>(desc, N);
}
}  // namespace

void grouped_gemm(bool trans_a, bool trans_b, const std::vector<GemmGroupDesc>& groups, DType dt) {
  if (groups.empty()) return;
  const std::int64_t N = groups.front().N;
  switch (dt) {
    case DType::F64: launch_t<double>(trans_a, trans_b, groups, N); break;
    case DType::F32: launch_t<float>(trans_a, trans_b, groups, N); break;
    default: launch_t<__nv_bfloat16>(trans_a, trans_b, groups, N); break;
  }
}

// The driver's tensor-map encoder, found through the runtime (no link against libcuda).
namespace {
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    HCP_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    HCP_CHECK(q == cudaDriverEntryPointSuccess && p != nullptr, "tensor map: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}
}  // namespace

TensorMap make_map(const void* base, std::int64_t rows, std::int64_t cols, std::int64_t ld, unsigned box_rows, unsigned box_cols) {
  TensorMap m{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {box_cols, box_rows}, estr[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(reinterpret_cast<CUtensorMap*>(&m), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                                          const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  HCP_CHECK(r == CUDA_SUCCESS, "tensor map: cuTensorMapEncodeTiled failed (", static_cast<int>(r), ") for a ", rows, " x ",
            cols, " operand, leading dimension ", ld);
  return m;
}
}  // namespace hcp::kernels::cuda_impl
