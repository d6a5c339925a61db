// Grouped GEMM: one launch computes C_g = op(A_g) op(B_g) for every group g (the experts of a MoE
// layer). The block grid is (tile list, N tiles); the tile list names each block's group and M
// offset, so groups of any size (also empty ones) share one launch without padding. bf16 runs on the
// tensor cores (WMMA 16x16x16, fp32 accumulation); fp32/fp64 on FMA with 4x4 register tiles. Every
// output element has one owner and a fixed K order: bitwise repeatable, no atomics. A group with K = 0
// writes zeros (an expert that received no tokens gets a zero weight gradient).
#include <mma.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

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
  int m0;
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

template <class S, bool TA, bool TB> void launch(const std::vector<GemmGroupDesc>& desc, std::int64_t N) {
  std::vector<Group<S>> groups;
  std::vector<Tile> tiles;
  for (const GemmGroupDesc& d : desc) {
    HCP_CHECK(d.N == N, "grouped_gemm: every group must have the same N (", N, "), got ", d.N);
    const int gi = static_cast<int>(groups.size());
    groups.push_back({static_cast<const S*>(d.A), static_cast<const S*>(d.B), static_cast<S*>(d.C), d.M, d.N, d.K, d.lda, d.ldb, d.ldc});
    for (std::int64_t m0 = 0; m0 < d.M; m0 += BM) tiles.push_back({gi, static_cast<int>(m0)});
  }
  if (tiles.empty() || N == 0) return;
  Group<S>* dg = nullptr;
  Tile* dt = nullptr;
  HCP_CUDA_CHECK(cudaMallocAsync(&dg, groups.size() * sizeof(Group<S>), 0));
  HCP_CUDA_CHECK(cudaMallocAsync(&dt, tiles.size() * sizeof(Tile), 0));
  HCP_CUDA_CHECK(cudaMemcpyAsync(dg, groups.data(), groups.size() * sizeof(Group<S>), cudaMemcpyHostToDevice, 0));
  HCP_CUDA_CHECK(cudaMemcpyAsync(dt, tiles.data(), tiles.size() * sizeof(Tile), cudaMemcpyHostToDevice, 0));
  const dim3 grid(static_cast<unsigned>(tiles.size()), static_cast<unsigned>((N + BN - 1) / BN));
  if constexpr (std::is_same_v<S, __nv_bfloat16>) gemm_wmma_k<TA, TB><<<grid, kThreads>>>(dg, dt);
  else gemm_fma_k<S, typename Acc<S>::type, TA, TB><<<grid, kThreads>>>(dg, dt);
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

}  // namespace hcp::kernels::cuda_impl
