// Mamba2 SSD chunk products on the tensor cores: bf16 operands in shared memory (XOR-swizzled tiles,
// cp.async), mma.sync m16n8k16 with fp32 accumulators, for head_dim P = 64, chunk Q = 128 and d_state
// N = 64 or 128 (the Mamba2 / Nemotron-H sizes). Three phases of the chunked SSD
// (kernels/cuda/ssd_chunked.hpp) with the same inputs, Work layout and semantics (seq_idx resets,
// initial states, a ragged last chunk):
//   CB      CB[b,c,g] = C_c · B_c^T, lower triangle (zero above)            block per (chunk, group, row)
//   states  S[b,c,h]  = (w ∘ x_c)^T · B_c, w_s = e^{cs_E − cs_s} dt_s [seq_s = seq_E]
//                                                                           block per (head, chunk, row)
//   scan    y_t = [seq_t = prev] e^{cs_t} C_t · S_in + Σ_{s ≤ t, seq_s = seq_t} e^{cs_t − cs_s} dt_s CB_ts x_s
//                 + D x_t                                                   block per (head, chunk, row)
// seq_idx is nondecreasing along a row (packed sequences), so "same sequence" is an equality test.
// The operands of each product are rounded to bf16 (w∘x, the decayed and masked CB, S_in), as the
// mamba_ssm Triton kernels do; accumulation is fp32. Blocks of one chunk's heads are adjacent in the
// grid, so the group's B/C tiles and CB are re-read from L2.
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
constexpr int kQ = 128;  // chunk
constexpr int kP = 64;   // head_dim

__device__ __forceinline__ i64 seq_of(const Ctx& k, i64 b, i64 t) { return k.in.seq ? k.in.seq[b * k.d.L + t] : 0; }
__device__ __forceinline__ int chunk_rows(const Ctx& k, i64 t0) { return static_cast<int>(min(i64(kQ), k.d.L - t0)); }

// C·B^T: 8 warps, warp w owns rows [16w, 16w + 16) and computes columns up to its diagonal block.
template <int N> __global__ void __launch_bounds__(256) cb_k(Ctx k) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Ct = reinterpret_cast<bf16*>(smem);
  bf16* Bt = Ct + kQ * N;
  const ssdc::Dims& d = k.d;
  const i64 c = blockIdx.x, g = blockIdx.y, b = blockIdx.z, t0 = c * kQ;
  const i64 off = ((b * d.L + t0) * d.G + g) * N;
  const int valid = chunk_rows(k, t0);
  load_tile_async<N, 256>(Ct, k.in.Cm + off, d.G * N, kQ, valid);
  load_tile_async<N, 256>(Bt, k.in.Bm + off, d.G * N, kQ, valid);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane >> 2, tig = lane & 3, r0 = 16 * w;
  float acc[kQ / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    unsigned a[4];
    load_a<N>(a, Ct, r0, kk * 16);
#pragma unroll
    for (int np = 0; np < kQ / 16; ++np)
      if (np <= w) {
        unsigned bb[4];
        load_b_nk<N>(bb, Bt, np * 16, kk * 16);
        mma(acc[2 * np], a, bb[0], bb[1]);
        mma(acc[2 * np + 1], a, bb[2], bb[3]);
      }
  }
  float* out = k.w.CB + ((b * d.nch + c) * d.G + g) * kQ * kQ;
#pragma unroll
  for (int nt = 0; nt < kQ / 8; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = r0 + grp + 8 * hf, j = nt * 8 + 2 * tig;
      *reinterpret_cast<float2*>(out + i * kQ + j) =
          make_float2(j <= i ? acc[nt][2 * hf] : 0.f, j + 1 <= i ? acc[nt][2 * hf + 1] : 0.f);
    }
}

