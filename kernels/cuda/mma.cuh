// Tensor-core building blocks for sm_80+ (used on sm_90a): bf16 mma.sync m16n8k16 with fp32
// accumulators, ldmatrix fragment loads from XOR-swizzled shared-memory tiles, cp.async copies.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16), lane = 4·group + tig:
//   A 16x16 (4 regs): a0 (row group, cols 2tig..+1), a1 (row group+8), a2 (cols +8), a3 (both +8)
//   B 16x8  (2 regs): b0 (k 2tig..+1, col group), b1 (k +8)
//   C 16x8  (4 f32):  c0,c1 (row group, cols 2tig..+1), c2,c3 (row group+8)
// A C fragment pair (two n8 tiles) is exactly an A fragment of the next product after packing to bf16,
// which is how P = softmax(S) feeds P·V without leaving registers.
//
// Tiles in shared memory are row-major [rows][W] bf16 with W a multiple of 64 elements; the 16-byte
// chunk c of row r is stored at chunk c ^ (r & 7), so the eight rows one ldmatrix phase reads, and the
// eight chunks one cp.async wave writes, fall in distinct banks.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace hcp::cuda::tc {
using bf16 = __nv_bfloat16;

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// Element (r, c) of a swizzled [rows][W] tile; c a multiple of 8 for the 16-byte accessors.
template <int W>
__device__ __forceinline__ bf16* at(bf16* tile, int r, int c) {
  return tile + r * W + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7);
}
template <int W>
__device__ __forceinline__ const bf16* at(const bf16* tile, int r, int c) {
  return tile + r * W + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7);
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c += a · b (m16n8k16, bf16 in, fp32 accumulate).
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<unsigned*>(&v);
}

// A fragment of the 16x16 block at (r0, c0) of a row-major [.][W] tile.
template <int W>
__device__ __forceinline__ void load_a(unsigned (&a)[4], const bf16* tile, int r0, int c0) {
  const int l = threadIdx.x & 31;
  ldsm_x4(a, at<W>(tile, r0 + (l & 15), c0 + ((l >> 4) << 3)));
}
// The same A fragment from a tile stored [k][m] (A^T row-major), through ldmatrix.trans.
template <int W>
__device__ __forceinline__ void load_a_km(unsigned (&a)[4], const bf16* tile, int k0, int m0) {
  const int l = threadIdx.x & 31;
  ldsm_x4_t(a, at<W>(tile, k0 + (l & 7) + ((l >> 4) << 3), m0 + (((l >> 3) & 1) << 3)));
}
// B fragments of two n8 tiles (n0, n0+8) x k16 (k0) from a tile stored [n][k] (B^T row-major, e.g. K
// for Q·K^T): b[0..1] for n-tile n0, b[2..3] for n0+8.
template <int W>
__device__ __forceinline__ void load_b_nk(unsigned (&b)[4], const bf16* tile, int n0, int k0) {
  const int l = threadIdx.x & 31;
  ldsm_x4(b, at<W>(tile, n0 + (l & 7) + ((l >> 4) << 3), k0 + (((l >> 3) & 1) << 3)));
}
// The same from a tile stored [k][n] (B row-major, e.g. V for P·V), through ldmatrix.trans.
template <int W>
__device__ __forceinline__ void load_b_kn(unsigned (&b)[4], const bf16* tile, int k0, int n0) {
  const int l = threadIdx.x & 31;
  ldsm_x4_t(b, at<W>(tile, k0 + (l & 7) + (((l >> 3) & 1) << 3), n0 + ((l >> 4) << 3)));
}
// Pack the C fragments of n8 tiles 2kk and 2kk+1 (16 rows x 16 cols, fp32) into an A fragment.
__device__ __forceinline__ void c_to_a(unsigned (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// Quad (the four lanes sharing a fragment row) reductions.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// acc[0 .. NT8) += a (16 x 16) times the k16 x 8·NT8 block at (k0, n0) of a tile stored [k][n].
template <int W, int NT8>
__device__ __forceinline__ void mma_kn(float (&acc)[NT8][4], const unsigned (&a)[4], const bf16* tile, int k0, int n0) {
#pragma unroll
  for (int np = 0; np < NT8 / 2; ++np) {
    unsigned b[4];
    load_b_kn<W>(b, tile, k0, n0 + np * 16);
    mma(acc[2 * np], a, b[0], b[1]);
    mma(acc[2 * np + 1], a, b[2], b[3]);
  }
}

// Copy rows [0, rows) x W of a global matrix (row r at src + r·ld elements) into a swizzled tile, NT
// threads cooperating, 16-byte cp.async each; rows >= valid and columns >= valid_cols (a multiple of 8)
// are zero-filled.
template <int W, int NT>
__device__ __forceinline__ void load_tile_async(bf16* tile, const bf16* src, std::int64_t ld, int rows,
                                                std::int64_t valid, std::int64_t valid_cols = W) {
  constexpr int kChunks = W / 8;
#pragma unroll 4
  for (int c = threadIdx.x; c < rows * kChunks; c += NT) {
    const int r = c / kChunks, ch = c % kChunks;
    const bool ok = r < valid && ch * 8 < valid_cols;
    cp_async16(at<W>(tile, r, ch * 8), ok ? src + r * ld + ch * 8 : src, ok);
  }
}

}  // namespace hcp::cuda::tc
