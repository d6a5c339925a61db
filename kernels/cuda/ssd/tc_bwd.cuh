// The SSD backward's own products: the pair terms and intra-chunk matrix M (pairs_k) and dB / dC
// (dbc_k).
// Private to kernels/cuda/ssd/ssd_tc.cu (its one translation unit).
#pragma once
#include "kernels/cuda/ssd/tc_tile.cuh"

namespace hcp::kernels::cuda_impl::ssd_tc {
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
__device__ __forceinline__ bool meets(int m, int jb, int par, int mt) {
  return !(m == 0 && jb >= 2) && par + 2 * jb <= mt;
}
// f(m, jb, s2, x, i, j) for each element this thread holds of the fragments [m][jb][s2][x] of the
// blocks that row tile mt[m] meets: x = 2 hf + e, row i = 16 mt[m] + grp + 8 hf, column
// j = 16 (par + 2 jb) + 8 s2 + 2 tig + e.
template <class F>
__device__ __forceinline__ void each_pair(const int (&mt)[2], int par, F&& f) {
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
template <int N>
constexpr std::size_t dbc_smem() {
  return sizeof(bf16) * (kQ * N + kQ * kQ + kQ * kP + kP * N);
}
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

}  // namespace hcp::kernels::cuda_impl::ssd_tc