// Chunk states: 8 warps, warp w owns p rows [16 (w % 4), +16) and the n half w / 4.
template <int N> __global__ void __launch_bounds__(256) states_k(Ctx k) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Xt = reinterpret_cast<bf16*>(smem);
  bf16* Yt = Xt + kQ * kP;
  float* wv = reinterpret_cast<float*>(Yt + kQ * N);
  const ssdc::Dims& d = k.d;
  const i64 h = blockIdx.x, c = blockIdx.y, b = blockIdx.z, g = h / d.hpg(), t0 = c * kQ;
  const int valid = chunk_rows(k, t0);
  load_tile_async<kP, 256>(Xt, k.in.x + ((b * d.L + t0) * d.H + h) * kP, d.H * kP, kQ, valid);
  load_tile_async<N, 256>(Yt, k.in.Bm + ((b * d.L + t0) * d.G + g) * N, d.G * N, kQ, valid);
  cp_async_commit();
  if (threadIdx.x < kQ) {
    const int s = threadIdx.x;
    const i64 tok = k.tok(b, h, t0);
    float wgt = 0.f;
    if (s < valid && seq_of(k, b, t0 + s) == seq_of(k, b, t0 + valid - 1))
      wgt = __expf(k.w.cs[tok + valid - 1] - k.w.cs[tok + s]) * k.w.dtv[tok + s];
    wv[s] = wgt;
  }
  cp_async_wait<0>();
  __syncthreads();
  for (int i = threadIdx.x; i < kQ * kP / 8; i += 256) {  // x rows scaled by their weight, in place
    const int r = i / (kP / 8), ch = i % (kP / 8);
    uint4* q = reinterpret_cast<uint4*>(at<kP>(Xt, r, ch * 8));
    uint4 v = *q;
    __nv_bfloat162* e = reinterpret_cast<__nv_bfloat162*>(&v);
    const float f = wv[r];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 u = __bfloat1622float2(e[j]);
      e[j] = __floats2bfloat162_rn(u.x * f, u.y * f);
    }
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
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      unsigned bb[4];
      load_b_kn<N>(bb, Yt, kk * 16, n0 + np * 16);
      mma(acc[2 * np], a, bb[0], bb[1]);
      mma(acc[2 * np + 1], a, bb[2], bb[3]);
    }
  }
  float* out = k.w.states + k.st(b, c, h);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      *reinterpret_cast<float2*>(out + (p0 + grp + 8 * hf) * N + n0 + nt * 8 + 2 * tig) =
          make_float2(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
}

// Chunk scan: 4 warps, warp w owns the 16-row tiles w and 7 − w (equal causal work per warp).
template <int N> struct ScanSmem {
  static constexpr std::size_t kBytes = sizeof(bf16) * (kQ * kP + kQ * N + kP * N) + kQ * (2 * sizeof(float) + sizeof(i64));
};
template <int N> __global__ void __launch_bounds__(128) scan_k(Ctx k, bf16* y) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Xt = reinterpret_cast<bf16*>(smem);
  bf16* Ct = Xt + kQ * kP;
  bf16* St = Ct + kQ * N;
  float* csv = reinterpret_cast<float*>(St + kP * N);
  float* dtv = csv + kQ;
  i64* sq = reinterpret_cast<i64*>(dtv + kQ);
  const ssdc::Dims& d = k.d;
  const i64 h = blockIdx.x, c = blockIdx.y, b = blockIdx.z, g = h / d.hpg(), t0 = c * kQ;
  const int valid = chunk_rows(k, t0);
  const bool start = k.has_start(c);
  load_tile_async<kP, 128>(Xt, k.in.x + ((b * d.L + t0) * d.H + h) * kP, d.H * kP, kQ, valid);
  if (start) load_tile_async<N, 128>(Ct, k.in.Cm + ((b * d.L + t0) * d.G + g) * N, d.G * N, kQ, valid);
  cp_async_commit();
  if (start) {  // S_in (fp32, [P][N]) -> bf16 tile
    const float* S0 = k.w.states + k.st(b, c, h);
    for (int i = threadIdx.x; i < kP * N / 8; i += 128) {
      const int r = i / (N / 8), ch = i % (N / 8);
      const float4 u = *reinterpret_cast<const float4*>(S0 + r * N + ch * 8);
      const float4 v = *reinterpret_cast<const float4*>(S0 + r * N + ch * 8 + 4);
      *reinterpret_cast<uint4*>(at<N>(St, r, ch * 8)) =
          make_uint4(pack_bf16(u.x, u.y), pack_bf16(u.z, u.w), pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    }
  }
  {
    const int s = threadIdx.x;  // 128 threads = kQ rows
    const i64 tok = k.tok(b, h, t0);
    csv[s] = s < valid ? k.w.cs[tok + s] : 0.f;
    dtv[s] = s < valid ? k.w.dtv[tok + s] : 0.f;
    sq[s] = s < valid ? seq_of(k, b, t0 + s) : -1;
  }
  const i64 prev = seq_of(k, b, c == 0 ? 0 : t0 - 1);
  cp_async_wait<0>();
  __syncthreads();
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane >> 2, tig = lane & 3;
  const int mt[2] = {w, 7 - w};
  float acc[2][kP / 8][4] = {};
  if (start) {  // chunk-start state term, rows scaled by e^{cs_t} where the row continues that sequence
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
      unsigned a[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m) load_a<N>(a[m], Ct, 16 * mt[m], kk * 16);
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
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * mt[m] + grp + 8 * hf;
        const float f = sq[i] == prev ? __expf(csv[i]) : 0.f;
#pragma unroll
        for (int nt = 0; nt < kP / 8; ++nt) acc[m][nt][2 * hf] *= f, acc[m][nt][2 * hf + 1] *= f;
      }
  }
  // Intra-chunk term: the A fragment (decayed, masked CB) is built in registers from CB in global memory.
  const float* cb = k.w.CB + ((b * d.nch + c) * d.G + g) * kQ * kQ;
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    int ri[2];
    float ci[2];
    i64 si[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) ri[hf] = 16 * mt[m] + grp + 8 * hf, ci[hf] = csv[ri[hf]], si[hf] = sq[ri[hf]];
    for (int kb = 0; kb <= mt[m]; ++kb) {
      unsigned a[4];
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = ri[hf], j = kb * 16 + 2 * tig + 8 * q;
          const float2 v = *reinterpret_cast<const float2*>(cb + i * kQ + j);
          const float e0 = j <= i && sq[j] == si[hf] ? v.x * __expf(ci[hf] - csv[j]) * dtv[j] : 0.f;
          const float e1 = j + 1 <= i && sq[j + 1] == si[hf] ? v.y * __expf(ci[hf] - csv[j + 1]) * dtv[j + 1] : 0.f;
          a[hf + 2 * q] = pack_bf16(e0, e1);
        }
