// Mamba2 SSD chunk products on the tensor cores: bf16 operands in shared memory (XOR-swizzled tiles,
// cp.async) or built in registers, mma.sync m16n8k16 with fp32 accumulators, for head_dim P = 64,
// chunk Q = 128 and d_state N = 64 or 128 (the Mamba2 / Nemotron-H sizes). They replace the phases of
// the chunked SSD (kernels/cuda/ssd_chunked.hpp) that are matrix products, with the same inputs, Work
// layout and semantics (seq_idx resets, initial states, a ragged last chunk). Per chunk c of row b,
// with "later ~ earlier" meaning later >= earlier in the same sequence and dec = e^{cs_later − cs_earlier}:
//   gram    CB[g]    = C · B^T  (lower triangle)                                  block per (group, chunk, row)
//   states  S[h]     = (w ∘ x)^T B,  w_s = e^{cs_E − cs_s} dt_s [seq_s = seq_E]
//           dS_loc[h] = (w ∘ dy)^T C, w_t = e^{cs_t} [seq_t = prev]                  block per (head, chunk, row)
//   scan    ŷ_t = [seq_t = prev] e^{cs_t} C_t·S_in + Σ_{s~t} dec CB_ts dt_s x_s;  y = ŷ + D x
//   dx      dx̂_s = [seq_s = seq_E] e^{cs_E − cs_s} B_s·dS + Σ_{t~s} dec CB_ts dy_t;  dx = dt_s dx̂ + D dy
//   pairs   dyx[h] = dy · x^T in registers, head by head; M[g] = Σ_h dec dt_s dyx_ts  block per (group, chunk, row)
//   dB, dC  dC = M B + Σ_h (state term), dB = M^T C + Σ_h (state term)             block per (group, chunk, row)
// The per-token terms of d cs and d dt (the element phase TokenTerms, term by term): the chunk-start
// state terms as row dot products in the scan and dx blocks (dy_t · state part of ŷ_t; x_t · state part
// of dx̂_t), the intra-chunk pair terms as fp32 row and column sums of the same products
// dec CB_ts dyx_ts (pairs_k), so that they cancel in the chunk's reverse cumulative sum as exactly as in
// the element phase (bf16-rounded GEMM results would leave a residual that grows along the chunk).
// Summing dyx over the group's heads before the products with B and C (as mamba_ssm does) makes the
// intra-chunk part of dB/dC one Q×Q×N product per group instead of one per head.
// Also the dt cumulative sum (a warp per head and chunk), the state passing over chunks (16-byte
// vectors) and the chunk reduction (a block per head and chunk). seq_idx is nondecreasing along a row
// (packed sequences), so "same sequence" is an equality test. The operands of each product are rounded to bf16 (w∘x, the decayed masked CB, M, S_in, dS),
// as the mamba_ssm Triton kernels do; accumulation and the dot products are fp32, each output element
// with one owner and one summation order: bitwise repeatable. Blocks of one chunk's heads are adjacent
// in the grid, so a group's B/C tiles and CB are re-read from L2.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ssd_tc.hpp"

