// Mamba2 SSD on the GPU: the chunked (state-space duality) forward and backward of
// kernels/cuda/ssd/chunked.hpp, one thread per output element and one launch per phase (dt cumsum,
// C.B, chunk states, state passing, chunk scan; the backward adds local state gradients, reverse state
// passing, dy.x, dx, dB, dC, per-token dt terms and a per-chunk reduction); seq_idx resets, initial and
// final states, D, dt_bias, softplus and clamp. The same element functions run on the host in
// tests/unit/test_ssd_chunked.cpp. For bf16 at the Mamba2 sizes (head_dim 64, chunk 128, d_state 64 or
// 128), with every tensor 16-byte aligned, the exec hands every phase to the kernels of
// kernels/cuda/ssd/ssd_tc.cu (tensor cores, warp scans, vectorised state passing).
// Also the state-passing kernels (run decay, initial-state term and its backward). Per-head parameter
// gradients are reduced in a fixed order: bitwise repeatable.
#include <cmath>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/ssd/chunked.hpp"
#include "kernels/cuda/ssd/ssd_tc.hpp"
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
template <class S>
struct Ptrs {
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
template <class A>
__device__ __forceinline__ A Aof(const A a_log) {
  return -exp(a_log);
}

// ---- state passing -------------------------------------------------------------------------------
// The summed effective dt of (b, h) over the run, by one block in a fixed order (bitwise
// repeatable); every thread gets the sum.
template <class S, class A>
__device__ A run_dt_sum(const Ptrs<S>& in, const Dims& d, std::int64_t b, std::int64_t h) {
  A s = 0;
  for (std::int64_t t = threadIdx.x; t < d.L; t += blockDim.x) {
    A v, dv;
    dt_eff<S, A>(in, d, b, t, h, v, dv);
    s += v;
  }
  return block_sum(s);
}
// One block per (b, h): the run's total decay exp(A sum dt).
template <class S, class A>
__global__ void decay_k(S* decay, Ptrs<S> in, Dims d) {
  const std::int64_t b = blockIdx.x / d.H, h = blockIdx.x % d.H;
  const A s = run_dt_sum<S, A>(in, d, b, h);
  if (threadIdx.x == 0) st(decay + blockIdx.x, exp(s * Aof<A>(ld(in.A_log + h))));
}
// The decay's backward alone (no initial-state term), one block per (b, h). With G = ddecay a and
// a = exp(A sum dt), every token's raw dt gets A G dv, A_log's partial is A G sum(dt), dt_bias's the
// sum of the tokens' terms.
template <class S, class A>
__global__ void decay_bwd_k(S* ddt_out, A* dA_part, A* ddtb_part, const S* ddecay, Ptrs<S> in, Dims d) {
  const std::int64_t b = blockIdx.x / d.H, h = blockIdx.x % d.H;
  const A Ah = Aof<A>(ld(in.A_log + h));
  const A s = run_dt_sum<S, A>(in, d, b, h);
  const A G = ld(ddecay + blockIdx.x) * exp(s * Ah);
  A sg = 0;
  for (std::int64_t t = threadIdx.x; t < d.L; t += blockDim.x) {
    A v, dv;
    dt_eff<S, A>(in, d, b, t, h, v, dv);
    const A graw = Ah * G * dv;
    S* dd = ddt_out + (b * d.L + t) * d.H + h;
    st(dd, ld(dd) + graw);
    sg += graw;
  }
  sg = block_sum(sg);
  if (threadIdx.x == 0) {
    dA_part[blockIdx.x] = G * s * Ah;
    ddtb_part[blockIdx.x] = sg;
  }
}
// A fixed-order scan over the L tokens of one (b, h) by one block of kThreads: thread i takes a
// contiguous run of tokens, a single thread scans the runs' sums; out(t, s) gets the inclusive sum
// of term up to t (from the last token down when `reverse`).
template <class A, class Term, class Out>
__device__ void token_scan(std::int64_t L, bool reverse, Term term, Out out) {
  __shared__ A part[kThreads];
  const std::int64_t seg = (L + kThreads - 1) / kThreads, lo = threadIdx.x * seg, hi = lo + seg < L ? lo + seg : L;
  A s = 0;
  for (std::int64_t i = lo; i < hi; ++i) s += term(reverse ? L - 1 - i : i);
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    A run = 0;
    for (int i = 0; i < kThreads; ++i) {
      const A v = part[i];
      part[i] = run;
      run += v;
    }
  }
  __syncthreads();
  A run = part[threadIdx.x];
  for (std::int64_t i = lo; i < hi; ++i) {
    const std::int64_t t = reverse ? L - 1 - i : i;
    run += term(t);
    out(t, run);
  }
  __syncthreads();
}
// cs[(b H + h) L + t] = sum over s <= t of A dt_s, one block per (b, h).
template <class S, class A>
__global__ void cumdt_k(A* cs, Ptrs<S> in, Dims d) {
  const std::int64_t b = blockIdx.x / d.H, h = blockIdx.x % d.H;
  const A Ah = Aof<A>(ld(in.A_log + h));
  A* row = cs + static_cast<std::int64_t>(blockIdx.x) * d.L;
  token_scan<A>(
      d.L, false,
      [&](std::int64_t t) {
        A v, dv;
        dt_eff<S, A>(in, d, b, t, h, v, dv);
        return v * Ah;
      },
      [&](std::int64_t t, A s) { row[t] = s; });
}
// The initial-state term (a piece that does not start its sequence): y_t += exp(cs_t) C_t . S0, with
// cs_t = A (dt_0 + ... + dt_t), and its backward. Its products are GEMMs per group of heads on cuBLAS
// (tensor cores for bf16; fp32 and fp64 in their own precision): with the heads of group g side by
// side (K1 = H/G · P columns, S0 of those heads a [K1][N] block),
//   W = C_g S0_g^T            [tokens x K1]   (forward: y += exp(cs) ⊙ W)
//   dS0_g = ey_g^T C_g        [K1 x N]        (ey = exp(cs) ⊙ dy)
//   dC_g += ey_g S0_g         [tokens x N]
//   dcs_t = exp(cs_t) dy_t . W_t               (per head and token, for the dt terms)
// Tokens go in chunks, so that the work buffers (W in the accumulation type, ey in x's) stay within
// kInitScratch bytes. cuBLAS gives the same bits on every call for the same shapes.
constexpr std::int64_t kInitScratch = std::int64_t{64} << 20;

