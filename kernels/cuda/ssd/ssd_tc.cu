// Mamba2 SSD chunk products on the tensor cores: bf16 operands in shared memory (XOR-swizzled tiles,
// cp.async) or built in registers, mma.sync m16n8k16 with fp32 accumulators, for head_dim P = 64,
// chunk Q = 128 and d_state N = 64 or 128 (the Mamba2 / Nemotron-H sizes). They replace the phases of
// the chunked SSD (kernels/cuda/ssd/chunked.hpp) that are matrix products, with the same inputs, Work
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
// (packed sequences), so "same sequence" is an equality test. The operands of each product are rounded to bf16 (w∘x,
// the decayed masked CB, M, S_in, dS), as the mamba_ssm Triton kernels do; accumulation and the dot products are fp32,
// each output element with one owner and one summation order: bitwise repeatable. Blocks of one chunk's heads are
// adjacent in the grid, so a group's B/C tiles and CB are re-read from L2.
#include "kernels/cuda/ssd/tc_bwd.cuh"
#include "kernels/cuda/ssd/tc_products.cuh"
#include "kernels/cuda/ssd/tc_tile.cuh"

namespace hcp::kernels::cuda_impl::ssd_tc {
namespace {
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
__global__ void __launch_bounds__(kPassBlock)
    pass_k(Ctx k, const float* loc_st, bf16* lo, const bf16* bound, bf16* out, const bf16* S_in, float* dots) {
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
__global__ void __launch_bounds__(256)
    reduce_k(Bwd q, const float* dots, bf16* ddt, float* part_dA, float* part_dD, float* part_ddtb) {
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

template <int K>
void gram(const Gram& gm, const ssdc::Dims& d) {
  const std::size_t sm = sizeof(bf16) * 2 * kQ * K;
  allow_smem(gram_k<K>, sm);
  gram_k<K>
      <<<dim3(static_cast<unsigned>(gm.units), static_cast<unsigned>(d.nch), static_cast<unsigned>(d.B)), 256, sm>>>(
          gm, d.L, d.nch);
}
dim3 per_head(const ssdc::Dims& d) {
  return dim3(static_cast<unsigned>(d.H), static_cast<unsigned>(d.nch), static_cast<unsigned>(d.B));
}
dim3 per_group(const ssdc::Dims& d) {
  return dim3(static_cast<unsigned>(d.G), static_cast<unsigned>(d.nch), static_cast<unsigned>(d.B));
}
template <int N, bool kGrad>
void states(const Ctx& k, const bf16* X, float* out) {
  const std::size_t sm = sizeof(bf16) * (kQ * kP + kQ * N) + sizeof(float) * kQ;
  allow_smem(states_k<N, kGrad>, sm);
  states_k<N, kGrad><<<per_head(k.d), 256, sm>>>(k, X, out);
}
template <int N, Mode M>
void apply(const Bwd& q, const bf16* S, bf16* out) {
  allow_smem(apply_k<N, M>, apply_smem<N, M>());
  apply_k<N, M><<<per_head(q.k.d), 128, apply_smem<N, M>()>>>(q, S, out);
}
template <int N, bool kDB>
void dbc(const Bwd& q, const bf16* M, const bf16* S, bf16* out) {
  allow_smem(dbc_k<N, kDB>, dbc_smem<N>());
  dbc_k<N, kDB><<<per_group(q.k.d), 256, dbc_smem<N>()>>>(q, M, S, out);
}
void pairs(const Bwd& q, bf16* M) {
  allow_smem(pairs_k, sizeof(PairsSmem));
  pairs_k<<<per_group(q.k.d), 256, sizeof(PairsSmem)>>>(q, M);
}
template <class T>
T* take(Scratch& s, i64 n) {
  return static_cast<T*>(s.alloc(sizeof(T) * static_cast<std::size_t>(n)));
}

template <int N>
void run_phase(ssdc::Phase ph, const Bwd& q, const ssdc::Io<bf16, float>& io, Scratch& s) {
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
