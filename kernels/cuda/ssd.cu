// Mamba2 SSD on the GPU, the correctness reference for the CP strategies (the chunked tensor-core
// SSD belongs to the performance work): one block per (batch row, head) for the forward, per
// (batch row, group) for the backward (dB/dC of a group have one owner), the P x N state in shared
// memory, tokens in order; the backward recomputes the chunk-start states, then each chunk's
// states, and reverses token by token exactly as the host kernel does. seq_idx resets, initial and
// final states, D, dt_bias, softplus and clamp; the state-passing kernels (run decay, initial-state
// term and its backward). Per-head parameter gradients are reduced on the host in a fixed order.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels::cuda_impl {
using namespace hcp::cuda;

namespace {
constexpr int kThreads = 256;

struct Dims {
  std::int64_t B, L, H, P, G, N, Q;
  bool softplus;
  double dt_min, dt_max;
};
template <class S> struct Ptrs {
  const S *x, *dt, *A_log, *Bm, *Cm, *D, *dt_bias, *init;
  const std::int64_t* seq;
};

template <class S, class A>
__device__ __forceinline__ void dt_eff(const Ptrs<S>& in, const Dims& d, std::int64_t b, std::int64_t t, std::int64_t h,
                                       A& v, A& dv) {
  const A u = ld(in.dt + (b * d.L + t) * d.H + h) + (in.dt_bias ? ld(in.dt_bias + h) : A(0));
  v = d.softplus ? (u > A(20) ? u : log1p(exp(u))) : u;
  dv = d.softplus ? sigmoid_(u) : A(1);
  if (v < A(d.dt_min)) v = A(d.dt_min), dv = 0;
  if (v > A(d.dt_max)) v = A(d.dt_max), dv = 0;
}
__device__ __forceinline__ std::int64_t sidx(const std::int64_t* seq, std::int64_t L, std::int64_t b, std::int64_t t) {
  return seq ? seq[b * L + t] : 0;
}
template <class A> __device__ __forceinline__ A Aof(const A a_log) { return -exp(a_log); }

// S <- (reset ? 0 : a S) + dt x B^T over this thread's elements.
template <class S, class A>
__device__ void state_step(A* Ssh, const Ptrs<S>& in, const Dims& d, std::int64_t b, std::int64_t t, std::int64_t h,
                           std::int64_t g, A dt, A a, bool reset) {
  const S* xr = in.x + ((b * d.L + t) * d.H + h) * d.P;
  const S* Br = in.Bm + ((b * d.L + t) * d.G + g) * d.N;
  for (std::int64_t e = threadIdx.x; e < d.P * d.N; e += blockDim.x) {
    const std::int64_t p = e / d.N, n = e % d.N;
    Ssh[e] = (reset ? A(0) : a * Ssh[e]) + dt * ld(xr + p) * ld(Br + n);
  }
}

template <class S, class A>
__global__ void fwd_k(S* y, S* fin, Ptrs<S> in, Dims d) {
  extern __shared__ unsigned char smem[];
  A* Ssh = reinterpret_cast<A*>(smem);
  const std::int64_t b = blockIdx.x / d.H, h = blockIdx.x % d.H, g = h / (d.H / d.G);
  const A Ah = Aof<A>(ld(in.A_log + h)), Dh = in.D ? ld(in.D + h) : A(0);
  for (std::int64_t e = threadIdx.x; e < d.P * d.N; e += blockDim.x)
    Ssh[e] = in.init ? ld(in.init + (b * d.H + h) * d.P * d.N + e) : A(0);
  __syncthreads();
  for (std::int64_t t = 0; t < d.L; ++t) {
    A dt, ddt;
    dt_eff<S, A>(in, d, b, t, h, dt, ddt);
    const bool reset = t > 0 && sidx(in.seq, d.L, b, t) != sidx(in.seq, d.L, b, t - 1);
    state_step<S, A>(Ssh, in, d, b, t, h, g, dt, exp(dt * Ah), reset);
    __syncthreads();
    const S* Cr = in.Cm + ((b * d.L + t) * d.G + g) * d.N;
    const S* xr = in.x + ((b * d.L + t) * d.H + h) * d.P;
    for (std::int64_t p = threadIdx.x; p < d.P; p += blockDim.x) {
      A acc = 0;
      for (std::int64_t n = 0; n < d.N; ++n) acc += ld(Cr + n) * Ssh[p * d.N + n];
      st(y + ((b * d.L + t) * d.H + h) * d.P + p, acc + Dh * ld(xr + p));
    }
    __syncthreads();
  }
  if (fin)
    for (std::int64_t e = threadIdx.x; e < d.P * d.N; e += blockDim.x) st(fin + (b * d.H + h) * d.P * d.N + e, Ssh[e]);
}

// Backward, one block per (b, g); scratch per block: chunk starts [nchunks, P*N] and the states of
// one chunk [Q, P*N]. Shared: running S and dS (P*N each).
template <class S, class A>
__global__ void bwd_k(S* dx, S* ddt_out, S* dB, S* dC, S* dinit, A* dA_part, A* dD_part, A* ddtb_part, const S* dy,
                      const S* dfin, Ptrs<S> in, Dims d, A* scratch, std::int64_t block0) {
  extern __shared__ unsigned char smem[];
  A* Ssh = reinterpret_cast<A*>(smem);
  A* dS = Ssh + d.P * d.N;
  const std::int64_t blk = block0 + blockIdx.x, b = blk / d.G, g = blk % d.G, hpg = d.H / d.G;
  const std::int64_t PN = d.P * d.N, nch = (d.L + d.Q - 1) / d.Q;
  A* starts = scratch + static_cast<std::int64_t>(blockIdx.x) * (nch + d.Q) * PN;
  A* states = starts + nch * PN;
  for (std::int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
    const A Ah = Aof<A>(ld(in.A_log + h)), Dh = in.D ? ld(in.D + h) : A(0);
    // Pass A: the state before every chunk.
    for (std::int64_t e = threadIdx.x; e < PN; e += blockDim.x) Ssh[e] = in.init ? ld(in.init + (b * d.H + h) * PN + e) : A(0);
    __syncthreads();
    for (std::int64_t t = 0; t < d.L; ++t) {
      if (t % d.Q == 0)
        for (std::int64_t e = threadIdx.x; e < PN; e += blockDim.x) starts[(t / d.Q) * PN + e] = Ssh[e];
      A dt, ddt;
      dt_eff<S, A>(in, d, b, t, h, dt, ddt);
      const bool reset = t > 0 && sidx(in.seq, d.L, b, t) != sidx(in.seq, d.L, b, t - 1);
      state_step<S, A>(Ssh, in, d, b, t, h, g, dt, exp(dt * Ah), reset);
      __syncthreads();
    }
    for (std::int64_t e = threadIdx.x; e < PN; e += blockDim.x) dS[e] = dfin ? ld(dfin + (b * d.H + h) * PN + e) : A(0);
    A dA = 0, dDh = 0, ddtb = 0;  // meaningful on thread 0
    __syncthreads();
    for (std::int64_t c = nch - 1; c >= 0; --c) {
      const std::int64_t c0 = c * d.Q, c1 = min(d.L, c0 + d.Q);
      for (std::int64_t e = threadIdx.x; e < PN; e += blockDim.x) Ssh[e] = starts[c * PN + e];
      __syncthreads();
      for (std::int64_t t = c0; t < c1; ++t) {
        A dt, ddt;
        dt_eff<S, A>(in, d, b, t, h, dt, ddt);
        const bool reset = t > 0 && sidx(in.seq, d.L, b, t) != sidx(in.seq, d.L, b, t - 1);
        state_step<S, A>(Ssh, in, d, b, t, h, g, dt, exp(dt * Ah), reset);
        __syncthreads();
        for (std::int64_t e = threadIdx.x; e < PN; e += blockDim.x) states[(t - c0) * PN + e] = Ssh[e];
      }
      __syncthreads();
      for (std::int64_t t = c1 - 1; t >= c0; --t) {
        const A* St = states + (t - c0) * PN;
        const bool reset = t > 0 && sidx(in.seq, d.L, b, t) != sidx(in.seq, d.L, b, t - 1);
        const A* Sprev = nullptr;
        if (!reset) {
          if (t > c0) Sprev = states + (t - 1 - c0) * PN;
          else if (t > 0 || in.init) Sprev = starts + c * PN;
        }
        A dt, ddte;
        dt_eff<S, A>(in, d, b, t, h, dt, ddte);
        const A a = exp(dt * Ah);
        const S* Ct = in.Cm + ((b * d.L + t) * d.G + g) * d.N;
        const S* Bt = in.Bm + ((b * d.L + t) * d.G + g) * d.N;
        const S* xt = in.x + ((b * d.L + t) * d.H + h) * d.P;
        const S* dyt = dy + ((b * d.L + t) * d.H + h) * d.P;
        // y_t = C_t . S_t + D x_t: dC (over p), dD, then dS += dy C^T.
        for (std::int64_t n = threadIdx.x; n < d.N; n += blockDim.x) {
          A acc = 0;
          for (std::int64_t p = 0; p < d.P; ++p) acc += ld(dyt + p) * St[p * d.N + n];
          S* dCt = dC + ((b * d.L + t) * d.G + g) * d.N + n;
          st(dCt, ld(dCt) + acc);
        }
        A part = 0;
        for (std::int64_t p = threadIdx.x; p < d.P; p += blockDim.x) part += ld(dyt + p) * ld(xt + p);
        part = block_sum(part);
        if (threadIdx.x == 0) dDh += part;
        for (std::int64_t e = threadIdx.x; e < PN; e += blockDim.x) dS[e] += ld(dyt + e / d.N) * ld(Ct + e % d.N);
        __syncthreads();
        // S_t = a S_{t-1} + dt x_t B_t^T: dx (over n), dB (over p), ddt and da (over all).
        for (std::int64_t p = threadIdx.x; p < d.P; p += blockDim.x) {
          A acc = 0;
          for (std::int64_t n = 0; n < d.N; ++n) acc += dS[p * d.N + n] * ld(Bt + n);
          st(dx + ((b * d.L + t) * d.H + h) * d.P + p, Dh * ld(dyt + p) + dt * acc);
        }
        for (std::int64_t n = threadIdx.x; n < d.N; n += blockDim.x) {
          A acc = 0;
          for (std::int64_t p = 0; p < d.P; ++p) acc += dS[p * d.N + n] * ld(xt + p);
          S* dBt = dB + ((b * d.L + t) * d.G + g) * d.N + n;
          st(dBt, ld(dBt) + dt * acc);
        }
        A pd = 0, pa = 0;
        for (std::int64_t e = threadIdx.x; e < PN; e += blockDim.x) {
          pd += dS[e] * ld(xt + e / d.N) * ld(Bt + e % d.N);
          if (Sprev) pa += dS[e] * Sprev[e];
        }
        pd = block_sum(pd);
        pa = block_sum(pa);
        const A ddt_t = pd + pa * a * Ah;
        if (threadIdx.x == 0) {
          dA += pa * a * dt;
          const A graw = ddt_t * ddte;
          st(ddt_out + (b * d.L + t) * d.H + h, graw);
          ddtb += graw;
        }
        if (t == 0 && dinit)
          for (std::int64_t e = threadIdx.x; e < PN; e += blockDim.x) st(dinit + (b * d.H + h) * PN + e, a * dS[e]);
        __syncthreads();
        for (std::int64_t e = threadIdx.x; e < PN; e += blockDim.x) dS[e] = reset ? A(0) : dS[e] * a;
        __syncthreads();
      }
    }
    if (threadIdx.x == 0) {
      dA_part[b * d.H + h] = dA * Ah;  // dA/dA_log = A
      dD_part[b * d.H + h] = dDh;
      ddtb_part[b * d.H + h] = ddtb;
    }
    __syncthreads();
  }
}

// ---- state passing -------------------------------------------------------------------------------
template <class S, class A> __global__ void decay_k(S* decay, Ptrs<S> in, Dims d) {
  const std::int64_t w = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (w >= d.B * d.H) return;
  const std::int64_t b = w / d.H, h = w % d.H;
  A s = 0;
  for (std::int64_t t = 0; t < d.L; ++t) {
    A v, dv;
    dt_eff<S, A>(in, d, b, t, h, v, dv);
    s += v;
  }
  st(decay + w, exp(s * Aof<A>(ld(in.A_log + h))));
}
template <class S, class A> __global__ void init_fwd_k(S* y, Ptrs<S> in, Dims d) {
  const std::int64_t b = blockIdx.x / d.H, h = blockIdx.x % d.H, g = h / (d.H / d.G);
  const A Ah = Aof<A>(ld(in.A_log + h));
  const S* S0 = in.init + (b * d.H + h) * d.P * d.N;
  A cs = 0;
  for (std::int64_t t = 0; t < d.L; ++t) {
    A v, dv;
    dt_eff<S, A>(in, d, b, t, h, v, dv);
    cs += v * Ah;
    const A e = exp(cs);
    const S* Cr = in.Cm + ((b * d.L + t) * d.G + g) * d.N;
    for (std::int64_t p = threadIdx.x; p < d.P; p += blockDim.x) {
      A acc = 0;
      for (std::int64_t n = 0; n < d.N; ++n) acc += ld(Cr + n) * ld(S0 + p * d.N + n);
      S* yr = y + ((b * d.L + t) * d.H + h) * d.P + p;
      st(yr, ld(yr) + e * acc);
    }
  }
}
// One block per (b, g); scratch: dcs [L] per block. Accumulates dC and ddt; per-head partials.
template <class S, class A>
__global__ void init_bwd_k(S* dC, S* ddt_out, S* dinit, A* dA_part, A* ddtb_part, const S* dy, const S* ddecay, Ptrs<S> in,
                           Dims d, A* scratch) {
  extern __shared__ unsigned char smem[];
  A* dS0 = reinterpret_cast<A*>(smem);  // the initial state's gradient, accumulated over tokens
  const std::int64_t b = blockIdx.x / d.G, g = blockIdx.x % d.G, hpg = d.H / d.G, PN = d.P * d.N;
  A* dcs = scratch + static_cast<std::int64_t>(blockIdx.x) * d.L;
  for (std::int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
    const A Ah = Aof<A>(ld(in.A_log + h));
    const S* S0 = in.init + (b * d.H + h) * PN;
    if (dy)
      for (std::int64_t e = threadIdx.x; e < PN; e += blockDim.x) dS0[e] = 0;
    __syncthreads();
    A cs = 0;
    for (std::int64_t t = 0; t < d.L; ++t) {
      A v, dv;
      dt_eff<S, A>(in, d, b, t, h, v, dv);
      cs += v * Ah;
      const A e = exp(cs);
      A val = 0;
      if (dy) {
        const S* Ct = in.Cm + ((b * d.L + t) * d.G + g) * d.N;
        const S* dyt = dy + ((b * d.L + t) * d.H + h) * d.P;
        A part = 0;
        for (std::int64_t ee = threadIdx.x; ee < PN; ee += blockDim.x) {
          const std::int64_t p = ee / d.N, n = ee % d.N;
          part += ld(dyt + p) * ld(S0 + ee) * ld(Ct + n);
          dS0[ee] += e * ld(dyt + p) * ld(Ct + n);
        }
        val = e * block_sum(part);
        for (std::int64_t n = threadIdx.x; n < d.N; n += blockDim.x) {
          A acc = 0;
          for (std::int64_t p = 0; p < d.P; ++p) acc += ld(dyt + p) * ld(S0 + p * d.N + n);
          S* dCt = dC + ((b * d.L + t) * d.G + g) * d.N + n;
          st(dCt, ld(dCt) + e * acc);
        }
      }
      if (t == d.L - 1 && ddecay) val += ld(ddecay + b * d.H + h) * e;
      if (threadIdx.x == 0) dcs[t] = val;
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      A acc = 0, dA = 0, ddtb = 0;
      for (std::int64_t t = d.L - 1; t >= 0; --t) {
        acc += dcs[t];
        A v, dv;
        dt_eff<S, A>(in, d, b, t, h, v, dv);
        dA += acc * v;
        const A graw = Ah * acc * dv;
        S* dd = ddt_out + (b * d.L + t) * d.H + h;
        st(dd, ld(dd) + graw);
        ddtb += graw;
      }
      dA_part[b * d.H + h] = dA * Ah;
      ddtb_part[b * d.H + h] = ddtb;
    }
    if (dy)
      for (std::int64_t e = threadIdx.x; e < PN; e += blockDim.x) st(dinit + (b * d.H + h) * PN + e, dS0[e]);
    __syncthreads();
  }
}

Dims dims_of(const SsdParams& p) {
  return {p.batch, p.seqlen, p.heads, p.head_dim, p.groups, p.d_state, p.chunk, p.dt_softplus, p.dt_min, p.dt_max};
}
template <class S> Ptrs<S> ptrs_of(const SsdInputs& in, const std::int64_t* seq) {
  auto opt = [](const Tensor* t) { return t ? dptr<S>(*t) : nullptr; };
  return {dptr<S>(*in.x), dptr<S>(*in.dt), dptr<S>(*in.A_log), dptr<S>(*in.Bm), dptr<S>(*in.Cm), opt(in.D),
          opt(in.dt_bias), opt(in.init_states), seq};
}
void check_inputs(const SsdInputs& in, std::initializer_list<const Tensor*> outs, const char* what) {
  const DType dt = in.x->dtype();
  for (const Tensor* t : {in.x, in.dt, in.A_log, in.Bm, in.Cm, in.D, in.dt_bias, in.init_states})
    if (t) {
      require_cuda(*t, what);
      HCP_CHECK(t->dtype() == dt, what, ": every input must have x's dtype (", to_string(dt), ")");
    }
  for (const Tensor* t : outs)
    if (t) {
      require_cuda(*t, what);
      HCP_CHECK(t->dtype() == dt, what, ": outputs must have x's dtype (", to_string(dt), ")");
    }
}
template <class K> void allow_smem(K kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    HCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}
// Per-head partials [B*H] (device) -> out[h] (+)= sum over b, in order.
template <class A> void reduce_heads(Tensor* out, const A* part, const SsdParams& p, bool accumulate) {
  if (!out) return;
  std::vector<A> h(static_cast<std::size_t>(p.batch * p.heads));
  HCP_CUDA_CHECK(cudaMemcpy(h.data(), part, h.size() * sizeof(A), cudaMemcpyDeviceToHost));
  Tensor hostv = out->to(Space::Host);
  for (std::int64_t k = 0; k < p.heads; ++k) {
    double acc = accumulate ? hostv.get(k) : 0.0;
    for (std::int64_t b = 0; b < p.batch; ++b) acc += static_cast<double>(h[static_cast<std::size_t>(b * p.heads + k)]);
    hostv.set(k, acc);
  }
  out->copy_from(hostv);
}
template <class A> struct DevBuf {
  A* p = nullptr;
  explicit DevBuf(std::int64_t n) { HCP_CUDA_CHECK(cudaMalloc(&p, static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(A))); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};
}  // namespace

void ssd_fwd(Tensor& y, Tensor* final_states, const SsdInputs& in, const SsdParams& p) {
  check_inputs(in, {&y, final_states}, "ssd_fwd");
  DeviceIndex seq(in.seq_idx);
  const Dims d = dims_of(p);
  HCP_CUDA_DISPATCH(*in.x, {
    using A = typename Acc<S>::type;
    const std::size_t sm = static_cast<std::size_t>(d.P * d.N) * sizeof(A);
    allow_smem(fwd_k<S, A>, sm);
    fwd_k<S, A><<<static_cast<unsigned>(d.B * d.H), kThreads, sm>>>(dptr<S>(y), final_states ? dptr<S>(*final_states) : nullptr,
                                                                    ptrs_of<S>(in, seq.p), d);
    check_launch("ssd_fwd");
    HCP_CUDA_CHECK(cudaDeviceSynchronize());
  });
}

void ssd_bwd(const SsdGrads& g, const SsdInputs& in, const Tensor& dy, const Tensor* dfinal, const SsdParams& p) {
  check_inputs(in, {g.dx, g.ddt, g.dA_log, g.dB, g.dC, g.dD, g.ddt_bias, g.dinit_states, &dy, dfinal}, "ssd_bwd");
  DeviceIndex seq(in.seq_idx);
  const Dims d = dims_of(p);
  HCP_CUDA_CHECK(cudaMemset(g.dB->raw(), 0, g.dB->nbytes()));
  HCP_CUDA_CHECK(cudaMemset(g.dC->raw(), 0, g.dC->nbytes()));
  HCP_CUDA_DISPATCH(*in.x, {
    using A = typename Acc<S>::type;
    const std::int64_t PN = d.P * d.N, nch = (d.L + d.Q - 1) / d.Q, blocks = d.B * d.G;
    // Scratch in waves of blocks, at most ~1 GiB at a time.
    const std::int64_t per = (nch + d.Q) * PN;
    const std::int64_t wave = std::max<std::int64_t>(1, std::min<std::int64_t>(blocks, (std::int64_t{1} << 30) / (per * static_cast<std::int64_t>(sizeof(A)))));
    DevBuf<A> scratch(wave * per), dA(d.B * d.H), dD(d.B * d.H), ddtb(d.B * d.H);
    const std::size_t sm = static_cast<std::size_t>(2 * PN) * sizeof(A);
    allow_smem(bwd_k<S, A>, sm);
    for (std::int64_t b0 = 0; b0 < blocks; b0 += wave) {
      const std::int64_t nb = std::min(wave, blocks - b0);
      bwd_k<S, A><<<static_cast<unsigned>(nb), kThreads, sm>>>(
          dptr<S>(*g.dx), dptr<S>(*g.ddt), dptr<S>(*g.dB), dptr<S>(*g.dC), g.dinit_states ? dptr<S>(*g.dinit_states) : nullptr,
          dA.p, dD.p, ddtb.p, dptr<S>(dy), dfinal ? dptr<S>(*dfinal) : nullptr, ptrs_of<S>(in, seq.p), d, scratch.p, b0);
      check_launch("ssd_bwd");
    }
    HCP_CUDA_CHECK(cudaDeviceSynchronize());
    reduce_heads(g.dA_log, dA.p, p, false);
    if (in.D) reduce_heads(g.dD, dD.p, p, false);
    if (in.dt_bias) reduce_heads(g.ddt_bias, ddtb.p, p, false);
  });
}

void ssd_run_decay(Tensor& decay, const SsdInputs& in, const SsdParams& p) {
  check_inputs(in, {&decay}, "ssd_run_decay");
  const Dims d = dims_of(p);
  HCP_CUDA_DISPATCH(*in.x, {
    using A = typename Acc<S>::type;
    decay_k<S, A><<<blocks_for(d.B * d.H, 128), 128>>>(dptr<S>(decay), ptrs_of<S>(in, nullptr), d);
  });
  check_launch("ssd_run_decay");
}

void ssd_init_state_fwd(Tensor& y, const SsdInputs& in, const SsdParams& p) {
  check_inputs(in, {&y}, "ssd_init_state_fwd");
  const Dims d = dims_of(p);
  HCP_CUDA_DISPATCH(*in.x, {
    using A = typename Acc<S>::type;
    init_fwd_k<S, A><<<static_cast<unsigned>(d.B * d.H), 128>>>(dptr<S>(y), ptrs_of<S>(in, nullptr), d);
  });
  check_launch("ssd_init_state_fwd");
}

void ssd_init_state_bwd(const SsdStateGrads& g, const SsdInputs& in, const Tensor* dy, const Tensor* ddecay,
                        const SsdParams& p) {
  check_inputs(in, {g.dC, g.ddt, g.dA_log, g.ddt_bias, g.dinit_states, dy, ddecay}, "ssd_init_state_bwd");
  const Dims d = dims_of(p);
  HCP_CUDA_DISPATCH(*in.x, {
    using A = typename Acc<S>::type;
    DevBuf<A> scratch(d.B * d.G * d.L), dA(d.B * d.H), ddtb(d.B * d.H);
    const std::size_t sm = static_cast<std::size_t>(d.P * d.N) * sizeof(A);
    allow_smem(init_bwd_k<S, A>, sm);
    init_bwd_k<S, A><<<static_cast<unsigned>(d.B * d.G), kThreads, sm>>>(
        dy ? dptr<S>(*g.dC) : nullptr, dptr<S>(*g.ddt), dy ? dptr<S>(*g.dinit_states) : nullptr, dA.p, ddtb.p,
        dy ? dptr<S>(*dy) : nullptr, ddecay ? dptr<S>(*ddecay) : nullptr, ptrs_of<S>(in, nullptr), d, scratch.p);
    check_launch("ssd_init_state_bwd");
    HCP_CUDA_CHECK(cudaDeviceSynchronize());
    reduce_heads(g.dA_log, dA.p, p, true);
    if (in.dt_bias) reduce_heads(g.ddt_bias, ddtb.p, p, true);
  });
}

}  // namespace hcp::kernels::cuda_impl