template <class T>
constexpr cudaDataType_t blas_type() {
  if constexpr (std::is_same_v<T, double>)
    return CUDA_R_64F;
  else if constexpr (std::is_same_v<T, float>)
    return CUDA_R_32F;
  else
    return CUDA_R_16BF;
}
// C_i (col-major m x n, ldc) = op(A_i) op(B_i) + beta C_i for i < count, each operand `s*` elements
// further than the last; A and B of type S, C of type C; fp32 sums (fp64 for fp64).
template <class S, class C, class A>
void gemm_batched(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const S* a, std::int64_t lda,
                  std::int64_t sa, const S* b, std::int64_t ldb, std::int64_t sb, C* c, std::int64_t ldc,
                  std::int64_t sc, std::int64_t count, bool accumulate) {
  if (m == 0 || n == 0 || count == 0) return;
  const A one = 1, beta = accumulate ? A(1) : A(0);
  HCP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas(), ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(m),
      static_cast<int>(n), static_cast<int>(k), &one, a, blas_type<S>(), static_cast<int>(lda), sa, b, blas_type<S>(),
      static_cast<int>(ldb), sb, &beta, c, blas_type<C>(), static_cast<int>(ldc), sc, static_cast<int>(count),
      std::is_same_v<A, double> ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
// Tokens per chunk of the initial-state term: the work buffers of one chunk within kInitScratch.
template <class S, class A>
std::int64_t init_chunk(const Dims& d) {
  const std::int64_t row = d.H * d.P * static_cast<std::int64_t>(sizeof(A) + sizeof(S));
  return std::max<std::int64_t>(1, std::min(d.L, kInitScratch / std::max<std::int64_t>(row, 1)));
}
// W[j, (h, p)] = sum_n C[t0 + j, g(h), n] S0[h, p, n] for the n tokens of a chunk of sequence b.
template <class S, class A>
void init_products(A* W, const Ptrs<S>& in, const Dims& d, std::int64_t b, std::int64_t t0, std::int64_t n) {
  const std::int64_t K1 = d.H / d.G * d.P;
  // Col-major W^T (K1 x n, ld H P) per group = S0_g (K1 x N, stored [K1][N]) · C_g^T (N x n, ld G N).
  gemm_batched<S, A, A>(true, false, K1, n, d.N, in.init + b * d.H * d.P * d.N, d.N, K1 * d.N,
                        in.Cm + (b * d.L + t0) * d.G * d.N, d.G * d.N, d.N, W, d.H * d.P, K1, d.G, false);
}
// y[b, t0 + j, h, p] += exp(cs_t) W[j, h, p], one thread per element of the chunk.
template <class S, class A>
__global__ void init_apply_k(S* y, const A* W, const A* cs, Dims d, std::int64_t b, std::int64_t t0, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * d.H * d.P) return;
  const std::int64_t j = i / (d.H * d.P), h = i / d.P % d.H;
  S* o = y + (b * d.L + t0) * d.H * d.P + i;
  st(o, ld(o) + exp(cs[(b * d.H + h) * d.L + t0 + j]) * W[i]);
}
// One warp per (token j of the chunk, head h): ey = exp(cs_t) dy_t (x's dtype, the GEMMs' operand) and
// dcs_t = exp(cs_t) dy_t . W_t (lanes over p, then a fixed butterfly).
template <class S, class A>
__global__ void init_dy_k(S* ey, A* dcs, const S* dy, const A* W, const A* cs, Dims d, std::int64_t b, std::int64_t t0,
                          std::int64_t n) {
  const std::int64_t r = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= n * d.H) return;
  const std::int64_t j = r / d.H, h = r % d.H, bht = (b * d.H + h) * d.L + t0 + j;
  const A e = exp(cs[bht]);
  const S* dyr = dy + ((b * d.L + t0 + j) * d.H + h) * d.P;
  A dot = 0;
  for (std::int64_t p = lane; p < d.P; p += 32) {
    const A g = ld(dyr + p);
    dot += g * W[r * d.P + p];
    st(ey + r * d.P + p, e * g);
  }
  dot = warp_sum(dot);
  if (lane == 0) dcs[bht] = e * dot;
}
template <class S, class A>
__global__ void cast_k(S* out, const A* in, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) st(out + i, in[i]);
}
// The dt terms, one block per (b, h): with acc_t the sum of dcs from the last token down to t (and
// ddecay exp(cs_{L-1}) at the last token), A_log's partial is A sum_t acc_t dt_t, each token's raw
// dt gets A acc_t dv_t, and dt_bias's partial is the sum of those.
template <class S, class A>
__global__ void init_dt_k(S* ddt_out, A* dA_part, A* ddtb_part, const A* dcs, const A* cs, const S* ddecay, Ptrs<S> in,
                          Dims d) {
  const std::int64_t bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
  const A Ah = Aof<A>(ld(in.A_log + h));
  const A* row = dcs + bh * d.L;
  const A last = ddecay ? ld(ddecay + bh) * exp(cs[bh * d.L + d.L - 1]) : A(0);
  A dA = 0, ddtb = 0;
  token_scan<A>(
      d.L, true, [&](std::int64_t t) { return row[t] + (t == d.L - 1 ? last : A(0)); },
      [&](std::int64_t t, A acc) {
        A v, dv;
        dt_eff<S, A>(in, d, b, t, h, v, dv);
        dA += acc * v;
        const A graw = Ah * acc * dv;
        S* dd = ddt_out + (b * d.L + t) * d.H + h;
        st(dd, ld(dd) + graw);
        ddtb += graw;
      });
  dA = block_sum(dA);
  ddtb = block_sum(ddtb);
  if (threadIdx.x == 0) {
    dA_part[bh] = dA * Ah;
    ddtb_part[bh] = ddtb;
  }
}