namespace hcp::kernels::cuda_impl::ssd_tc {
using namespace hcp::cuda;
using namespace hcp::cuda::tc;
using bf16 = __nv_bfloat16;

namespace {
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
template <int NT> __device__ __forceinline__ void load_tok(Tok& tk, const Ctx& k, i64 b, i64 h, i64 t0, int valid) {
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
template <bool kUpper> __device__ __forceinline__ void load_raw(float (&raw)[8], const float* src, int r0, int q0) {
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
__device__ __forceinline__ void decayed_mm(float (&acc)[NT8][4], const float* src, const Tok& tk, int r0, int kb0, int kb1,
                                           const bf16* Y, int n0) {
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

// ---- gram: out[unit] = A_c · B_c^T (lower triangle, zero above); 8 warps, warp w owns rows [16w, +16).
struct Gram {
  const bf16 *a, *b;
  i64 ld;     // elements between tokens
  int units;  // groups (C·B^T) or heads (dy·x^T), K elements each
  float* out; // [B, nch, units, Q, Q]
};
template <int K> __global__ void __launch_bounds__(256) gram_k(Gram gm, i64 L, i64 nch) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* At = reinterpret_cast<bf16*>(smem);
  bf16* Bt = At + kQ * K;
  const i64 u = blockIdx.x, c = blockIdx.y, b = blockIdx.z, t0 = c * kQ;
  const i64 off = (b * L + t0) * gm.ld + u * K;
  const int valid = static_cast<int>(min(i64(kQ), L - t0));
  load_tile_async<K, 256>(At, gm.a + off, gm.ld, kQ, valid);
  load_tile_async<K, 256>(Bt, gm.b + off, gm.ld, kQ, valid);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane >> 2, tig = lane & 3, r0 = 16 * w;
  float acc[kQ / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    unsigned a[4];
    load_a<K>(a, At, r0, kk * 16);
#pragma unroll
    for (int np = 0; np < kQ / 16; ++np)
      if (np <= w) {
        unsigned bb[4];
        load_b_nk<K>(bb, Bt, np * 16, kk * 16);
        mma(acc[2 * np], a, bb[0], bb[1]);
        mma(acc[2 * np + 1], a, bb[2], bb[3]);
      }
  }
  float* out = gm.out + ((b * nch + c) * gm.units + u) * kQ * kQ;
#pragma unroll
  for (int nt = 0; nt < kQ / 8; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = r0 + grp + 8 * hf, j = nt * 8 + 2 * tig;
      *reinterpret_cast<float2*>(out + i * kQ + j) =
          make_float2(j <= i ? acc[nt][2 * hf] : 0.f, j + 1 <= i ? acc[nt][2 * hf + 1] : 0.f);
    }
}

// ---- states: out[h] = (w ∘ X)^T Y over the chunk; 8 warps, warp w owns p rows [16 (w % 4), +16) and
// the n half w / 4. kGrad false: X = x, Y = B (chunk end states); true: X = dy, Y = C (local dS).
template <int N, bool kGrad> __global__ void __launch_bounds__(256) states_k(Ctx k, const bf16* X, float* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Xt = reinterpret_cast<bf16*>(smem);
  bf16* Yt = Xt + kQ * kP;
  float* wv = reinterpret_cast<float*>(Yt + kQ * N);
  const ssdc::Dims& d = k.d;
  const i64 h = blockIdx.x, c = blockIdx.y, b = blockIdx.z, g = h / d.hpg(), t0 = c * kQ;
  const int valid = chunk_rows(k, t0);
  load_tile_async<kP, 256>(Xt, X + ((b * d.L + t0) * d.H + h) * kP, d.H * kP, kQ, valid);
  load_tile_async<N, 256>(Yt, (kGrad ? k.in.Cm : k.in.Bm) + ((b * d.L + t0) * d.G + g) * N, d.G * N, kQ, valid);
  cp_async_commit();
  if (threadIdx.x < kQ) {
    const int s = threadIdx.x;
    const i64 tok = k.tok(b, h, t0);
    float wgt = 0.f;
    if (kGrad) {
      if (s < valid && k.seq(b, t0 + s) == k.prev_seq(b, c)) wgt = __expf(k.w.cs[tok + s]);
    } else if (s < valid && k.seq(b, t0 + s) == k.seq(b, t0 + valid - 1)) {
      wgt = __expf(k.w.cs[tok + valid - 1] - k.w.cs[tok + s]) * k.w.dtv[tok + s];
    }
    wv[s] = wgt;
  }
  cp_async_wait<0>();
  __syncthreads();
  for (int i = threadIdx.x; i < kQ * kP / 8; i += 256) {  // X rows scaled by their weight, in place
    const int r = i / (kP / 8), ch = i % (kP / 8);
    uint4* q = reinterpret_cast<uint4*>(at<kP>(Xt, r, ch * 8));
    uint4 v = *q;
    const float f = wv[r];
    v.x = scale2(v.x, f), v.y = scale2(v.y, f), v.z = scale2(v.z, f), v.w = scale2(v.w, f);
    *q = v;
  }
  __syncthreads();
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane >> 2, tig = lane & 3;
  const int p0 = 16 * (w & 3), n0 = (w >> 2) * (N / 2);
  constexpr int NT = N / 16;  // n8 tiles per warp
  float acc[NT][4] = {};
#pragma unroll
  for (int kk = 0; kk < kQ / 16; ++kk) {
    unsigned a[4];
    load_a_km<kP>(a, Xt, kk * 16, p0);
    mma_kn<N>(acc, a, Yt, kk * 16, n0);
  }
  float* o = out + k.st(b, c, h);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      *reinterpret_cast<float2*>(o + (p0 + grp + 8 * hf) * N + n0 + nt * 8 + 2 * tig) =
          make_float2(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
}

// ---- apply: per (head, chunk, row), 4 warps, warp w owns the 16-row tiles w and 7 − w (equal causal
// work). Scan: y. StateDot: q.dcs = dy_t · (state part of ŷ_t). Dx: dx; q.ddt_dir = ev_t = x_t · (state
// part of dx̂_t), q.t3 = dt_t ev_t, q.dyx_d = dy_t · x_t.
enum class Mode { Scan, StateDot, Dx };
// The scan has no dot partner tile: less shared memory, three blocks per SM.
template <int N, Mode M> constexpr std::size_t apply_smem() {
  return sizeof(bf16) * ((M == Mode::Scan ? 1 : 2) * kQ * kP + kQ * N + kP * N) + sizeof(Tok);
}
template <int N, Mode M> __global__ void __launch_bounds__(128) apply_k(Bwd q, const bf16* S, bf16* out) {
  constexpr bool kDx = M == Mode::Dx;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Vt = reinterpret_cast<bf16*>(smem);  // the streamed operand: x (scan, dot) or dy (dx)
  bf16* Wt = Vt + kQ * kP;                   // the dot partner: dy (dot) or x (dx); none in the scan
  bf16* Rt = Wt + (M == Mode::Scan ? 0 : kQ * kP);  // the state term's rows: C (scan, dot) or B (dx)
  bf16* St = Rt + kQ * N;                    // S (S_in: scan, dot; dS_end: dx), [P][N]
  Tok& tk = *reinterpret_cast<Tok*>(St + kP * N);
  const Ctx& k = q.k;
  const ssdc::Dims& d = k.d;
  const i64 h = blockIdx.x, c = blockIdx.y, b = blockIdx.z, g = h / d.hpg(), t0 = c * kQ;
  const int valid = chunk_rows(k, t0);
  const bool state = kDx || k.has_start(c);
  const i64 xo = ((b * d.L + t0) * d.H + h) * kP, ro = ((b * d.L + t0) * d.G + g) * N;
  if (M != Mode::StateDot) load_tile_async<kP, 128>(Vt, (kDx ? q.dy : k.in.x) + xo, d.H * kP, kQ, valid);
  if (M != Mode::Scan) load_tile_async<kP, 128>(Wt, (kDx ? k.in.x : q.dy) + xo, d.H * kP, kQ, valid);
  if (state) {
    load_tile_async<N, 128>(Rt, (kDx ? k.in.Bm : k.in.Cm) + ro, d.G * N, kQ, valid);
    load_tile_async<N, 128>(St, S + k.st(b, c, h), N, kP, kP);
  }
  cp_async_commit();
  load_tok<128>(tk, k, b, h, t0, valid);
  const i64 prev = k.prev_seq(b, c);
  cp_async_wait<0>();
  __syncthreads();
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane >> 2, tig = lane & 3;
  const int mt[2] = {w, kMT - 1 - w};
  float acc[2][kP / 8][4] = {};
  float st_dot[2][2] = {};  // dx: x_t · (state part of dx̂_t)
  if (state) {
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
      unsigned a[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m) load_a<N>(a[m], Rt, 16 * mt[m], kk * 16);
#pragma unroll
      for (int np = 0; np < kP / 16; ++np) {
        unsigned bb[4];
        load_b_nk<N>(bb, St, np * 16, kk * 16);
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          mma(acc[m][2 * np], a[m], bb[0], bb[1]);
          mma(acc[m][2 * np + 1], a[m], bb[2], bb[3]);
        }
      }
    }
    const int E = valid - 1;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * mt[m] + grp + 8 * hf;
        const float f = kDx ? (tk.sq[i] == tk.sq[E] ? __expf(tk.cs[E] - tk.cs[i]) : 0.f)
                            : (tk.sq[i] == prev ? __expf(tk.cs[i]) : 0.f);
#pragma unroll
        for (int nt = 0; nt < kP / 8; ++nt) acc[m][nt][2 * hf] *= f, acc[m][nt][2 * hf + 1] *= f;
        if (kDx) st_dot[m][hf] = quad_sum(row_dot(acc[m], hf, Wt, i));
      }
  }
  const float* src = k.w.CB + ((b * d.nch + c) * d.G + g) * kQ * kQ;
  if (M != Mode::StateDot)
#pragma unroll
    for (int m = 0; m < 2; ++m)
      decayed_mm<kDx, !kDx, kP>(acc[m], src, tk, 16 * mt[m], kDx ? mt[m] : 0, kDx ? kMT - 1 : mt[m], Vt, 0);
  const float Dh = k.in.D ? __bfloat162float(k.in.D[h]) : 0.f;
  const i64 tok = k.tok(b, h, t0);
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * mt[m] + grp + 8 * hf;
      if (M == Mode::StateDot) {
        const float r = quad_sum(row_dot(acc[m], hf, Wt, i));
        if (tig == 0 && i < valid) q.dcs[tok + i] = r;
        continue;
      }
      if (kDx) {
        float dyx = 0.f;
#pragma unroll
        for (int nt = 0; nt < kP / 8; ++nt) {
          const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at<kP>(Vt, i, nt * 8 + 2 * tig)));
          const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at<kP>(Wt, i, nt * 8 + 2 * tig)));
          dyx += u.x * v.x + u.y * v.y;
        }
        dyx = quad_sum(dyx);
        if (tig == 0 && i < valid) {
          q.ddt_dir[tok + i] = st_dot[m][hf];
          q.t3[tok + i] = tk.dt[i] * st_dot[m][hf];
          q.dyx_d[tok + i] = dyx;
        }
      }
      if (i >= valid) continue;
      const float f = kDx ? tk.dt[i] : 1.f;
      bf16* o = out + xo + static_cast<i64>(i) * d.H * kP;
