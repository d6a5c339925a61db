// Mamba2 SSD scan on the host: chunked (state-space duality) forward, sequential oracle, and the
// backward (chunk-boundary states recomputed, each chunk reversed token by token).
//   dt_t = clamp(softplus(dt_raw + dt_bias)), A = -exp(A_log), a_t = exp(dt_t A)
//   S_t = a_t S_{t-1} + dt_t x_t B_t^T  (P x N),   y_t = C_t . S_t + D x_t
// seq_idx resets S where it changes; init_states is the state before token 0.
#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/host/common.hpp"
#include "kernels/host/host_kernels.hpp"
#include "kernels/kernels.hpp"
#include "kernels/shape_rules.hpp"

namespace hcp::kernels {
using rules::check_ssd;
namespace {

using host::In;
using host::Out;
using host::Range;

// Typed pointers to all inputs plus the effective dt and its derivative factor.
template <class T>
struct SsdData {
  In<T> x, dt, A_log, Bm, Cm;
  std::vector<T> D, dt_bias, init;
  std::vector<T> dte, ddte;  // effective dt [B,L,H] and d dt_eff / d dt_raw
  const std::vector<std::int64_t>* seq;
  SsdParams p;

  SsdData(const SsdInputs& in, const SsdParams& pp)
      : x(*in.x, "x"),
        dt(*in.dt, "dt"),
        A_log(*in.A_log, "A_log"),
        Bm(*in.Bm, "B"),
        Cm(*in.Cm, "C"),
        seq(in.seq_idx),
        p(pp) {
    D.assign(static_cast<std::size_t>(p.heads), T(0));
    dt_bias.assign(static_cast<std::size_t>(p.heads), T(0));
    if (in.D) {
      In<T> d(*in.D);
      D.assign(d.get(), d.get() + p.heads);
    }
    if (in.dt_bias) {
      In<T> d(*in.dt_bias);
      dt_bias.assign(d.get(), d.get() + p.heads);
    }
    if (in.init_states) {
      In<T> s(*in.init_states);
      init.assign(s.get(), s.get() + in.init_states->numel());
    }
    const std::int64_t n = p.batch * p.seqlen * p.heads;
    dte.resize(static_cast<std::size_t>(n));
    ddte.resize(static_cast<std::size_t>(n));
    Kokkos::parallel_for("ssd_dt", Range(0, n), [&](std::int64_t i) {
      const T u = dt.get()[i] + dt_bias[static_cast<std::size_t>(i % p.heads)];
      T v = p.dt_softplus ? host::softplus(u) : u;
      T dv = p.dt_softplus ? host::sigmoid(u) : T(1);
      if (v < static_cast<T>(p.dt_min)) v = static_cast<T>(p.dt_min), dv = 0;
      if (v > static_cast<T>(p.dt_max)) v = static_cast<T>(p.dt_max), dv = 0;
      dte[static_cast<std::size_t>(i)] = v;
      ddte[static_cast<std::size_t>(i)] = dv;
    });
  }
  std::int64_t sidx(std::int64_t b, std::int64_t t) const { return seq ? (*seq)[b * p.seqlen + t] : 0; }
  T A(std::int64_t h) const { return -std::exp(A_log.get()[h]); }
  T dt_at(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return dte[static_cast<std::size_t>((b * p.seqlen + t) * p.heads + h)];
  }
  const T* xr(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return x.get() + ((b * p.seqlen + t) * p.heads + h) * p.head_dim;
  }
  std::int64_t group_of(std::int64_t h) const { return h / (p.heads / p.groups); }
  const T* Br(std::int64_t b, std::int64_t t, std::int64_t g) const {
    return Bm.get() + ((b * p.seqlen + t) * p.groups + g) * p.d_state;
  }
  const T* Cr(std::int64_t b, std::int64_t t, std::int64_t g) const {
    return Cm.get() + ((b * p.seqlen + t) * p.groups + g) * p.d_state;
  }
  // Initial state of (b,h) or nullptr for zero.
  const T* init_of(std::int64_t b, std::int64_t h) const {
    return init.empty() ? nullptr : init.data() + (b * p.heads + h) * p.head_dim * p.d_state;
  }
};

// One step of the recurrence: S <- a S + dt x B^T (reset first when `reset`).
template <class T>
void state_step(std::vector<T>& S, const SsdData<T>& d, std::int64_t b, std::int64_t t, std::int64_t h, bool reset) {
  const std::int64_t P = d.p.head_dim, N = d.p.d_state;
  const T dt = d.dt_at(b, t, h), a = std::exp(dt * d.A(h));
  const T* x = d.xr(b, t, h);
  const T* Bv = d.Br(b, t, d.group_of(h));
  for (std::int64_t pi = 0; pi < P; ++pi)
    for (std::int64_t n = 0; n < N; ++n) {
      T& s = S[static_cast<std::size_t>(pi * N + n)];
      s = (reset ? T(0) : a * s) + dt * x[pi] * Bv[n];
    }
}

template <class T>
void sequential_impl(T* y, T* fin, const SsdData<T>& d) {
  const auto& p = d.p;
  const std::int64_t P = p.head_dim, N = p.d_state;
  Kokkos::parallel_for("ssd_sequential", Range(0, p.batch * p.heads), [&](std::int64_t w) {
    const std::int64_t b = w / p.heads, h = w % p.heads, g = d.group_of(h);
    std::vector<T> S(static_cast<std::size_t>(P * N), T(0));
    if (auto s0 = d.init_of(b, h)) std::copy(s0, s0 + P * N, S.begin());
    for (std::int64_t t = 0; t < p.seqlen; ++t) {
      const bool reset = t > 0 && d.sidx(b, t) != d.sidx(b, t - 1);
      state_step(S, d, b, t, h, reset);
      const T* C = d.Cr(b, t, g);
      const T* x = d.xr(b, t, h);
      T* yr = y + ((b * p.seqlen + t) * p.heads + h) * P;
      for (std::int64_t pi = 0; pi < P; ++pi) {
        T acc = 0;
        for (std::int64_t n = 0; n < N; ++n) acc += C[n] * S[static_cast<std::size_t>(pi * N + n)];
        yr[pi] = acc + d.D[static_cast<std::size_t>(h)] * x[pi];
      }
    }
    if (fin) std::copy(S.begin(), S.end(), fin + (b * p.heads + h) * P * N);
  });
}

template <class T>
void chunked_impl(T* y, T* fin, const SsdData<T>& d) {
  const auto& p = d.p;
  const std::int64_t P = p.head_dim, N = p.d_state, Q = p.chunk;
  Kokkos::parallel_for("ssd_chunked", Range(0, p.batch * p.heads), [&](std::int64_t w) {
    const std::int64_t b = w / p.heads, h = w % p.heads, g = d.group_of(h);
    const T A = d.A(h);
    std::vector<T> S(static_cast<std::size_t>(P * N), T(0)), Snew(S.size());
    if (auto s0 = d.init_of(b, h)) std::copy(s0, s0 + P * N, S.begin());
    std::vector<T> cum(static_cast<std::size_t>(Q)), cb(static_cast<std::size_t>(Q * Q));
    for (std::int64_t c0 = 0; c0 < p.seqlen; c0 += Q) {
      const std::int64_t c1 = std::min(p.seqlen, c0 + Q), len = c1 - c0;
      const std::int64_t prev_seq = c0 == 0 ? d.sidx(b, 0) : d.sidx(b, c0 - 1);
      T run = 0;
      for (std::int64_t i = 0; i < len; ++i) cum[static_cast<std::size_t>(i)] = (run += d.dt_at(b, c0 + i, h) * A);
      // C_i . B_j for the chunk (the "attention-like" intra-chunk matrix), masked by causality and seq_idx.
      for (std::int64_t i = 0; i < len; ++i)
        for (std::int64_t j = 0; j <= i; ++j) {
          T v = 0;
          if (d.sidx(b, c0 + i) == d.sidx(b, c0 + j)) {
            const T* C = d.Cr(b, c0 + i, g);
            const T* Bv = d.Br(b, c0 + j, g);
            for (std::int64_t n = 0; n < N; ++n) v += C[n] * Bv[n];
            v *= std::exp(cum[static_cast<std::size_t>(i)] - cum[static_cast<std::size_t>(j)]) * d.dt_at(b, c0 + j, h);
          }
          cb[static_cast<std::size_t>(i * Q + j)] = v;
        }
      for (std::int64_t i = 0; i < len; ++i) {
        const std::int64_t t = c0 + i;
        const bool carry = d.sidx(b, t) == prev_seq;
        const T* C = d.Cr(b, t, g);
        const T decay = std::exp(cum[static_cast<std::size_t>(i)]);
        T* yr = y + ((b * p.seqlen + t) * p.heads + h) * P;
        const T* xt = d.xr(b, t, h);
        for (std::int64_t pi = 0; pi < P; ++pi) {
          T acc = 0;
          for (std::int64_t j = 0; j <= i; ++j) acc += cb[static_cast<std::size_t>(i * Q + j)] * d.xr(b, c0 + j, h)[pi];
          if (carry) {
            T cs = 0;
            for (std::int64_t n = 0; n < N; ++n) cs += C[n] * S[static_cast<std::size_t>(pi * N + n)];
            acc += decay * cs;
          }
          yr[pi] = acc + d.D[static_cast<std::size_t>(h)] * xt[pi];
        }
      }
      // State at the chunk end.
      const std::int64_t last = len - 1, last_seq = d.sidx(b, c1 - 1);
      const T cl = cum[static_cast<std::size_t>(last)];
      const T carry_decay = last_seq == prev_seq ? std::exp(cl) : T(0);
      for (std::size_t e = 0; e < S.size(); ++e) Snew[e] = carry_decay * S[e];
      for (std::int64_t j = 0; j < len; ++j) {
        if (d.sidx(b, c0 + j) != last_seq) continue;
        const T wj = std::exp(cl - cum[static_cast<std::size_t>(j)]) * d.dt_at(b, c0 + j, h);
        const T* xj = d.xr(b, c0 + j, h);
        const T* Bj = d.Br(b, c0 + j, g);
        for (std::int64_t pi = 0; pi < P; ++pi)
          for (std::int64_t n = 0; n < N; ++n) Snew[static_cast<std::size_t>(pi * N + n)] += wj * xj[pi] * Bj[n];
      }
      S.swap(Snew);
    }
    if (fin) std::copy(S.begin(), S.end(), fin + (b * p.heads + h) * P * N);
  });
}

template <class T>
void bwd_impl(const SsdGrads& gr, const SsdData<T>& d, const T* dy, const T* dfin, T* dx, T* ddt, T* dB, T* dC,
              T* dinit, std::vector<T>& dA_part, std::vector<T>& dD_part, std::vector<T>& ddtb_part) {
  (void)gr;
  const auto& p = d.p;
  const std::int64_t P = p.head_dim, N = p.d_state, Q = p.chunk, L = p.seqlen, G = p.groups, hpg = p.heads / G;
  const std::int64_t nchunks = (L + Q - 1) / Q;
  // One work item per (b, group): dB and dC of a group are touched only here. Per-head parameter
  // gradients go to per-(b,h) partials and are reduced in a fixed order afterwards.
  Kokkos::parallel_for("ssd_bwd", Range(0, p.batch * G), [&](std::int64_t w) {
    const std::int64_t b = w / G, g = w % G;
    for (std::int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
      const T A = d.A(h), Dh = d.D[static_cast<std::size_t>(h)];
      // Pass A: the state before every chunk (S_{c0-1}, no reset applied).
      std::vector<T> starts(static_cast<std::size_t>(nchunks * P * N), T(0));
      std::vector<T> S(static_cast<std::size_t>(P * N), T(0));
      if (auto s0 = d.init_of(b, h)) std::copy(s0, s0 + P * N, S.begin());
      for (std::int64_t t = 0; t < L; ++t) {
        if (t % Q == 0) std::copy(S.begin(), S.end(), starts.begin() + (t / Q) * P * N);
        state_step(S, d, b, t, h, t > 0 && d.sidx(b, t) != d.sidx(b, t - 1));
      }
      // Pass B: chunks in reverse; recompute the chunk's states, then reverse token by token.
      std::vector<T> dS(static_cast<std::size_t>(P * N), T(0));
      if (dfin) std::copy(dfin + (b * p.heads + h) * P * N, dfin + (b * p.heads + h + 1) * P * N, dS.begin());
      std::vector<T> states(static_cast<std::size_t>(Q * P * N));
      // Per-head parameter gradients sum over every token: fp64 accumulators keep their error at
      // the inputs' rounding, whatever the sequence length (an fp32 sum drifts as ~sqrt(L) ulp).
      double dA = 0, dDh = 0, ddtb = 0;
      for (std::int64_t c = nchunks - 1; c >= 0; --c) {
        const std::int64_t c0 = c * Q, c1 = std::min(L, c0 + Q);
        std::copy(starts.begin() + c * P * N, starts.begin() + (c + 1) * P * N, S.begin());
        for (std::int64_t t = c0; t < c1; ++t) {
          state_step(S, d, b, t, h, t > 0 && d.sidx(b, t) != d.sidx(b, t - 1));
          std::copy(S.begin(), S.end(), states.begin() + (t - c0) * P * N);
        }
        for (std::int64_t t = c1 - 1; t >= c0; --t) {
          const T* St = states.data() + (t - c0) * P * N;
          const bool reset = t > 0 && d.sidx(b, t) != d.sidx(b, t - 1);
          const T* Sprev = nullptr;  // S_{t-1} as used by step t (nullptr: zero)
          if (!reset) {
            if (t > c0)
              Sprev = states.data() + (t - 1 - c0) * P * N;
            else if (t > 0 || !d.init.empty())
              Sprev = starts.data() + c * P * N;
          }
          const T* Ct = d.Cr(b, t, g);
          const T* Bt = d.Br(b, t, g);
          const T* xt = d.xr(b, t, h);
          const T* dyt = dy + ((b * L + t) * p.heads + h) * P;
          T* dxt = dx + ((b * L + t) * p.heads + h) * P;
          T* dCt = dC + ((b * L + t) * G + g) * N;
          T* dBt = dB + ((b * L + t) * G + g) * N;
          // y_t = C_t . S_t + D x_t
          for (std::int64_t pi = 0; pi < P; ++pi) {
            dDh += dyt[pi] * xt[pi];
            dxt[pi] = Dh * dyt[pi];
            for (std::int64_t n = 0; n < N; ++n) {
              dCt[n] += dyt[pi] * St[pi * N + n];
              dS[static_cast<std::size_t>(pi * N + n)] += dyt[pi] * Ct[n];
            }
          }
          // S_t = a S_{t-1} + dt x_t B_t^T
          const T dt = d.dt_at(b, t, h), a = std::exp(dt * A);
          T ddt_t = 0, da = 0;
          for (std::int64_t pi = 0; pi < P; ++pi)
            for (std::int64_t n = 0; n < N; ++n) {
              const T g_ = dS[static_cast<std::size_t>(pi * N + n)];
              dxt[pi] += dt * g_ * Bt[n];
              dBt[n] += dt * g_ * xt[pi];
              ddt_t += g_ * xt[pi] * Bt[n];
              if (Sprev) da += g_ * Sprev[pi * N + n];
            }
          ddt_t += da * a * A;
          dA += da * a * dt;
          if (t == 0 && dinit) {
            T* di = dinit + (b * p.heads + h) * P * N;
            for (std::int64_t e = 0; e < P * N; ++e) di[e] = a * dS[static_cast<std::size_t>(e)];
          }
          if (reset)
            std::fill(dS.begin(), dS.end(), T(0));
          else
            for (auto& v : dS) v *= a;
          const std::size_t k = static_cast<std::size_t>((b * L + t) * p.heads + h);
          const T graw = ddt_t * d.ddte[k];
          ddt[k] = graw;
          ddtb += graw;
        }
      }
      dA_part[static_cast<std::size_t>(b * p.heads + h)] = static_cast<T>(dA * A);  // dA/dA_log = A
      dD_part[static_cast<std::size_t>(b * p.heads + h)] = static_cast<T>(dDh);
      ddtb_part[static_cast<std::size_t>(b * p.heads + h)] = static_cast<T>(ddtb);
    }
  });
}

// Cumulative decay exponents cs_t = A sum_{s<=t} dt_s of one (b, h) run.
template <class T>
void run_cumsum(std::vector<T>& cs, const SsdData<T>& d, std::int64_t b, std::int64_t h) {
  const T A = d.A(h);
  T run = 0;
  for (std::int64_t t = 0; t < d.p.seqlen; ++t) cs[static_cast<std::size_t>(t)] = (run += d.dt_at(b, t, h) * A);
}

template <class T>
void init_state_fwd_impl(T* y, const SsdData<T>& d) {
  const auto& p = d.p;
  const std::int64_t P = p.head_dim, N = p.d_state, L = p.seqlen;
  Kokkos::parallel_for("ssd_init_state_fwd", Range(0, p.batch * p.heads), [&](std::int64_t w) {
    const std::int64_t b = w / p.heads, h = w % p.heads, g = d.group_of(h);
    const T* S = d.init_of(b, h);
    std::vector<T> cs(static_cast<std::size_t>(L));
    run_cumsum(cs, d, b, h);
    for (std::int64_t t = 0; t < L; ++t) {
      const T e = std::exp(cs[static_cast<std::size_t>(t)]);
      const T* C = d.Cr(b, t, g);
      T* yr = y + ((b * L + t) * p.heads + h) * P;
      for (std::int64_t pi = 0; pi < P; ++pi) {
        T acc = 0;
        for (std::int64_t n = 0; n < N; ++n) acc += C[n] * S[pi * N + n];
        yr[pi] += e * acc;
      }
    }
  });
}

template <class T>
void init_state_bwd_impl(const SsdData<T>& d, const T* dy, const T* ddecay, T* dC, T* ddt, T* dinit,
                         std::vector<T>& dA_part, std::vector<T>& ddtb_part) {
  const auto& p = d.p;
  const std::int64_t P = p.head_dim, N = p.d_state, L = p.seqlen, G = p.groups, hpg = p.heads / G;
  // One work item per (b, group): dC of a group is touched only there.
  Kokkos::parallel_for("ssd_init_state_bwd", Range(0, p.batch * G), [&](std::int64_t w) {
    const std::int64_t b = w / G, g = w % G;
    std::vector<T> cs(static_cast<std::size_t>(L)), dcs(static_cast<std::size_t>(L));
    for (std::int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
      const T A = d.A(h);
      run_cumsum(cs, d, b, h);
      std::fill(dcs.begin(), dcs.end(), T(0));
      if (dy) {
        const T* S = d.init_of(b, h);
        T* dS = dinit + (b * p.heads + h) * P * N;
        std::fill(dS, dS + P * N, T(0));
        for (std::int64_t t = 0; t < L; ++t) {
          const T e = std::exp(cs[static_cast<std::size_t>(t)]);
          const T* C = d.Cr(b, t, g);
          const T* dyt = dy + ((b * L + t) * p.heads + h) * P;
          T* dCt = dC + ((b * L + t) * G + g) * N;
          T dc = 0;
          for (std::int64_t pi = 0; pi < P; ++pi) {
            T u = 0;
            for (std::int64_t n = 0; n < N; ++n) {
              u += S[pi * N + n] * C[n];
              dCt[n] += e * dyt[pi] * S[pi * N + n];
              dS[pi * N + n] += e * dyt[pi] * C[n];
            }
            dc += dyt[pi] * u;
          }
          dcs[static_cast<std::size_t>(t)] = e * dc;
        }
      }
      if (ddecay && L > 0)
        dcs[static_cast<std::size_t>(L - 1)] += ddecay[b * p.heads + h] * std::exp(cs[static_cast<std::size_t>(L - 1)]);
      // cs_t = A sum_{s<=t} dt_s: d dt_s = A sum_{t>=s} dcs_t, dA = sum_t dcs_t cs_t / A.
      // Sums over every token in fp64, as in bwd_impl.
      double acc = 0, dA = 0, ddtb = 0;
      for (std::int64_t t = L - 1; t >= 0; --t) {
        acc += dcs[static_cast<std::size_t>(t)];
        dA += acc * d.dt_at(b, t, h);
        const std::size_t k = static_cast<std::size_t>((b * L + t) * p.heads + h);
        const T graw = static_cast<T>(A * acc * d.ddte[k]);
        ddt[k] += graw;
        ddtb += graw;
      }
      dA_part[static_cast<std::size_t>(b * p.heads + h)] = static_cast<T>(dA * A);  // dA/dA_log = A
      ddtb_part[static_cast<std::size_t>(b * p.heads + h)] = static_cast<T>(ddtb);
    }
  });
}

// out[h] (+)= sum over b of part[b*H + h], in a fixed order.
template <class T>
void reduce_heads(Tensor* out, const std::vector<T>& part, const SsdParams& p, bool accumulate) {
  if (!out) return;
  host::require_numel(*out, p.heads, "ssd: per-head gradient");
  for (std::int64_t h = 0; h < p.heads; ++h) {
    double acc = accumulate ? out->get(h) : 0.0;
    for (std::int64_t b = 0; b < p.batch; ++b)
      acc += static_cast<double>(part[static_cast<std::size_t>(b * p.heads + h)]);
    out->set(h, acc);
  }
}

}  // namespace

void host::ssd_fwd(Tensor& y, Tensor* final_states, const SsdInputs& in, const SsdParams& p) {
  HCP_DISPATCH_FLOAT(*in.x, {
    SsdData<T> d(in, p);
    Out<T> y_(y, "y");
    if (final_states) {
      Out<T> f_(*final_states, "final_states");
      chunked_impl<T>(y_, f_, d);
    } else {
      chunked_impl<T>(y_, nullptr, d);
    }
  });
}

void ssd_sequential_fwd(Tensor& y, Tensor* final_states, const SsdInputs& in, const SsdParams& p) {
  check_ssd(in, p);
  host::require_numel(y, in.x->numel(), "ssd_sequential_fwd: y");
  HCP_DISPATCH_FLOAT(*in.x, {
    SsdData<T> d(in, p);
    Out<T> y_(y, "y");
    if (final_states) {
      Out<T> f_(*final_states, "final_states");
      sequential_impl<T>(y_, f_, d);
    } else {
      sequential_impl<T>(y_, nullptr, d);
    }
  });
}

void host::ssd_step(Tensor& y, Tensor& state, const SsdInputs& in, const SsdParams& p) {
  SsdInputs from = in;
  from.init_states = &state;  // SsdData copies it, so the recurrence may write the state in place
  HCP_DISPATCH_FLOAT(*in.x, {
    SsdData<T> d(from, p);
    Out<T> y_(y, "y"), s_(state, "state");
    sequential_impl<T>(y_, s_, d);  // the recurrence itself, one token
  });
}

void host::ssd_bwd(const SsdGrads& g, const SsdInputs& in, const Tensor& dy, const Tensor* dfinal, const SsdParams& p) {
  HCP_DISPATCH_FLOAT(*in.x, {
    SsdData<T> d(in, p);
    In<T> dy_(dy, "dy");
    Tensor dfin_hold;
    const T* dfin = nullptr;
    if (dfinal) {
      host::require_numel(*dfinal, p.batch * p.heads * p.head_dim * p.d_state, "ssd_bwd: dfinal_states");
      dfin_hold = dfinal->to(dtype_of<T>());
      dfin = dfin_hold.data<T>();
    }
    Tensor dinit_t;
    if (g.dinit_states) dinit_t = Tensor::zeros(g.dinit_states->shape(), dtype_of<T>(), Space::Host);
    Out<T> dx(*g.dx, "dx"), ddt(*g.ddt, "ddt"), dB(*g.dB, "dB"), dC(*g.dC, "dC");
    std::fill(dB.get(), dB.get() + g.dB->numel(), T(0));
    std::fill(dC.get(), dC.get() + g.dC->numel(), T(0));
    const auto nbh = static_cast<std::size_t>(p.batch * p.heads);
    std::vector<T> dA_part(nbh), dD_part(nbh), ddtb_part(nbh);
    bwd_impl<T>(g, d, dy_, dfin, dx, ddt, dB, dC, g.dinit_states ? dinit_t.data<T>() : nullptr, dA_part, dD_part,
                ddtb_part);
    reduce_heads(g.dA_log, dA_part, p, false);
    if (in.D) reduce_heads(g.dD, dD_part, p, false);
    if (in.dt_bias) reduce_heads(g.ddt_bias, ddtb_part, p, false);
    if (g.dinit_states) g.dinit_states->copy_from(dinit_t);
  });
}

void host::ssd_run_decay(Tensor& decay, const SsdInputs& in, const SsdParams& p) {
  HCP_DISPATCH_FLOAT(*in.x, {
    SsdData<T> d(in, p);
    Out<T> a(decay, "decay");
    Kokkos::parallel_for("ssd_run_decay", Range(0, p.batch * p.heads), [&](std::int64_t w) {
      const std::int64_t b = w / p.heads, h = w % p.heads;
      T s = 0;
      for (std::int64_t t = 0; t < p.seqlen; ++t) s += d.dt_at(b, t, h);
      a.get()[w] = std::exp(s * d.A(h));
    });
  });
}

void host::ssd_init_state_fwd(Tensor& y, const SsdInputs& in, const SsdParams& p) {
  HCP_DISPATCH_FLOAT(*in.x, {
    SsdData<T> d(in, p);
    Out<T> y_(y, "y", true);
    init_state_fwd_impl<T>(y_, d);
  });
}

void host::ssd_init_state_bwd(const SsdStateGrads& g, const SsdInputs& in, const Tensor* dy, const Tensor* ddecay,
                              const SsdParams& p) {
  HCP_DISPATCH_FLOAT(*in.x, {
    SsdData<T> d(in, p);
    Tensor dummy = Tensor::zeros({1}, dtype_of<T>(), Space::Host);
    std::unique_ptr<In<T>> dy_, dd_;
    if (dy) dy_ = std::make_unique<In<T>>(*dy, "dy");
    if (ddecay) dd_ = std::make_unique<In<T>>(*ddecay, "ddecay");
    Out<T> ddt(*g.ddt, "ddt", true), dC(g.dC ? *g.dC : dummy, "dC", true),
        dinit(g.dinit_states ? *g.dinit_states : dummy, "dinit_states");
    const auto nbh = static_cast<std::size_t>(p.batch * p.heads);
    std::vector<T> dA_part(nbh, T(0)), ddtb_part(nbh, T(0));
    init_state_bwd_impl<T>(d, dy_ ? dy_->get() : nullptr, dd_ ? dd_->get() : nullptr, dC, ddt, dinit, dA_part,
                           ddtb_part);
    reduce_heads(g.dA_log, dA_part, p, true);
    if (in.dt_bias) reduce_heads(g.ddt_bias, ddtb_part, p, true);
  });
}

namespace {
template <class T>
void scan_fwd(T* Sin, const T* S, const T* a, const std::vector<std::int64_t>& order,
              const std::vector<std::int64_t>& off, std::int64_t H, std::int64_t PN) {
  for (std::size_t q = 0; q + 1 < off.size(); ++q)
    for (std::int64_t k = off[q]; k < off[q + 1]; ++k) {
      T* out = Sin + order[static_cast<std::size_t>(k)] * H * PN;
      if (k == off[q]) {
        std::fill(out, out + H * PN, T(0));
        continue;
      }
      const std::int64_t prev = order[static_cast<std::size_t>(k - 1)];
      const T *sp = Sin + prev * H * PN, *Sk = S + prev * H * PN;
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t e = 0; e < PN; ++e) out[h * PN + e] = a[prev * H + h] * sp[h * PN + e] + Sk[h * PN + e];
    }
}
template <class T>
void scan_bwd(T* dS, T* da, const T* dSin, const T* Sin, const T* a, const std::vector<std::int64_t>& order,
              const std::vector<std::int64_t>& off, std::int64_t H, std::int64_t PN) {
  std::vector<T> G(static_cast<std::size_t>(H * PN));
  for (std::size_t q = 0; q + 1 < off.size(); ++q) {
    std::fill(G.begin(), G.end(), T(0));  // the last run's final state feeds nothing
    for (std::int64_t k = off[q + 1] - 1; k >= off[q]; --k) {
      const std::int64_t sl = order[static_cast<std::size_t>(k)];
      for (std::int64_t h = 0; h < H; ++h) {
        T acc = 0;
        for (std::int64_t e = 0; e < PN; ++e) {
          const std::size_t i = static_cast<std::size_t>(h * PN + e);
          dS[sl * H * PN + h * PN + e] = G[i];  // Sin(k+1) = a_k Sin(k) + S_k
          acc += G[i] * Sin[sl * H * PN + h * PN + e];
          G[i] = dSin[sl * H * PN + h * PN + e] + a[sl * H + h] * G[i];
        }
        da[sl * H + h] = acc;
      }
    }
  }
}
}  // namespace