// One decode step: a block per (b, h), a warp per row p of the state (lanes over n), the output
// row's sum over n by the warp (fixed order: bitwise repeatable). state in A (fp32 for bf16).
template <class S, class A>
__global__ void ssd_step_k(S* y, A* state, Ptrs<S> in, Dims d) {
  const std::int64_t bh = blockIdx.x, b = bh / d.H, h = bh % d.H, g = h / (d.H / d.G);
  A dt, ddt;
  dt_eff<S, A>(in, d, b, 0, h, dt, ddt);
  const A a = exp(dt * Aof(A(ld(in.A_log + h)))), Dh = in.D ? A(ld(in.D + h)) : A(0);
  const S* x = in.x + bh * d.P;
  const S* Bv = in.Bm + (b * d.G + g) * d.N;
  const S* Cv = in.Cm + (b * d.G + g) * d.N;
  A* s = state + bh * d.P * d.N;
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (std::int64_t p = threadIdx.x / 32; p < d.P; p += warps) {
    const A xp = ld(x + p);
    A acc = 0;
    for (std::int64_t n = lane; n < d.N; n += 32) {
      const A v = a * s[p * d.N + n] + dt * xp * A(ld(Bv + n));
      s[p * d.N + n] = v;
      acc += A(ld(Cv + n)) * v;
    }
    acc = warp_sum(acc);
    if (lane == 0) st(y + bh * d.P + p, acc + Dh * xp);
  }
}