#pragma unroll
      for (int nt = 0; nt < kP / 8; ++nt) {
        const int p = nt * 8 + 2 * tig;
        const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at<kP>(Vt, i, p)));
        *reinterpret_cast<unsigned*>(o + p) = pack_bf16(f * acc[m][nt][2 * hf] + Dh * v.x, f * acc[m][nt][2 * hf + 1] + Dh * v.y);
      }
    }
}

// ---- pair terms and the intra-chunk matrix of dB / dC: per (group, chunk, row), the heads of the
// group in order, the next head's dy / x tiles in flight; 8 warps, warp w owns the 16-row tiles
// a = w % 4 and 7 − a (equal causal work) and the 16-column blocks of parity w / 4. Per head:
// dyx = dy · x^T on the tensor cores (fp32, never stored), then per pair (t later, s earlier, same
// sequence) with e = e^{cs_t − cs_s}:
//   v = e CB_ts dyx_ts:     rows[t] += dt_s v, cols[s] += v  (the pair terms of d cs and d dt, see above)
//   M_ts += e dt_s dyx_ts   (summed over the group's heads: dB and dC's intra-chunk matrix)
// then per token q.dcs += rows − dt·cols − t3 and q.ddt_dir += cols; M as bf16 [B,nch,G,Q,Q] (zero
// above the diagonal) at the end. Row and column sums cross warps through shared memory in a fixed order.
struct PairsSmem {
  bf16 dy[2][kQ * kP], x[2][kQ * kP];
  float cs[2][kQ], dt[2][kQ];
  i64 sq[kQ];
  float rowp[2][kQ], colp[4][kQ];
};
// The column blocks of parity `par` that row tile mt meets: par + 2 jb <= mt; the low tile (m = 0,
// mt <= 3) meets at most two.
__device__ __forceinline__ bool meets(int m, int jb, int par, int mt) { return !(m == 0 && jb >= 2) && par + 2 * jb <= mt; }
// f(m, jb, s2, x, i, j) for each element this thread holds of the fragments [m][jb][s2][x] of the
// blocks that row tile mt[m] meets: x = 2 hf + e, row i = 16 mt[m] + grp + 8 hf, column
// j = 16 (par + 2 jb) + 8 s2 + 2 tig + e.
template <class F> __device__ __forceinline__ void each_pair(const int (&mt)[2], int par, F&& f) {
  const int lane = threadIdx.x & 31, grp = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int jb = 0; jb < 4; ++jb)
      if (meets(m, jb, par, mt[m]))
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2)
#pragma unroll
          for (int x = 0; x < 4; ++x)
            f(m, jb, s2, x, 16 * mt[m] + grp + 8 * (x >> 1), 16 * (par + 2 * jb) + 8 * s2 + 2 * tig + (x & 1));
}
__global__ void __launch_bounds__(256, 1) pairs_k(Bwd q, bf16* M) {
  extern __shared__ __align__(16) unsigned char smem[];
  PairsSmem& sm = *reinterpret_cast<PairsSmem*>(smem);
  const Ctx& k = q.k;
  const ssdc::Dims& d = k.d;
  const i64 g = blockIdx.x, c = blockIdx.y, b = blockIdx.z, t0 = c * kQ, h0 = g * d.hpg(), nh = d.hpg();
  const int valid = chunk_rows(k, t0);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane >> 2, tig = lane & 3;
  const int a = w & 3, par = w >> 2, mt[2] = {a, kMT - 1 - a};
  auto fetch = [&](i64 h, int buf) {
    const i64 xo = ((b * d.L + t0) * d.H + h) * kP;
    load_tile_async<kP, 256>(sm.dy[buf], q.dy + xo, d.H * kP, kQ, valid);
    load_tile_async<kP, 256>(sm.x[buf], k.in.x + xo, d.H * kP, kQ, valid);
    cp_async_commit();
    if (threadIdx.x < kQ) {
      const int s = threadIdx.x;
      const i64 tok = k.tok(b, h, t0);
      sm.cs[buf][s] = s < valid ? k.w.cs[tok + s] : 0.f;
      sm.dt[buf][s] = s < valid ? k.w.dtv[tok + s] : 0.f;
    }
  };
  fetch(h0, 0);
  if (threadIdx.x < kQ) sm.sq[threadIdx.x] = static_cast<int>(threadIdx.x) < valid ? k.seq(b, t0 + threadIdx.x) : -1;
  // This thread's CB values and M sums, laid out like its dyx fragments: [m][jb][n8 half][4].
  float cb[2][4][2][4], Ms[2][4][2][4] = {};
  const float* cbg = k.w.CB + ((b * d.nch + c) * d.G + g) * kQ * kQ;
  each_pair(mt, par, [&](int m, int jb, int s2, int x, int i, int j) { cb[m][jb][s2][x] = cbg[i * kQ + j]; });
  for (i64 hi = 0; hi < nh; ++hi) {
    const int buf = static_cast<int>(hi & 1);
    cp_async_wait<0>();
    __syncthreads();  // head hi's tiles are in; the previous head's are no longer read
    if (hi + 1 < nh) fetch(h0 + hi + 1, buf ^ 1);
    float acc[2][4][2][4] = {};
#pragma unroll
    for (int kk = 0; kk < kP / 16; ++kk)
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        unsigned af[4];
        load_a<kP>(af, sm.dy[buf], 16 * mt[m], kk * 16);
#pragma unroll
        for (int jb = 0; jb < 4; ++jb)
          if (meets(m, jb, par, mt[m])) {
            unsigned bb[4];
            load_b_nk<kP>(bb, sm.x[buf], 16 * (par + 2 * jb), kk * 16);
            mma(acc[m][jb][0], af, bb[0], bb[1]);
            mma(acc[m][jb][1], af, bb[2], bb[3]);
          }
      }
    const float *cs = sm.cs[buf], *dt = sm.dt[buf];
    float rows[2][2] = {}, cols[4][2][2] = {};
    each_pair(mt, par, [&](int m, int jb, int s2, int x, int i, int j) {
      if (j <= i && i < valid && sm.sq[i] == sm.sq[j]) {
        const float ex = __expf(cs[i] - cs[j]), y = acc[m][jb][s2][x];
        const float v = ex * cb[m][jb][s2][x] * y;
        rows[m][x >> 1] += dt[j] * v;
        cols[jb][s2][x & 1] += v;
        Ms[m][jb][s2][x] += ex * dt[j] * y;
      }
    });
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float r = quad_sum(rows[m][hf]);
        if (tig == 0) sm.rowp[par][16 * mt[m] + grp + 8 * hf] = r;
      }
