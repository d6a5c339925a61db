// Grouped GEMM: one launch computes C_g = op(A_g) op(B_g) for every group g (the experts of a MoE
// layer). The blocks cover (tile list) x (N tiles); the tile list names each block's group and M
// offset, so groups of any size (also empty ones) share one launch without padding.
//
// Kernel choice (gemm_plan, a pure function of dtype and operand layout):
//   bf16, every contiguous extent, leading dimension and base 16-byte aligned (the MoE shapes):
//     gemm_tma_wide_k, Hopper wgmma on 256 x 192 x 64 block tiles; one producer thread fills a
//     4-stage ring by TMA, two consumer warpgroups of 128 rows multiply and store through shared memory;
//   other bf16 operands: gemm_wmma_k, WMMA 16x16x16 on tiles loaded element-wise;
//   fp32 / fp64: gemm_fma_k, 4x4 register tiles.
// Every output element has one owner and a fixed K order: bitwise repeatable, no atomics. A group with
// K = 0 writes zeros (an expert that received no tokens gets a zero weight gradient).
#include <mma.h>

#include <cuda.h>
#include <cudaTypedefs.h>

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

template <class S>
struct Group {
  const S* A;
  const S* B;
  S* C;
  std::int64_t M, N, K, lda, ldb, ldc;
};
struct Tile {
  int group;
  int m0;
};