Dims dims_of(const SsdParams& p) {
  return {p.batch, p.seqlen, p.heads, p.head_dim, p.groups, p.d_state, p.chunk, p.dt_softplus, p.dt_min, p.dt_max};
}
template <class S>
Ptrs<S> ptrs_of(const SsdInputs& in, const std::int64_t* seq) {
  auto opt = [](const Tensor* t) { return t ? dptr<S>(*t) : nullptr; };
  return {dptr<S>(*in.x),  dptr<S>(*in.dt),     dptr<S>(*in.A_log),
          dptr<S>(*in.Bm), dptr<S>(*in.Cm),     opt(in.D),
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
// The per-head parameter gradients (dA_log, dD, dt_bias) are sums over every token: besides x's
// dtype they may be fp32 when x is bf16, so that a caller adding several calls' sums rounds once.
void check_head_sums(const SsdInputs& in, std::initializer_list<const Tensor*> sums, const char* what) {
  const DType dt = in.x->dtype();
  for (const Tensor* t : sums)
    if (t) {
      require_cuda(*t, what);
      HCP_CHECK(t->dtype() == dt || (dt == DType::BF16 && t->dtype() == DType::F32), what,
                ": per-head gradients must have x's dtype (", to_string(dt), ") or, for bf16, fp32");
    }
}
// Per-head partials [rows, H] (device) -> out[h] (+)= sum over rows, in order, in fp64: one thread per
// head, on the device (no synchronisation).
template <class S, class A>
__global__ void reduce_heads_k(S* out, const A* part, std::int64_t rows, std::int64_t heads, bool accumulate) {
  const std::int64_t h = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= heads) return;
  double acc = accumulate ? static_cast<double>(ld(out + h)) : 0.0;
  for (std::int64_t r = 0; r < rows; ++r) acc += static_cast<double>(part[r * heads + h]);
  st(out + h, static_cast<A>(acc));
}
template <class A>
void reduce_heads(Tensor* out, const A* part, std::int64_t rows, std::int64_t heads, bool accumulate) {
  if (!out) return;
  HCP_CUDA_DISPATCH(
      *out, { reduce_heads_k<S, A><<<blocks_for(heads, 128), 128>>>(dptr<S>(*out), part, rows, heads, accumulate); });
  check_launch("ssd per-head reduction");
}
template <class A>
void reduce_heads(Tensor* out, const A* part, const SsdParams& p, bool accumulate) {
  reduce_heads(out, part, p.batch, p.heads, accumulate);
}
// The exec of the chunked element functions: one thread per element; scratch from the stream-ordered
// allocator, freed when the exec goes (after the work it was used by).
template <class F>
__global__ void each_k(F f, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) f(i);
}
struct CudaExec {
  std::vector<void*> bufs;
  bool tc = false;  // every phase on the tensor cores (kernels/cuda/ssd/ssd_tc.cu), decided once per call
  ssd_tc::Scratch scratch{
      [this](std::size_t n) { return static_cast<void*>(alloc<unsigned char>(static_cast<std::int64_t>(n))); }};
  explicit CudaExec(bool use_tc = false) : tc(use_tc) {}
  CudaExec(const CudaExec&) = delete;
  CudaExec& operator=(const CudaExec&) = delete;
  ~CudaExec() {
    for (void* q : bufs) cudaFreeAsync(q, 0);
  }
  template <class T>
  T* alloc(std::int64_t n) {
    void* q = nullptr;
    HCP_CUDA_CHECK(cudaMallocAsync(&q, static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(T), 0));
    bufs.push_back(q);
    return static_cast<T*>(q);
  }
  template <class F>
  void run(std::int64_t n, const F& f) {
    if (n <= 0) return;
    each_k<F><<<blocks_for(n, 256), 256>>>(f, n);
    check_launch("ssd (chunked)");
  }
  template <class S, class A>
  bool replace(ssdc::Phase ph, const ssdc::BwdCtx<S, A>& q, const ssdc::Io<S, A>& io) {
    if constexpr (std::is_same_v<S, __nv_bfloat16> && std::is_same_v<A, float>) {
      if (tc) ssd_tc::run(ph, q, io, scratch);
      return tc;
    } else {
      return false;
    }
  }
};
// Whether a call's phases all run on the tensor cores: bf16, sizes ssd_tc covers, 16-byte aligned tensors.
template <class S>
bool use_tc(const ssdc::Dims& d, std::initializer_list<const Tensor*> ts) {
  if constexpr (!std::is_same_v<S, __nv_bfloat16>) {
    return false;
  } else {
    bool ok = ssd_tc::covers(d);
    for (const Tensor* t : ts) ok = ok && (!t || aligned16(t->raw()));
    return ok;
  }
}
ssdc::Dims chunk_dims(const SsdParams& p, bool init) {
  return {p.batch,       p.seqlen,  p.heads,  p.head_dim,
          p.groups,      p.d_state, p.chunk,  (p.seqlen + p.chunk - 1) / p.chunk,
          p.dt_softplus, p.dt_min,  p.dt_max, init};
}
template <class S>
ssdc::In<S> chunk_in(const SsdInputs& in, const std::int64_t* seq) {
  auto opt = [](const Tensor* t) { return t ? dptr<S>(*t) : nullptr; };
  return {dptr<S>(*in.x),  dptr<S>(*in.dt),     dptr<S>(*in.A_log),
          dptr<S>(*in.Bm), dptr<S>(*in.Cm),     opt(in.D),
          opt(in.dt_bias), opt(in.init_states), seq};
}
}  // namespace