void host::ssd_state_compose(Tensor& A, Tensor& B, const Tensor& A_prev, const Tensor& B_prev) {
  HCP_DISPATCH_FLOAT(B, {
    In<T> ap(A_prev, "A_prev"), bp(B_prev, "B_prev");
    Out<T> a(A, "A", true), b(B, "B", true);
    T *av = a.get(), *bv = b.get();
    const T *apv = ap.get(), *bpv = bp.get();
    const std::int64_t RH = A.numel(), PN = B.size(2) * B.size(3);
    Kokkos::parallel_for("ssd_state_compose", Range(0, RH), [&](std::int64_t ih) {
      for (std::int64_t e = 0; e < PN; ++e) bv[ih * PN + e] = av[ih] * bpv[ih * PN + e] + bv[ih * PN + e];
      av[ih] *= apv[ih];
    });
  });
}

void host::ssd_state_dot(Tensor& da, const Tensor& G, const Tensor& X) {
  HCP_DISPATCH_FLOAT(G, {
    In<T> g(G, "G"), x(X, "X");
    Out<T> o(da, "da", false);
    T* ov = o.get();
    const T *gv = g.get(), *xv = x.get();
    const std::int64_t RH = da.numel(), PN = G.size(2) * G.size(3);
    Kokkos::parallel_for("ssd_state_dot", Range(0, RH), [&](std::int64_t ih) {
      T acc = 0;
      for (std::int64_t e = 0; e < PN; ++e) acc += gv[ih * PN + e] * xv[ih * PN + e];
      ov[ih] = acc;
    });
  });
}

void host::ssd_state_scan_fwd(Tensor& Sin, const Tensor& S, const Tensor& a, const std::vector<std::int64_t>& order,
                              const std::vector<std::int64_t>& off) {
  HCP_DISPATCH_FLOAT(S, {
    In<T> S_(S, "S"), a_(a, "a");
    Out<T> o(Sin, "Sin", true);
    scan_fwd<T>(o.get(), S_.get(), a_.get(), order, off, S.size(1), S.size(2) * S.size(3));
  });
}

void host::ssd_state_scan_bwd(Tensor& dS, Tensor& da, const Tensor& dSin, const Tensor& Sin, const Tensor& a,
                              const std::vector<std::int64_t>& order, const std::vector<std::int64_t>& off) {
  HCP_DISPATCH_FLOAT(Sin, {
    In<T> g(dSin, "dSin"), s(Sin, "Sin"), a_(a, "a");
    Out<T> o(dS, "dS", true), oa(da, "da", true);
    scan_bwd<T>(o.get(), oa.get(), g.get(), s.get(), a_.get(), order, off, Sin.size(1), Sin.size(2) * Sin.size(3));
  });
}

}  // namespace hcp::kernels