// A tile of op(A) [BM x BK] and op(B) [BK x BN] into shared memory (zero outside the matrix).
template <bool TA, bool TB, class S, class T, int LDA, int LDB>
__device__ __forceinline__ void load_tiles(T (*As)[LDA], T (*Bs)[LDB], const Group<S>& g, std::int64_t m0,
                                           std::int64_t n0, std::int64_t k0, bool a_km) {
  for (int i = threadIdx.x; i < BM * BK; i += blockDim.x) {
    // Walk along the contiguous axis of the source for coalescing.
    const int m = TA ? i % BM : i / BK, k = TA ? i / BM : i % BK;
    const std::int64_t gm = m0 + m, gk = k0 + k;
    float v = 0;
    if (gm < g.M && gk < g.K) v = ld(TA ? g.A + gk * g.lda + gm : g.A + gm * g.lda + gk);
    if (a_km)
      As[k][m] = T(v);
    else
      As[m][k] = T(v);
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
__device__ __forceinline__ void load_tiles_f64(double (*As)[BM], double (*Bs)[BN], const Group<double>& g,
                                               std::int64_t m0, std::int64_t n0, std::int64_t k0) {
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
template <class S, class A, bool TA, bool TB>
__global__ void gemm_fma_k(const Group<S>* groups, const Tile* tiles) {
  __shared__ A As[BK][BM];
  __shared__ A Bs[BK][BN];
  const Tile tl = tiles[blockIdx.x];
  const Group<S> g = groups[tl.group];
  const std::int64_t m0 = tl.m0, n0 = static_cast<std::int64_t>(blockIdx.y) * BN;
  if (n0 >= g.N) return;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  A acc[4][4] = {};
  for (std::int64_t k0 = 0; k0 < g.K; k0 += BK) {
    if constexpr (std::is_same_v<S, double>)
      load_tiles_f64<TA, TB>(As, Bs, g, m0, n0, k0);
    else
      load_tiles<TA, TB, S, A, BM, BN>(As, Bs, g, m0, n0, k0, true);
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
template <bool TA, bool TB>
__global__ void gemm_wmma_k(const Group<__nv_bfloat16>* groups, const Tile* tiles) {
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

// ---- Hopper: wgmma fed by TMA ---------------------------------------------------------------------
// Shared-memory operand tiles are 128-byte swizzled (the wgmma layouts). K-major operands (A [M][K],
// B [N][K]) are stored [rows][64 k]; MN-major ones (TA: A [K][M], !TB: B [K][N]) as [64 k][64] blocks
// of 64 M/N each, read through the transpose immediates.
constexpr int WBK = 64, kWgStages = 4;
constexpr int kWgHalf = 64 * WBK;  // elements of one [64][64] block

// The producer's TMA copies of one stage (k0: its first k), completing `bar`: A rows [m0, m0 + kBM)
// as one [kBM rows][64 k] box (K-major) or kBM / 64 boxes [64 k][64 m] (M-major, TA); B columns
// [n0, n0 + kBN) as one [kBN rows][64 k] box (K-major, TB) or kBN / 64 boxes [64 k][64 n] (N-major).
// maps[2 g], maps[2 g + 1]: group g's A and B with those boxes (zeros beyond each group's extents).
template <int kBM, bool TA>
__device__ __forceinline__ void tma_stage_a(__nv_bfloat16* a, const TensorMap* ma, int m0, int k0, std::uint64_t* bar) {
  if (TA)
    for (int h = 0; h < kBM / 64; ++h) ptx::tma_load_2d(a + h * kWgHalf, ma, m0 + 64 * h, k0, bar);
  else
    ptx::tma_load_2d(a, ma, k0, m0, bar);
}
template <int kBN, bool TB>
__device__ __forceinline__ void tma_stage_b(__nv_bfloat16* b, const TensorMap* mb, int n0, int k0, std::uint64_t* bar) {
  if (TB)
    ptx::tma_load_2d(b, mb, k0, n0, bar);
  else
    for (int h = 0; h < kBN / 64; ++h) ptx::tma_load_2d(b + h * kWgHalf, mb, n0 + 64 * h, k0, bar);
}
// A warpgroup's 64 x WN fp32 accumulator (wgmma fragment order) as bf16 into rows m_row0.. and
// columns n0.. of the group's C, inside its extents, through shared memory: stg is this warpgroup's [64][128] bf16
// buffer, its 16-byte chunks XOR-swizzled by row (chunk q of row r at q ^ (r & 7)) so that both the fragment writes (8
// rows, one chunk each) and the row reads are free of bank conflicts; bar: the warpgroup's named barrier.
template <int WN>
__device__ __forceinline__ void store_acc_staged(const Group<__nv_bfloat16>& g, const float (&acc)[WN / 2], int m_row0,
                                                 int n0, __nv_bfloat16* stg, int bar) {
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
    ptx::bar_sync(bar, 128);
#pragma unroll
    for (int i = t; i < 64 * kCw0; i += 128) {
      const int r = i / kCw0, q = i % kCw0;
      const std::int64_t m = static_cast<std::int64_t>(m_row0) + r, n = n0 + 128 * h + 8 * q;
      if (m < g.M && n < g.N) *reinterpret_cast<uint4*>(g.C + m * g.ldc + n) = s128[r * 16 + (q ^ (r & 7))];
    }
    ptx::bar_sync(bar, 128);  // the buffer is free for the next half or tile
  }
}
// gemm_tma_wide_k: 256 x 192 block tiles, 110 flops per byte of L2 traffic per stage (a 128 x 256
// tile brings 85). Two consumer warpgroups own 128 rows each (two 64-row halves, m64n192k16 per half:
// 192 fp32 accumulators per thread) and one thread of the producer warpgroup fills the 4-stage ring
// by TMA; the producer gives up registers (setmaxnreg) so that each consumer thread may hold
// kXConsRegs. In wide_consume each branch has its own fence / products / commit: with one fence ahead
// of a branch between both halves and the first alone, ptxas serialises the wgmma batches (warning
// C7520: a compiler-inserted warpgroup arrive on a divergent path).
constexpr int XBM = 256, XBN = 192, kXThreads = 384, kXProdRegs = 40, kXConsRegs = 232;
static_assert(kXProdRegs + 2 * kXConsRegs <= 512,
              "per SM sub-partition: one producer and two consumer warps' registers");
constexpr std::size_t kXSmem = static_cast<std::size_t>(kWgStages) * (XBM + XBN) * WBK * sizeof(__nv_bfloat16) + 1024 +
                               2 * kWgStages * sizeof(std::uint64_t);
static_assert(kXSmem <= 227 * 1024 && 2 * 64 * 128 <= kWgStages * XBN * WBK,
              "the ring fits; the staging buffers fit its B part");
// A 64 x WN accumulator's columns [128 h, +128) (or fewer) through store_acc_staged.
template <int WN>
__device__ __forceinline__ void store_wide_half(const Group<__nv_bfloat16>& g, const float (&acc)[WN / 2], int m_row0,
                                                int n0, __nv_bfloat16* stg, int bar) {
  if constexpr (WN <= 128) {
    store_acc_staged<WN>(g, acc, m_row0, n0, stg, bar);
  } else {
    static_assert(WN == 192, "192 = 128 + 64 columns");
    store_acc_staged<128>(g, *reinterpret_cast<const float(*)[64]>(&acc[0]), m_row0, n0, stg, bar);
    store_acc_staged<64>(g, *reinterpret_cast<const float(*)[32]>(&acc[64]), m_row0, n0 + 128, stg, bar);
  }
}
template <int WN, bool TA, bool TB>
__device__ __forceinline__ void wide_consume(const Group<__nv_bfloat16>& g, const __nv_bfloat16* As,
                                             const __nv_bfloat16* Bs, std::uint64_t* full, std::uint64_t* empty, int nk,
                                             int c, int m0, int n0, __nv_bfloat16* stg) {
  namespace wg = hcp::cuda::wg;
  float acc0[WN / 2], acc1[WN / 2];
#pragma unroll
  for (int i = 0; i < WN / 2; ++i) acc0[i] = acc1[i] = 0.f;
  // This warpgroup's halves: rows [128 c, +64) and [128 c + 64, +64) of the tile (uniform per warpgroup).
  const bool live0 = m0 + 128 * c < g.M, live1 = m0 + 128 * c + 64 < g.M;
  constexpr std::uint64_t kStepA = TA ? 128 : 2, kStepB = TB ? 2 : 128;  // one k16 slice, in 16-byte units
  for (int kt = 0; kt < nk; ++kt) {
    const int st = kt % kWgStages;
    ptx::mbar_wait(full + st, (kt / kWgStages) & 1);
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
    if (kt > 0 && (threadIdx.x & 31) == 0) ptx::mbar_arrive(empty + (kt - 1) % kWgStages);
  }
  wg::wait<0>();
  const int r0 = m0 + 128 * c;
  ptx::bar_sync(3, 256);  // both warpgroups' products have retired: the ring is idle
  if (live0) store_wide_half<WN>(g, acc0, r0, n0, stg, 1 + c);
  if (live1) store_wide_half<WN>(g, acc1, r0 + 64, n0, stg, 1 + c);
}
template <bool TA, bool TB>
__global__ void __launch_bounds__(kXThreads, 1)
    gemm_tma_wide_k(const Group<__nv_bfloat16>* groups, const Tile* tiles, int ntn, const TensorMap* maps) {
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
      ptx::mbar_init(full + st, 1);   // the producer's arrive; the copies complete the bytes
      ptx::mbar_init(empty + st, 8);  // one arrival per consumer warp
    }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
  if (threadIdx.x < 128) {
    ptx::reg_dealloc<kXProdRegs>();
    if (threadIdx.x == 0) {
      const TensorMap* ma = maps + 2 * tl.group;
      const TensorMap* mb = ma + 1;
      constexpr unsigned kBytes = (XBM + XBN) * WBK * sizeof(bf16);
      for (int kt = 0; kt < nk; ++kt) {
        const int st = kt % kWgStages;
        if (kt >= kWgStages) ptx::mbar_wait(empty + st, ((kt / kWgStages) - 1) & 1);
        const int k0 = kt * WBK;
        bf16* a = As + st * XBM * WBK;
        bf16* b = Bs + st * XBN * WBK;
        ptx::mbar_arrive_expect_tx(full + st, kBytes);
        tma_stage_a<XBM, TA>(a, ma, m0, k0, full + st);
        tma_stage_b<XBN, TB>(b, mb, n0, k0, full + st);
      }
    }
    return;
  }
  ptx::reg_alloc<kXConsRegs>();
  const int c = (threadIdx.x >> 7) - 1;
  // The tile's last columns on a narrower product (64, 128 or 192 wide).
  const int w = static_cast<int>(g.N - n0);
  bf16* stg = Bs + c * 64 * 128;  // this warpgroup's [64 * 128] staging buffer, in the idle ring
  if (w <= 64)
    wide_consume<64, TA, TB>(g, As, Bs, full, empty, nk, c, m0, n0, stg);
  else if (w <= 128)
    wide_consume<128, TA, TB>(g, As, Bs, full, empty, nk, c, m0, n0, stg);
  else
    wide_consume<XBN, TA, TB>(g, As, Bs, full, empty, nk, c, m0, n0, stg);
}
static_assert(sizeof(TensorMap) == sizeof(CUtensorMap), "a TensorMap holds one CUtensorMap");

// ---- host side ------------------------------------------------------------------------------------
enum class GemmKernel { Fma, Wmma, TmaWide };
// The TMA path needs 16-byte rows: contiguous extents, leading dimensions and bases aligned to 8 elements.
bool tma_ok(bool ta, bool tb, const std::vector<GemmGroupDesc>& desc) {
  for (const GemmGroupDesc& d : desc) {
    const bool ext = (ta ? d.M : d.K) % 8 == 0 && (tb ? d.K : d.N) % 8 == 0 && d.N % 8 == 0;
    const bool lds = d.lda % 8 == 0 && d.ldb % 8 == 0 && d.ldc % 8 == 0;
    if (d.M > 0 && !(ext && lds && aligned16(d.A) && aligned16(d.B) && aligned16(d.C))) return false;
  }
  return true;
}
// The kernel for these operands: a pure function of dtype and layout.
template <class S>
GemmKernel gemm_plan(bool ta, bool tb, const std::vector<GemmGroupDesc>& desc) {
  if constexpr (!std::is_same_v<S, __nv_bfloat16>)
    return GemmKernel::Fma;
  else
    return tma_ok(ta, tb, desc) ? GemmKernel::TmaWide : GemmKernel::Wmma;
}

template <class S, bool TA, bool TB>
void launch(const std::vector<GemmGroupDesc>& desc, std::int64_t N) {
  const GemmKernel kind = gemm_plan<S>(TA, TB, desc);
  const int bm = kind == GemmKernel::TmaWide ? XBM : BM, bn = kind == GemmKernel::TmaWide ? XBN : BN;
  std::vector<Group<S>> groups;
  std::vector<Tile> tiles;
  for (const GemmGroupDesc& d : desc) {
    HCP_CHECK(d.N == N, "grouped_gemm: every group must have the same N (", N, "), got ", d.N);
    const int gi = static_cast<int>(groups.size());
    groups.push_back({static_cast<const S*>(d.A), static_cast<const S*>(d.B), static_cast<S*>(d.C), d.M, d.N, d.K,
                      d.lda, d.ldb, d.ldc});
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
  if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    if (kind == GemmKernel::TmaWide) {
      // Per group: A [M][K] (K-major) or [K][M]; B [N][K] or [K][N] (groups with no rows: no tile reads them).
      std::vector<TensorMap> maps(2 * groups.size());
      for (std::size_t i = 0; i < groups.size(); ++i) {
        const Group<S>& gr = groups[i];
        if (gr.M <= 0 || gr.K <= 0) continue;
        maps[2 * i] = TA ? make_map(gr.A, gr.K, gr.M, gr.lda, 64, 64) : make_map(gr.A, gr.M, gr.K, gr.lda, bm, WBK);
        maps[2 * i + 1] = TB ? make_map(gr.B, gr.N, gr.K, gr.ldb, bn, WBK) : make_map(gr.B, gr.K, gr.N, gr.ldb, 64, 64);
      }
      TensorMap* dm = nullptr;
      HCP_CUDA_CHECK(cudaMallocAsync(&dm, maps.size() * sizeof(TensorMap), 0));
      HCP_CUDA_CHECK(cudaMemcpyAsync(dm, maps.data(), maps.size() * sizeof(TensorMap), cudaMemcpyHostToDevice, 0));
      // One block per (tile, N tile) on a 1-D grid: consecutive blocks are the N tiles of one M tile,
      // so the A rows stay in L2 while every N tile reads them.
      auto* kern = gemm_tma_wide_k<TA, TB>;
      HCP_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kXSmem)));
      const std::int64_t blocks = static_cast<std::int64_t>(grid.x) * grid.y;
      HCP_CHECK(blocks < (1ll << 31), "grouped_gemm: ", blocks, " blocks exceed one launch");
      kern<<<static_cast<unsigned>(blocks), kXThreads, kXSmem>>>(dg, dt, static_cast<int>(grid.y), dm);
      HCP_CUDA_CHECK(cudaFreeAsync(dm, 0));
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
template <class S>
void launch_t(bool ta, bool tb, const std::vector<GemmGroupDesc>& desc, std::int64_t N) {
  if (ta && tb)
    launch<S, true, true>(desc, N);
  else if (ta)
    launch<S, true, false>(desc, N);
  else if (tb)
    launch<S, false, true>(desc, N);
  else
    launch<S, false, false>(desc, N);
}
}  // namespace

void grouped_gemm(bool trans_a, bool trans_b, const std::vector<GemmGroupDesc>& groups, DType dt) {
  if (groups.empty()) return;
  const std::int64_t N = groups.front().N;
  switch (dt) {
    case DType::F64:
      launch_t<double>(trans_a, trans_b, groups, N);
      break;
    case DType::F32:
      launch_t<float>(trans_a, trans_b, groups, N);
      break;
    default:
      launch_t<__nv_bfloat16>(trans_a, trans_b, groups, N);
      break;
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

TensorMap make_map(const void* base, std::int64_t rows, std::int64_t cols, std::int64_t ld, unsigned box_rows,
                   unsigned box_cols) {
  TensorMap m{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {box_cols, box_rows}, estr[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(reinterpret_cast<CUtensorMap*>(&m), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                                          const_cast<void*>(base), dims, strides, box, estr,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  HCP_CHECK(r == CUDA_SUCCESS, "tensor map: cuTensorMapEncodeTiled failed (", static_cast<int>(r), ") for a ", rows,
            " x ", cols, " operand, leading dimension ", ld);
  return m;
}
}  // namespace hcp::kernels::cuda_impl