void ssd_fwd(Tensor& y, Tensor* final_states, const SsdInputs& in, const SsdParams& p) {
  check_inputs(in, {&y, final_states}, "ssd_fwd");
  DeviceIndex seq(in.seq_idx);
  const ssdc::Dims d = chunk_dims(p, in.init_states != nullptr);
  HCP_CUDA_DISPATCH(*in.x, {
    using A = typename Acc<S>::type;
    CudaExec ex(use_tc<S>(d, {in.x, in.Bm, in.Cm, in.init_states, &y, final_states}));
    ssdc::forward<A>(ex, chunk_in<S>(in, seq.p), d, dptr<S>(y), final_states ? dptr<S>(*final_states) : nullptr);
  });
}

void ssd_bwd(const SsdGrads& g, const SsdInputs& in, const Tensor& dy, const Tensor* dfinal, const SsdParams& p) {
  check_inputs(in, {g.dx, g.ddt, g.dB, g.dC, g.dinit_states, &dy, dfinal}, "ssd_bwd");
  check_head_sums(in, {g.dA_log, g.dD, g.ddt_bias}, "ssd_bwd");
  HCP_CHECK(g.dx && g.ddt && g.dB && g.dC, "ssd_bwd: dx, ddt, dB and dC are required");
  HCP_CHECK(!g.dinit_states || in.init_states, "ssd_bwd: dinit_states requested without init_states");
  DeviceIndex seq(in.seq_idx);
  const ssdc::Dims d = chunk_dims(p, in.init_states != nullptr);
  HCP_CUDA_DISPATCH(*in.x, {
    using A = typename Acc<S>::type;
    CudaExec ex(use_tc<S>(d, {in.x, in.Bm, in.Cm, in.init_states, &dy, dfinal, g.dx, g.dB, g.dC, g.dinit_states}));
    const ssdc::Partials<A> part = ssdc::backward<A>(
        ex, chunk_in<S>(in, seq.p), d, dptr<S>(dy), dfinal ? dptr<S>(*dfinal) : nullptr, dptr<S>(*g.dx),
        dptr<S>(*g.ddt), dptr<S>(*g.dB), dptr<S>(*g.dC), g.dinit_states ? dptr<S>(*g.dinit_states) : nullptr);
    reduce_heads(g.dA_log, part.dA_log, d.B * d.nch, d.H, false);
    if (in.D) reduce_heads(g.dD, part.dD, d.B * d.nch, d.H, false);
    if (in.dt_bias) reduce_heads(g.ddt_bias, part.ddt_bias, d.B * d.nch, d.H, false);
  });
}