#pragma unroll
    for (int jb = 0; jb < 4; ++jb)
#pragma unroll
      for (int s2 = 0; s2 < 2; ++s2)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = cols[jb][s2][e];
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          v += __shfl_xor_sync(0xffffffffu, v, 8);
          v += __shfl_xor_sync(0xffffffffu, v, 16);
          if (grp == 0) sm.colp[a][16 * (par + 2 * jb) + 8 * s2 + 2 * tig + e] = v;
        }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < valid) {
      const int j = threadIdx.x;
      const float rs = sm.rowp[0][j] + sm.rowp[1][j];
      const float co = ((sm.colp[0][j] + sm.colp[1][j]) + sm.colp[2][j]) + sm.colp[3][j];
      const i64 tok = k.tok(b, h0 + hi, t0) + j;
      q.dcs[tok] += rs - dt[j] * co - q.t3[tok];
      q.ddt_dir[tok] += co;
    }
  }
  bf16* Mo = M + ((b * d.nch + c) * d.G + g) * kQ * kQ;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int jb = 0; jb < 4; ++jb) {
      const bool on = meets(m, jb, par, mt[m]);
#pragma unroll
      for (int s2 = 0; s2 < 2; ++s2)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = 16 * mt[m] + grp + 8 * hf, j = 16 * (par + 2 * jb) + 8 * s2 + 2 * tig;
          *reinterpret_cast<unsigned*>(Mo + i * kQ + j) =
              on ? pack_bf16(Ms[m][jb][s2][2 * hf], Ms[m][jb][s2][2 * hf + 1]) : 0u;
        }
    }
}

