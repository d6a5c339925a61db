// The SSD products shared by forward and backward: gram (C·B^T), states ((w∘X)^T Y) and apply (the
// chunk scan forward, dx backward).
// Private to kernels/cuda/ssd/ssd_tc.cu (its one translation unit).
#pragma once
#include "kernels/cuda/ssd/tc_tile.cuh"

namespace hcp::kernels::cuda_impl::ssd_tc {
// ---- gram: out[unit] = A_c · B_c^T (lower triangle, zero above); 8 warps, warp w owns rows [16w, +16).
struct Gram {
  const bf16 *a, *b;
  i64 ld;      // elements between tokens
  int units;   // groups (C·B^T) or heads (dy·x^T), K elements each
  float* out;  // [B, nch, units, Q, Q]
};
template <int K>
__global__ void __launch_bounds__(256) gram_k(Gram gm, i64 L, i64 nch) {
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
template <int N, bool kGrad>
__global__ void __launch_bounds__(256) states_k(Ctx k, const bf16* X, float* out) {
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
template <int N, Mode M>
constexpr std::size_t apply_smem() {
  return sizeof(bf16) * ((M == Mode::Scan ? 1 : 2) * kQ * kP + kQ * N + kP * N) + sizeof(Tok);
}
template <int N, Mode M>
__global__ void __launch_bounds__(128) apply_k(Bwd q, const bf16* S, bf16* out) {
  constexpr bool kDx = M == Mode::Dx;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Vt = reinterpret_cast<bf16*>(smem);         // the streamed operand: x (scan, dot) or dy (dx)
  bf16* Wt = Vt + kQ * kP;                          // the dot partner: dy (dot) or x (dx); none in the scan
  bf16* Rt = Wt + (M == Mode::Scan ? 0 : kQ * kP);  // the state term's rows: C (scan, dot) or B (dx)
  bf16* St = Rt + kQ * N;                           // S (S_in: scan, dot; dS_end: dx), [P][N]
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
          const float2 u =
              __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at<kP>(Vt, i, nt * 8 + 2 * tig)));
          const float2 v =
              __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at<kP>(Wt, i, nt * 8 + 2 * tig)));
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
        *reinterpret_cast<unsigned*>(o + p) =
            pack_bf16(f * acc[m][nt][2 * hf] + Dh * v.x, f * acc[m][nt][2 * hf + 1] + Dh * v.y);
      }
    }
}
}  // namespace hcp::kernels::cuda_impl::ssd_tc