void ssd_run_decay(Tensor& decay, const SsdInputs& in, const SsdParams& p) {
  check_inputs(in, {&decay}, "ssd_run_decay");
  const Dims d = dims_of(p);
  HCP_CUDA_DISPATCH(*in.x, {
    using A = typename Acc<S>::type;
    decay_k<S, A><<<static_cast<unsigned>(d.B * d.H), kThreads>>>(dptr<S>(decay), ptrs_of<S>(in, nullptr), d);
  });
  check_launch("ssd_run_decay");
}

void ssd_init_state_fwd(Tensor& y, const SsdInputs& in, const SsdParams& p) {
  check_inputs(in, {&y}, "ssd_init_state_fwd");
  const Dims d = dims_of(p);
  if (d.B * d.L * d.H * d.P == 0) return;
  HCP_CUDA_DISPATCH(*in.x, {
    using A = typename Acc<S>::type;
    CudaExec ex;
    A* cs = ex.alloc<A>(d.B * d.H * d.L);
    const Ptrs<S> ptr = ptrs_of<S>(in, nullptr);
    cumdt_k<S, A><<<static_cast<unsigned>(d.B * d.H), kThreads>>>(cs, ptr, d);
    const std::int64_t tc = init_chunk<S, A>(d);
    A* W = ex.alloc<A>(tc * d.H * d.P);
    for (std::int64_t b = 0; b < d.B; ++b)
      for (std::int64_t t0 = 0; t0 < d.L; t0 += tc) {
        const std::int64_t n = std::min(tc, d.L - t0);
        init_products<S, A>(W, ptr, d, b, t0, n);
        init_apply_k<S, A><<<blocks_for(n * d.H * d.P, kThreads), kThreads>>>(dptr<S>(y), W, cs, d, b, t0, n);
      }
  });
  check_launch("ssd_init_state_fwd");
}

void ssd_init_state_bwd(const SsdStateGrads& g, const SsdInputs& in, const Tensor* dy, const Tensor* ddecay,
                        const SsdParams& p) {
  check_inputs(in, {g.dC, g.ddt, g.dinit_states, dy, ddecay}, "ssd_init_state_bwd");
  check_head_sums(in, {g.dA_log, g.ddt_bias}, "ssd_init_state_bwd");
  if (!dy && !ddecay) return;  // no term depends on the initial state or the decay
  const Dims d = dims_of(p);
  HCP_CUDA_DISPATCH(*in.x, {
    using A = typename Acc<S>::type;
    CudaExec ex;
    A *dA = ex.alloc<A>(d.B * d.H), *ddtb = ex.alloc<A>(d.B * d.H);
    const Ptrs<S> ptr = ptrs_of<S>(in, nullptr);
    const auto BH = static_cast<unsigned>(d.B * d.H);
    if (!dy) {  // the decay's gradient alone
      decay_bwd_k<S, A><<<BH, kThreads>>>(dptr<S>(*g.ddt), dA, ddtb, dptr<S>(*ddecay), ptr, d);
    } else {
      const std::int64_t PN = d.P * d.N, K1 = d.H / d.G * d.P, tc = init_chunk<S, A>(d);
      A *cs = ex.alloc<A>(d.B * d.H * d.L), *dcs = ex.alloc<A>(d.B * d.H * d.L), *W = ex.alloc<A>(tc * d.H * d.P),
        *dS0 = ex.alloc<A>(d.B * d.H * PN);
      S* ey = ex.alloc<S>(tc * d.H * d.P);
      S* dC = dptr<S>(*g.dC);
      cumdt_k<S, A><<<BH, kThreads>>>(cs, ptr, d);
      for (std::int64_t b = 0; b < d.B; ++b)
        for (std::int64_t t0 = 0; t0 < d.L; t0 += tc) {
          const std::int64_t n = std::min(tc, d.L - t0);
          init_products<S, A>(W, ptr, d, b, t0, n);
          init_dy_k<S, A><<<blocks_for(n * d.H * 32, kThreads), kThreads>>>(ey, dcs, dptr<S>(*dy), W, cs, d, b, t0, n);
          // dS0_g (col-major N x K1, ld N) (+)= C_g^T (N x n, ld G N) · ey_g (n x K1, stored [n][H P]).
          gemm_batched<S, A, A>(false, true, d.N, K1, n, ptr.Cm + (b * d.L + t0) * d.G * d.N, d.G * d.N, d.N, ey,
                                d.H * d.P, K1, dS0 + b * d.H * PN, d.N, K1 * d.N, d.G, t0 > 0);
          // dC_g (col-major N x n, ld G N) += S0_g^T (N x K1, stored [K1][N]) · ey_g^T (K1 x n).
          gemm_batched<S, S, A>(false, false, d.N, n, K1, ptr.init + b * d.H * PN, d.N, K1 * d.N, ey, d.H * d.P, K1,
                                dC + (b * d.L + t0) * d.G * d.N, d.G * d.N, d.N, d.G, true);
        }
      if (d.L > 0)
        cast_k<S, A><<<blocks_for(d.B * d.H * PN, kThreads), kThreads>>>(dptr<S>(*g.dinit_states), dS0, d.B * d.H * PN);
      else
        HCP_CUDA_CHECK(cudaMemsetAsync(g.dinit_states->raw(), 0, g.dinit_states->nbytes(), 0));
      init_dt_k<S, A>
          <<<BH, kThreads>>>(dptr<S>(*g.ddt), dA, ddtb, dcs, cs, ddecay ? dptr<S>(*ddecay) : nullptr, ptr, d);
    }
    check_launch("ssd_init_state_bwd");
    reduce_heads(g.dA_log, dA, p, true);
    if (in.dt_bias) reduce_heads(g.ddt_bias, ddtb, p, true);
  });
}