// ---- dB / dC: per (group, chunk, row); 8 warps, warp w owns the 16-row tiles w % 4 and 7 − w % 4 and
// the n half w / 4. The intra-chunk part is one product with M (pairs_k), the state part a product per
// head of the group, in order:
//   dC_t = Σ_{s<=t} M_ts B_s + Σ_h [seq_t = prev] e^{cs_t} dy_t·S_in
//   dB_s = Σ_{t>=s} M_ts C_t + Σ_h [seq_s = seq_E] dt_s e^{cs_E − cs_s} x_s·dS
template <int N> constexpr std::size_t dbc_smem() { return sizeof(bf16) * (kQ * N + kQ * kQ + kQ * kP + kP * N); }
template <int N, bool kDB>
__global__ void __launch_bounds__(256, 2) dbc_k(Bwd q, const bf16* M, const bf16* S, bf16* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Kt = reinterpret_cast<bf16*>(smem);  // C (dB) or B (dC), [Q][N]
  bf16* Mt = Kt + kQ * N;                    // M, [Q][Q]
  bf16* Vh = Mt + kQ * kQ;                   // x_h (dB) or dy_h (dC), [Q][P]
  bf16* Sh = Vh + kQ * kP;                   // S: dS_end,h (dB) or S_in,h (dC), [P][N]
  const Ctx& k = q.k;
  const ssdc::Dims& d = k.d;
  const i64 g = blockIdx.x, c = blockIdx.y, b = blockIdx.z, t0 = c * kQ;
  const int valid = chunk_rows(k, t0), E = valid - 1;
  const i64 ro = ((b * d.L + t0) * d.G + g) * N;
  load_tile_async<N, 256>(Kt, (kDB ? k.in.Cm : k.in.Bm) + ro, d.G * N, kQ, valid);
  load_tile_async<kQ, 256>(Mt, M + ((b * d.nch + c) * d.G + g) * kQ * kQ, kQ, kQ, kQ);
  cp_async_commit();
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane >> 2, tig = lane & 3;
  const int mt[2] = {w & 3, kMT - 1 - (w & 3)}, n0 = (w >> 2) * (N / 2);
  constexpr int NT = N / 16;  // n8 tiles per warp
  float acc[2][NT][4] = {};
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int m = 0; m < 2; ++m)
    for (int kb = kDB ? mt[m] : 0; kb <= (kDB ? kMT - 1 : mt[m]); ++kb) {
      unsigned af[4];
      if (kDB)
        load_a_km<kQ>(af, Mt, 16 * kb, 16 * mt[m]);  // A_st = M_ts
      else
        load_a<kQ>(af, Mt, 16 * mt[m], 16 * kb);
      mma_kn<N>(acc[m], af, Kt, 16 * kb, n0);
    }
  if (kDB || k.has_start(c)) {
    const i64 prev = k.prev_seq(b, c), seqE = k.seq(b, t0 + E);
    for (i64 h = g * d.hpg(); h < (g + 1) * d.hpg(); ++h) {
      __syncthreads();  // the previous head's tiles are no longer read
      const i64 xo = ((b * d.L + t0) * d.H + h) * kP, tok = k.tok(b, h, t0);
      load_tile_async<kP, 256>(Vh, (kDB ? k.in.x : q.dy) + xo, d.H * kP, kQ, valid);
      load_tile_async<N, 256>(Sh, S + k.st(b, c, h), N, kP, kP);
      cp_async_commit();
      float f[2][2];
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = 16 * mt[m] + grp + 8 * hf;
          const i64 si = i < valid ? k.seq(b, t0 + i) : -1;
          f[m][hf] = i >= valid ? 0.f
                     : kDB      ? (si == seqE ? k.w.dtv[tok + i] * __expf(k.w.cs[tok + E] - k.w.cs[tok + i]) : 0.f)
                                : (si == prev ? __expf(k.w.cs[tok + i]) : 0.f);
        }
      cp_async_wait<0>();
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kP / 16; ++kk) {
        unsigned af[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          load_a<kP>(af[m], Vh, 16 * mt[m], kk * 16);
          scale_rows(af[m], f[m][0], f[m][1]);
        }
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          unsigned bb[4];
          load_b_kn<N>(bb, Sh, kk * 16, n0 + np * 16);
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            mma(acc[m][2 * np], af[m], bb[0], bb[1]);
            mma(acc[m][2 * np + 1], af[m], bb[2], bb[3]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * mt[m] + grp + 8 * hf;
      if (i >= valid) continue;
      bf16* o = out + ro + static_cast<i64>(i) * d.G * N + n0;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        *reinterpret_cast<unsigned*>(o + nt * 8 + 2 * tig) = pack_bf16(acc[m][nt][2 * hf], acc[m][nt][2 * hf + 1]);
    }
}

