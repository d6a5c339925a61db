// The SSD tensor-core kernels' building blocks: sizes, one head's per-token data of a chunk, and
// the masked, decayed operand tiles the products take.
// Private to kernels/cuda/ssd/ssd_tc.cu (its one translation unit).
#pragma once
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ssd/ssd_tc.hpp"

namespace hcp::kernels::cuda_impl::ssd_tc {
using namespace hcp::cuda;
using namespace hcp::cuda::tc;
using bf16 = __nv_bfloat16;
using i64 = std::int64_t;
using Ctx = ssdc::Ctx<bf16, float>;
using Bwd = ssdc::BwdCtx<bf16, float>;
constexpr int kQ = 128;  // chunk
constexpr int kP = 64;   // head_dim
constexpr int kMT = kQ / 16;

__device__ __forceinline__ int chunk_rows(const Ctx& k, i64 t0) { return static_cast<int>(min(i64(kQ), k.d.L - t0)); }

// One head's per-token data of a chunk: cs, dt, seq (rows >= valid: 0, 0, -1).
struct Tok {
  float cs[kQ], dt[kQ];
  i64 sq[kQ];
};
template <int NT>
__device__ __forceinline__ void load_tok(Tok& tk, const Ctx& k, i64 b, i64 h, i64 t0, int valid) {
  const i64 tok = k.tok(b, h, t0);
  for (int s = threadIdx.x; s < kQ; s += NT) {
    tk.cs[s] = s < valid ? k.w.cs[tok + s] : 0.f;
    tk.dt[s] = s < valid ? k.w.dtv[tok + s] : 0.f;
    tk.sq[s] = s < valid ? k.seq(b, t0 + s) : -1;
  }
}
// A fragment (rows r0 + grp, +8; columns q0 + 2 tig, +1, +8, +9) of the masked decayed matrix whose
// entry (r, q) pairs a later token with an earlier one: rows later (kUpper false: q <= r) or rows earlier
// (kUpper true: q >= r); value src[later][earlier] · e^{cs_later − cs_earlier} (· dt_earlier if kDt),
// zero unless later >= earlier in the same sequence. load_raw fetches the eight src values (every index
// lies inside the tile), decayed_a masks, decays and packs them.
template <bool kUpper>
__device__ __forceinline__ void load_raw(float (&raw)[8], const float* src, int r0, int q0) {
  const int lane = threadIdx.x & 31, grp = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int x = 0; x < 8; ++x) {
    const int r = r0 + grp + 8 * ((x >> 1) & 1), q = q0 + 2 * tig + 8 * (x >> 2) + (x & 1);
    raw[x] = kUpper ? src[q * kQ + r] : src[r * kQ + q];
  }
}
template <bool kUpper, bool kDt>
__device__ __forceinline__ void decayed_a(unsigned (&a)[4], const float (&raw)[8], const Tok& tk, int r0, int q0) {
  const int lane = threadIdx.x & 31, grp = lane >> 2, tig = lane & 3;
  float v[8];
#pragma unroll
  for (int x = 0; x < 8; ++x) {
    const int r = r0 + grp + 8 * ((x >> 1) & 1), q = q0 + 2 * tig + 8 * (x >> 2) + (x & 1);
    const int later = kUpper ? q : r, earlier = kUpper ? r : q;
    v[x] = later >= earlier && tk.sq[q] == tk.sq[r]
               ? raw[x] * __expf(tk.cs[later] - tk.cs[earlier]) * (kDt ? tk.dt[earlier] : 1.f)
               : 0.f;
  }
  // x = 4 qq + 2 hf + e  ->  a[hf + 2 qq] holds the pair e = 0, 1
#pragma unroll
  for (int j = 0; j < 4; ++j) a[j] = pack_bf16(v[2 * ((j & 1) + 2 * (j >> 1))], v[2 * ((j & 1) + 2 * (j >> 1)) + 1]);
}
// acc += Σ_{kb0 <= kb <= kb1} (decayed A fragment at rows r0, columns 16 kb) · Y[16 kb .., n0 ..), Y a
// [k][n] tile of width W; the next block's src values are loaded while this block's products run.
template <bool kUpper, bool kDt, int W, int NT8>
__device__ __forceinline__ void decayed_mm(float (&acc)[NT8][4], const float* src, const Tok& tk, int r0, int kb0,
                                           int kb1, const bf16* Y, int n0) {
  float raw[8];
  if (kb0 <= kb1) load_raw<kUpper>(raw, src, r0, 16 * kb0);
  for (int kb = kb0; kb <= kb1; ++kb) {
    float nxt[8];
    if (kb < kb1) load_raw<kUpper>(nxt, src, r0, 16 * (kb + 1));
    unsigned a[4];
    decayed_a<kUpper, kDt>(a, raw, tk, r0, 16 * kb);
    mma_kn<W>(acc, a, Y, kb * 16, n0);
    if (kb < kb1)
#pragma unroll
      for (int x = 0; x < 8; ++x) raw[x] = nxt[x];
  }
}
// Rows grp and grp + 8 of an A fragment times f0 and f1.
__device__ __forceinline__ unsigned scale2(unsigned u, float f) {
  const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
  return pack_bf16(v.x * f, v.y * f);
}
__device__ __forceinline__ void scale_rows(unsigned (&a)[4], float f0, float f1) {
  a[0] = scale2(a[0], f0), a[2] = scale2(a[2], f0), a[1] = scale2(a[1], f1), a[3] = scale2(a[3], f1);
}
// Σ_p tile[i][p] · acc over the n8 tiles a thread holds of row i (half hf of the fragment).
template <int NT8>
__device__ __forceinline__ float row_dot(const float (&acc)[NT8][4], int hf, const bf16* tile, int i) {
  const int tig = threadIdx.x & 3;
  float s = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT8; ++nt) {
    const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at<kP>(tile, i, nt * 8 + 2 * tig)));
    s += v.x * acc[nt][2 * hf] + v.y * acc[nt][2 * hf + 1];
  }
  return s;
}
}  // namespace hcp::kernels::cuda_impl::ssd_tc