namespace {
// One thread per (sequence, h*PN + e), sequential over the sequence's runs.
template <class T>
__global__ void scan_fwd_k(T* Sin, const T* S, const T* a, const std::int64_t* order, const std::int64_t* off,
                           std::int64_t nseq, std::int64_t H, std::int64_t PN) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nseq * H * PN) return;
  const std::int64_t q = i / (H * PN), he = i % (H * PN), h = he / PN;
  T run = 0;
  for (std::int64_t k = off[q]; k < off[q + 1]; ++k) {
    const std::int64_t sl = order[k];
    Sin[sl * H * PN + he] = run;
    run = a[sl * H + h] * run + S[sl * H * PN + he];
  }
}
template <class T>
__global__ void scan_bwd_k(T* dS, const T* dSin, const T* a, const std::int64_t* order, const std::int64_t* off,
                           std::int64_t nseq, std::int64_t H, std::int64_t PN) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nseq * H * PN) return;
  const std::int64_t q = i / (H * PN), he = i % (H * PN), h = he / PN;
  T g = 0;  // the last run's final state feeds nothing
  for (std::int64_t k = off[q + 1] - 1; k >= off[q]; --k) {
    const std::int64_t sl = order[k];
    dS[sl * H * PN + he] = g;
    g = dSin[sl * H * PN + he] + a[sl * H + h] * g;
  }
}
// da[slot, h] = <dS, Sin> over P*N, one block per (named slot, h): strided partial sums, then the
// block's fixed-order reduction.
template <class T>
__global__ void scan_da_k(T* da, const T* dS, const T* Sin, const std::int64_t* order, std::int64_t H,
                          std::int64_t PN) {
  const std::int64_t sl = order[blockIdx.x / H], h = blockIdx.x % H, base = (sl * H + h) * PN;
  T acc = 0;
  for (std::int64_t e = threadIdx.x; e < PN; e += blockDim.x) acc += dS[base + e] * Sin[base + e];
  acc = block_sum(acc);
  if (threadIdx.x == 0) da[sl * H + h] = acc;
}
void require_float_states(const Tensor& t, const char* what) {
  require_cuda(t, what);
  HCP_CHECK(t.dtype() == DType::F64 || t.dtype() == DType::F32, what, ": states must be fp32 or fp64");
}
// Composition of the scan's affine maps: B first (it reads A), then A.
template <class T>
__global__ void compose_b_k(T* B, const T* A, const T* B_prev, std::int64_t n, std::int64_t PN) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) B[i] = A[i / PN] * B_prev[i] + B[i];
}
template <class T>
__global__ void compose_a_k(T* A, const T* A_prev, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) A[i] *= A_prev[i];
}
// One warp per (row, head): the dot product over P*N in a fixed order (deterministic).
template <class T>
__global__ void state_dot_k(T* da, const T* G, const T* X, std::int64_t rh, std::int64_t PN) {
  const std::int64_t w = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (w >= rh) return;
  T acc = 0;
  for (std::int64_t e = lane; e < PN; e += 32) acc += G[w * PN + e] * X[w * PN + e];
  for (int o = 16; o > 0; o /= 2) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if (lane == 0) da[w] = acc;
}
}  // namespace