// ---- dt cumsum: per (8 heads, chunk, row), a warp per head, tokens lane + 32 e; the effective dt and
// its derivative as in the element phase, cs as warp prefix sums carried over the four token groups.
__global__ void __launch_bounds__(256) dt_k(Ctx k) {
  const ssdc::Dims& d = k.d;
  const int lane = threadIdx.x & 31;
  const i64 h = blockIdx.x * 8 + (threadIdx.x >> 5), c = blockIdx.y, b = blockIdx.z, t0 = c * kQ;
  if (h >= d.H) return;
  const int valid = chunk_rows(k, t0);
  const float Ah = k.Ah(h);
  const i64 tok = k.tok(b, h, t0);
  float carry = 0.f;
#pragma unroll
  for (int e = 0; e < kQ / 32; ++e) {
    const int t = 32 * e + lane;
    float v = 0.f, dv = 0.f;
    if (t < valid) k.eff_dt(b, t0 + t, h, v, dv);
    float x = v * Ah;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float n = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += n;
    }
    const float csv = carry + x;
    carry = __shfl_sync(0xffffffffu, csv, 31);
    if (t < valid) k.w.dtv[tok + t] = v, k.w.ddtv[tok + t] = dv, k.w.cs[tok + t] = csv;
  }
}

// ---- state passing over the chunks, 4 states per thread (16-byte loads, the next chunk's in flight);
// the running value goes to the chunk in bf16 (its consumers read it as tensor-core operands).
// Forward: loc = chunk-local states -> lo = chunk-start states, `bound` the initial states, `out` the
// final ones. kRev: loc = local state gradients -> lo = end-state gradients, `bound` d final, `out`
// d initial, and per chunk this block's share of S_in · dS_end (S_in: the forward's lo) into `dots`
// for the chunk reduction. A block covers 1024 states of one (row, head): P·N is a multiple of 1024.
__device__ __forceinline__ float4 load4(const bf16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ void store4(bf16* p, float4 v) {
  *reinterpret_cast<uint2*>(p) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
}
constexpr int kPassBlock = 256;
// Blocks of the state passing per (row, head): partial sums of S_in · dS_end per chunk.
__host__ __device__ __forceinline__ i64 pass_blocks_per_head(const ssdc::Dims& d) { return d.PN() / (4 * kPassBlock); }
template <bool kRev>
__global__ void __launch_bounds__(kPassBlock) pass_k(Ctx k, const float* loc_st, bf16* lo, const bf16* bound, bf16* out,
                                                     const bf16* S_in, float* dots) {
  const ssdc::Dims& d = k.d;
  const i64 nv = d.PN() / 4, i = static_cast<i64>(blockIdx.x) * kPassBlock + threadIdx.x;
  const i64 v = i % nv, bh = i / nv, h = bh % d.H, b = bh / d.H, nblk = pass_blocks_per_head(d);
  float4 run = bound ? load4(bound + bh * d.PN() + 4 * v) : make_float4(0.f, 0.f, 0.f, 0.f);
  const i64 step = kRev ? -1 : 1;
  i64 c = kRev ? d.nch - 1 : 0;
  auto ptr = [&](i64 cc) { return reinterpret_cast<const float4*>(loc_st + k.st(b, cc, h)) + v; };
  float4 loc = *ptr(c);
  for (i64 n = 0; n < d.nch; ++n, c += step) {
    const float4 nxt = n + 1 < d.nch ? *ptr(c + step) : loc;
    store4(lo + k.st(b, c, h) + 4 * v, run);
    if (kRev) {
      const float4 s = load4(S_in + k.st(b, c, h) + 4 * v);
      const float t = block_sum(s.x * run.x + s.y * run.y + s.z * run.z + s.w * run.w);
      if (threadIdx.x == 0) dots[((b * d.nch + c) * d.H + h) * nblk + v / kPassBlock] = t;
    }
    const i64 E = d.E(c);
    const float f = k.seq(b, E) == k.prev_seq(b, c) ? __expf(k.w.cs[k.tok(b, h, E)]) : 0.f;
    run = make_float4(f * run.x + loc.x, f * run.y + loc.y, f * run.z + loc.z, f * run.w + loc.w);
    loc = nxt;
  }
  if (out) store4(out + bh * d.PN() + 4 * v, run);
}

// ---- chunk reduction: per (8 heads, chunk, row), a warp per head, tokens lane + 32 e: what lands on
// cs_E (Σ t3 and e^{cs_E} S_in·dS), the reverse cumulative sum of d cs (warp suffix sums carried over
// the token groups) -> d dt, and the chunk's partials of dA_log, D and dt_bias (warp sums).
__global__ void __launch_bounds__(256) reduce_k(Bwd q, const float* dots, bf16* ddt, float* part_dA, float* part_dD,
                                                float* part_ddtb) {
  constexpr int kPer = kQ / 32;
  const Ctx& k = q.k;
  const ssdc::Dims& d = k.d;
  const int lane = threadIdx.x & 31;
  const i64 h = blockIdx.x * 8 + (threadIdx.x >> 5), c = blockIdx.y, b = blockIdx.z, t0 = c * kQ;
  if (h >= d.H) return;
  const int valid = chunk_rows(k, t0), E = valid - 1;
  const i64 tok = k.tok(b, h, t0);
  float dcs[kPer], t3 = 0.f;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int t = 32 * e + lane;
    dcs[e] = t < valid ? q.dcs[tok + t] : 0.f;
    t3 += t < valid ? q.t3[tok + t] : 0.f;
  }
  float end = warp_sum(t3);
  if (k.has_start(c) && k.seq(b, t0 + E) == k.prev_seq(b, c)) {
    const i64 nblk = pass_blocks_per_head(d);
    float dot = 0.f;
    for (i64 j = 0; j < nblk; ++j) dot += dots[((b * d.nch + c) * d.H + h) * nblk + j];
    end += __expf(k.w.cs[tok + E]) * dot;
  }
  const float Ah = k.Ah(h);
  float carry = end, dA = 0.f, dD = 0.f, dtb = 0.f;
#pragma unroll
  for (int e = kPer - 1; e >= 0; --e) {
    float x = dcs[e];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float n = __shfl_down_sync(0xffffffffu, x, o);
      if (lane + o < 32) x += n;
    }
    const float rev = carry + x;
    carry = __shfl_sync(0xffffffffu, rev, 0);
    const int t = 32 * e + lane;
    if (t < valid) {
      const float gr = (q.ddt_dir[tok + t] + Ah * rev) * k.w.ddtv[tok + t];
      ddt[(b * d.L + t0 + t) * d.H + h] = __float2bfloat16(gr);
      dA += k.w.dtv[tok + t] * rev;
      dD += q.dyx_d[tok + t];
      dtb += gr;
    }
  }
  dA = warp_sum(dA), dD = warp_sum(dD), dtb = warp_sum(dtb);
  if (lane == 0) {
    const i64 i = (b * d.nch + c) * d.H + h;
    part_dA[i] = dA * Ah;
    part_dD[i] = dD;
    part_ddtb[i] = dtb;
  }
}