#pragma unroll
      for (int np = 0; np < kP / 16; ++np) {
        unsigned bb[4];
        load_b_kn<kP>(bb, Xt, kb * 16, np * 16);
        mma(acc[m][2 * np], a, bb[0], bb[1]);
        mma(acc[m][2 * np + 1], a, bb[2], bb[3]);
      }
    }
  }
  const float Dh = k.in.D ? __bfloat162float(k.in.D[h]) : 0.f;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * mt[m] + grp + 8 * hf;
      if (i >= valid) continue;
      bf16* out = y + ((b * d.L + t0 + i) * d.H + h) * kP;
#pragma unroll
      for (int nt = 0; nt < kP / 8; ++nt) {
        const int p = nt * 8 + 2 * tig;
        const float2 xv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at<kP>(Xt, i, p)));
        *reinterpret_cast<unsigned*>(out + p) = pack_bf16(acc[m][nt][2 * hf] + Dh * xv.x, acc[m][nt][2 * hf + 1] + Dh * xv.y);
      }
    }
}

template <int N> void launch(ssdc::Phase ph, const Ctx& k, bf16* y) {
  const ssdc::Dims& d = k.d;
  const auto B = static_cast<unsigned>(d.B), C = static_cast<unsigned>(d.nch);
  switch (ph) {
    case ssdc::Phase::CB: {
      const std::size_t sm = sizeof(bf16) * 2 * kQ * N;
      allow_smem(cb_k<N>, sm);
      cb_k<N><<<dim3(C, static_cast<unsigned>(d.G), B), 256, sm>>>(k);
      break;
    }
    case ssdc::Phase::States: {
      const std::size_t sm = sizeof(bf16) * (kQ * kP + kQ * N) + sizeof(float) * kQ;
      allow_smem(states_k<N>, sm);
      states_k<N><<<dim3(static_cast<unsigned>(d.H), C, B), 256, sm>>>(k);
      break;
    }
    case ssdc::Phase::Scan: {
      allow_smem(scan_k<N>, ScanSmem<N>::kBytes);
      scan_k<N><<<dim3(static_cast<unsigned>(d.H), C, B), 128, ScanSmem<N>::kBytes>>>(k, y);
      break;
    }
  }
  check_launch("ssd (tensor cores)");
}
}  // namespace

bool covers(const ssdc::Dims& d) { return d.P == kP && d.Q == kQ && (d.N == 64 || d.N == 128) && d.nch < 65536 && d.B < 65536; }

bool run(ssdc::Phase ph, const Ctx& k, bf16* y) {
  if (!covers(k.d)) return false;
  for (const void* p : {static_cast<const void*>(k.in.x), static_cast<const void*>(k.in.Bm), static_cast<const void*>(k.in.Cm),
                        static_cast<const void*>(y)})
    if (p && !aligned16(p)) return false;
  if (k.d.N == 64)
    launch<64>(ph, k, y);
  else
    launch<128>(ph, k, y);
  return true;
}
}  // namespace hcp::kernels::cuda_impl::ssd_tc