void ssd_step(Tensor& y, Tensor& state, const SsdInputs& in, const SsdParams& p) {
  check_inputs(in, {&y}, "ssd_step");
  require_cuda(state, "ssd_step");
  const Dims d = dims_of(p);
  HCP_CUDA_DISPATCH(*in.x, {
    using A = typename Acc<S>::type;
    ssd_step_k<S, A>
        <<<static_cast<unsigned>(d.B * d.H), kThreads>>>(dptr<S>(y), dptr<A>(state), ptrs_of<S>(in, nullptr), d);
  });
  check_launch("ssd_step");
}

void ssd_state_compose(Tensor& A, Tensor& B, const Tensor& A_prev, const Tensor& B_prev) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&A, &B, &A_prev, &B_prev})
    require_float_states(*t, "ssd_state_compose");
  const std::int64_t n = B.numel(), rh = A.numel(), PN = rh ? n / rh : 0;
  if (n == 0) return;
  const auto run = [&](auto zero) {
    using S = decltype(zero);
    compose_b_k<S><<<blocks_for(n, 256), 256>>>(dptr<S>(B), dptr<S>(A), dptr<S>(B_prev), n, PN);
    compose_a_k<S><<<blocks_for(rh, 256), 256>>>(dptr<S>(A), dptr<S>(A_prev), rh);
  };
  if (B.dtype() == DType::F64)
    run(0.0);
  else
    run(0.0f);
  check_launch("ssd_state_compose");
}

void ssd_state_dot(Tensor& da, const Tensor& G, const Tensor& X) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&da, &G, &X}) require_float_states(*t, "ssd_state_dot");
  const std::int64_t rh = da.numel(), PN = rh ? G.numel() / rh : 0;
  if (rh == 0) return;
  const auto run = [&](auto zero) {
    using S = decltype(zero);
    state_dot_k<S><<<blocks_for(rh * 32, 256), 256>>>(dptr<S>(da), dptr<S>(G), dptr<S>(X), rh, PN);
  };
  if (G.dtype() == DType::F64)
    run(0.0);
  else
    run(0.0f);
  check_launch("ssd_state_dot");
}

void ssd_state_scan_fwd(Tensor& Sin, const Tensor& S, const Tensor& a, const std::vector<std::int64_t>& order,
                        const std::vector<std::int64_t>& off) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&Sin, &S, &a})
    require_float_states(*t, "ssd_state_scan_fwd");
  if (order.empty()) return;
  DeviceIndex o(&order), f(&off);
  const std::int64_t nseq = static_cast<std::int64_t>(off.size()) - 1, H = S.size(1), PN = S.size(2) * S.size(3);
  if (S.dtype() == DType::F64)
    scan_fwd_k<double><<<blocks_for(nseq * H * PN, 256), 256>>>(dptr<double>(Sin), dptr<double>(S), dptr<double>(a),
                                                                o.p, f.p, nseq, H, PN);
  else
    scan_fwd_k<float><<<blocks_for(nseq * H * PN, 256), 256>>>(dptr<float>(Sin), dptr<float>(S), dptr<float>(a), o.p,
                                                               f.p, nseq, H, PN);
  check_launch("ssd_state_scan_fwd");
}

void ssd_state_scan_bwd(Tensor& dS, Tensor& da, const Tensor& dSin, const Tensor& Sin, const Tensor& a,
                        const std::vector<std::int64_t>& order, const std::vector<std::int64_t>& off) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dS, &da, &dSin, &Sin, &a})
    require_float_states(*t, "ssd_state_scan_bwd");
  if (order.empty()) return;
  DeviceIndex o(&order), f(&off);
  const std::int64_t nseq = static_cast<std::int64_t>(off.size()) - 1, H = Sin.size(1), PN = Sin.size(2) * Sin.size(3),
                     n = static_cast<std::int64_t>(order.size());
  const auto run = [&](auto zero) {
    using S = decltype(zero);
    scan_bwd_k<S>
        <<<blocks_for(nseq * H * PN, 256), 256>>>(dptr<S>(dS), dptr<S>(dSin), dptr<S>(a), o.p, f.p, nseq, H, PN);
    scan_da_k<S><<<static_cast<unsigned>(n * H), 256>>>(dptr<S>(da), dptr<S>(dS), dptr<S>(Sin), o.p, H, PN);
  };
  if (Sin.dtype() == DType::F64)
    run(0.0);
  else
    run(0.0f);
  check_launch("ssd_state_scan_bwd");
}

}  // namespace hcp::kernels::cuda_impl