template <int K> void gram(const Gram& gm, const ssdc::Dims& d) {
  const std::size_t sm = sizeof(bf16) * 2 * kQ * K;
  allow_smem(gram_k<K>, sm);
  gram_k<K><<<dim3(static_cast<unsigned>(gm.units), static_cast<unsigned>(d.nch), static_cast<unsigned>(d.B)), 256, sm>>>(
      gm, d.L, d.nch);
}
dim3 per_head(const ssdc::Dims& d) {
  return dim3(static_cast<unsigned>(d.H), static_cast<unsigned>(d.nch), static_cast<unsigned>(d.B));
}
dim3 per_group(const ssdc::Dims& d) {
  return dim3(static_cast<unsigned>(d.G), static_cast<unsigned>(d.nch), static_cast<unsigned>(d.B));
}
template <int N, bool kGrad> void states(const Ctx& k, const bf16* X, float* out) {
  const std::size_t sm = sizeof(bf16) * (kQ * kP + kQ * N) + sizeof(float) * kQ;
  allow_smem(states_k<N, kGrad>, sm);
  states_k<N, kGrad><<<per_head(k.d), 256, sm>>>(k, X, out);
}
template <int N, Mode M> void apply(const Bwd& q, const bf16* S, bf16* out) {
  allow_smem(apply_k<N, M>, apply_smem<N, M>());
  apply_k<N, M><<<per_head(q.k.d), 128, apply_smem<N, M>()>>>(q, S, out);
}
template <int N, bool kDB> void dbc(const Bwd& q, const bf16* M, const bf16* S, bf16* out) {
  allow_smem(dbc_k<N, kDB>, dbc_smem<N>());
  dbc_k<N, kDB><<<per_group(q.k.d), 256, dbc_smem<N>()>>>(q, M, S, out);
}
void pairs(const Bwd& q, bf16* M) {
  allow_smem(pairs_k, sizeof(PairsSmem));
  pairs_k<<<per_group(q.k.d), 256, sizeof(PairsSmem)>>>(q, M);
}
template <class T> T* take(Scratch& s, i64 n) { return static_cast<T*>(s.alloc(sizeof(T) * static_cast<std::size_t>(n))); }

template <int N> void run_phase(ssdc::Phase ph, const Bwd& q, const ssdc::Io<bf16, float>& io, Scratch& s) {
  const Ctx& k = q.k;
  const ssdc::Dims& d = k.d;
  const i64 nstates = d.B * d.nch * d.H * d.PN();
  const unsigned pass_blocks = blocks_for(d.B * d.H * d.PN() / 4, kPassBlock);
  switch (ph) {
    case ssdc::Phase::DtCumsum:
      dt_k<<<dim3(blocks_for(d.H, 8), static_cast<unsigned>(d.nch), static_cast<unsigned>(d.B)), 256>>>(k);
      break;
    case ssdc::Phase::CB:
      gram<N>({k.in.Cm, k.in.Bm, d.G * N, static_cast<int>(d.G), k.w.CB}, d);
      break;
    case ssdc::Phase::States:
      states<N, false>(k, k.in.x, k.w.states);
      break;
    case ssdc::Phase::Pass:
      s.states = take<bf16>(s, nstates);
      pass_k<false><<<pass_blocks, kPassBlock>>>(k, k.w.states, s.states, d.has_init ? k.in.init : nullptr, io.fin,
                                                 nullptr, nullptr);
      break;
    case ssdc::Phase::Scan:
      apply<N, Mode::Scan>(q, s.states, io.y);
      break;
    case ssdc::Phase::DStateLocal:
      states<N, true>(k, q.dy, q.dstates);
      break;
    case ssdc::Phase::DPass:
      s.dstates = take<bf16>(s, nstates);
      s.dots = take<float>(s, d.B * d.nch * d.H * pass_blocks_per_head(d));
      pass_k<true><<<pass_blocks, kPassBlock>>>(k, q.dstates, s.dstates, io.dfin, io.dinit, s.states, s.dots);
      break;
    case ssdc::Phase::Terms:
      s.M = take<bf16>(s, d.B * d.nch * d.G * kQ * kQ);
      apply<N, Mode::StateDot>(q, s.states, nullptr);
      apply<N, Mode::Dx>(q, s.dstates, io.dx);
      pairs(q, s.M);
      dbc<N, true>(q, s.M, s.dstates, io.dB);
      dbc<N, false>(q, s.M, s.states, io.dC);
      break;
    case ssdc::Phase::Reduce:
      reduce_k<<<dim3(blocks_for(d.H, 8), static_cast<unsigned>(d.nch), static_cast<unsigned>(d.B)), 256>>>(
          q, s.dots, io.ddt, io.part_dA_log, io.part_dD, io.part_ddtb);
      break;
  }
  check_launch("ssd (tensor cores)");
}
}  // namespace

bool covers(const ssdc::Dims& d) {
  return d.P == kP && d.Q == kQ && (d.N == 64 || d.N == 128) && d.nch < 65536 && d.B < 65536 && d.H < (i64(1) << 31);
}

void run(ssdc::Phase ph, const Bwd& q, const ssdc::Io<bf16, float>& io, Scratch& s) {
  if (q.k.d.N == 64)
    run_phase<64>(ph, q, io, s);
  else
    run_phase<128>(ph, q, io, s);
}
}  // namespace hcp::kernels::cuda_impl::ssd_tc
