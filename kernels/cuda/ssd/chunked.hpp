// Mamba2 SSD, chunked (state-space duality) forward and backward, written as element functions
// shared by the CUDA kernels (kernels/cuda/ssd/ssd.cu launches one thread per element) and a host
// emulation that runs the very same functions serially (tests/unit/test_ssd_chunked.cpp checks it
// against the host oracle on every CI run, no GPU needed).
//
// Per batch row, chunk c = tokens [c0, c1), E = c1 - 1, cs_t = sum_{u=c0..t} dt_u A (within chunk):
//   decay s -> t (s <= t, same sequence)     exp(cs_t - cs_s)
//   decay chunk start -> t                   exp(cs_t), if t is in the sequence running into the chunk
//   chunk state   S_c = sum_{s ~ E} exp(cs_E - cs_s) dt_s x_s B_s^T
//   state passing Sin(c+1) = [E ~ prev(c)] exp(cs_E) Sin(c) + S_c,  Sin(0) = initial state or 0
//   chunk scan    y_t = sum_{s <= t, s ~ t} exp(cs_t - cs_s) dt_s (C_t . B_s) x_s
//                       + [t ~ prev(c)] exp(cs_t) C_t . Sin(c) + D x_t
// where s ~ t means "same seq_idx" and prev(c) is the sequence of the token before the chunk (token 0
// for chunk 0, so an initial state belongs to the row's first sequence). The backward runs the same
// terms in reverse: per-chunk local state gradients, a reverse state passing, then dx, dB, dC (each
// owned by one thread, dB/dC summing the heads of their group in order), and per-token dt terms with
// a reverse cumulative sum per chunk for d cs. Per-(batch, chunk, head) partials of dA_log, D and
// dt_bias are summed by the caller in a fixed order: no atomics, bitwise repeatable.
#pragma once
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#endif
#include "kernels/hd.hpp"

namespace hcp::ssdc {
using i64 = std::int64_t;
#ifndef __CUDACC__
using std::exp;
using std::log1p;
#endif

HCP_HD float val(float v) { return v; }
HCP_HD double val(double v) { return v; }
HCP_HD void put(float* p, float v) { *p = v; }
HCP_HD void put(double* p, double v) { *p = v; }
#ifdef __CUDACC__
HCP_HD float val(__nv_bfloat16 v) { return __bfloat162float(v); }
HCP_HD void put(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
#endif

struct Dims {
  i64 B, L, H, P, G, N, Q, nch;
  bool softplus;
  double dt_min, dt_max;
  bool has_init;
  HCP_HD i64 hpg() const { return H / G; }
  HCP_HD i64 PN() const { return P * N; }
  HCP_HD i64 c0(i64 c) const { return c * Q; }
  HCP_HD i64 E(i64 c) const { return (c + 1) * Q < L ? (c + 1) * Q - 1 : L - 1; }
};
template <class S>
struct In {
  const S *x, *dt, *A_log, *Bm, *Cm, *D, *dt_bias, *init;
  const i64* seq;  // [B*L] or nullptr
};
// Scratch of the forward (the backward recomputes it).
template <class A>
struct Work {
  A* dtv;     // [B,H,L] effective dt
  A* ddtv;    // [B,H,L] d dt_eff / d dt_raw
  A* cs;      // [B,H,L] within-chunk cumulative sum of dt A
  A* CB;      // [B,nch,G,Q,Q] C_i . B_j for j <= i (else 0)
  A* states;  // [B,nch,H,P,N] chunk-local states, then (after state passing) the chunk-start states
};

template <class S, class A>
struct Ctx {
  In<S> in;
  Dims d;
  Work<A> w;
  HCP_HD i64 seq(i64 b, i64 t) const { return in.seq ? in.seq[b * d.L + t] : 0; }
  HCP_HD i64 prev_seq(i64 b, i64 c) const { return seq(b, c == 0 ? 0 : d.c0(c) - 1); }
  HCP_HD A Ah(i64 h) const { return -exp(A(val(in.A_log[h]))); }
  // Token t's effective dt for head h (softplus of dt + dt_bias if asked, clamped to [dt_min, dt_max])
  // and its derivative with respect to the raw dt.
  HCP_HD void eff_dt(i64 b, i64 t, i64 h, A& v, A& dv) const {
    const A u = A(val(in.dt[(b * d.L + t) * d.H + h])) + (in.dt_bias ? A(val(in.dt_bias[h])) : A(0));
    v = d.softplus ? (u > A(20) ? u : A(log1p(exp(u)))) : u;
    dv = d.softplus ? A(1) / (A(1) + exp(-u)) : A(1);
    if (v < A(d.dt_min)) v = A(d.dt_min), dv = 0;
    if (v > A(d.dt_max)) v = A(d.dt_max), dv = 0;
  }
  HCP_HD i64 tok(i64 b, i64 h, i64 t) const { return (b * d.H + h) * d.L + t; }  // [B,H,L]
  HCP_HD A xv(i64 b, i64 t, i64 h, i64 p) const { return val(in.x[((b * d.L + t) * d.H + h) * d.P + p]); }
  HCP_HD A Bv(i64 b, i64 t, i64 g, i64 n) const { return val(in.Bm[((b * d.L + t) * d.G + g) * d.N + n]); }
  HCP_HD A Cv(i64 b, i64 t, i64 g, i64 n) const { return val(in.Cm[((b * d.L + t) * d.G + g) * d.N + n]); }
  HCP_HD i64 cb(i64 b, i64 c, i64 g, i64 i, i64 j) const { return (((b * d.nch + c) * d.G + g) * d.Q + i) * d.Q + j; }
  HCP_HD i64 st(i64 b, i64 c, i64 h) const { return ((b * d.nch + c) * d.H + h) * d.PN(); }
  // Chunk-start state can be non-zero (skip the term otherwise).
  HCP_HD bool has_start(i64 c) const { return c > 0 || d.has_init; }
};

// ---- forward ---------------------------------------------------------------------------------
// (b, h, c): effective dt, its derivative factor and the within-chunk cumulative sum.
template <class S, class A>
struct DtCumsum {
  Ctx<S, A> k;
  HCP_HD void operator()(i64 i) const {
    const Dims& d = k.d;
    const i64 c = i % d.nch, h = (i / d.nch) % d.H, b = i / (d.nch * d.H);
    const A Ah = k.Ah(h);
    A run = 0;
    for (i64 t = d.c0(c); t <= d.E(c); ++t) {
      A v, dv;
      k.eff_dt(b, t, h, v, dv);
      run += v * Ah;
      k.w.dtv[k.tok(b, h, t)] = v;
      k.w.ddtv[k.tok(b, h, t)] = dv;
      k.w.cs[k.tok(b, h, t)] = run;
    }
  }
};
// (b, c, g, i, j): CB = C_i . B_j on the lower triangle.
template <class S, class A>
struct ChunkCB {
  Ctx<S, A> k;
  HCP_HD void operator()(i64 e) const {
    const Dims& d = k.d;
    const i64 j = e % d.Q, i = (e / d.Q) % d.Q, g = (e / (d.Q * d.Q)) % d.G, c = (e / (d.Q * d.Q * d.G)) % d.nch,
              b = e / (d.Q * d.Q * d.G * d.nch);
    const i64 ti = d.c0(c) + i, tj = d.c0(c) + j;
    A acc = 0;
    if (j <= i && ti < d.L)
      for (i64 n = 0; n < d.N; ++n) acc += k.Cv(b, ti, g, n) * k.Bv(b, tj, g, n);
    k.w.CB[e] = acc;
  }
};
// (b, c, h, p, n): the chunk's own contribution to its end state.
template <class S, class A>
struct ChunkState {
  Ctx<S, A> k;
  HCP_HD void operator()(i64 e) const {
    const Dims& d = k.d;
    const i64 n = e % d.N, p = (e / d.N) % d.P, h = (e / d.PN()) % d.H, c = (e / (d.PN() * d.H)) % d.nch,
              b = e / (d.PN() * d.H * d.nch), g = h / d.hpg();
    const i64 E = d.E(c), sE = k.seq(b, E);
    const A csE = k.w.cs[k.tok(b, h, E)];
    A acc = 0;
    for (i64 s = E; s >= d.c0(c) && k.seq(b, s) == sE; --s)
      acc += exp(csE - k.w.cs[k.tok(b, h, s)]) * k.w.dtv[k.tok(b, h, s)] * k.xv(b, s, h, p) * k.Bv(b, s, g, n);
    k.w.states[e] = acc;
  }
};
// The state recurrence over the chunks of row b, head h, element pn of buf ([B,nch,H,PN]), from `run`:
// each chunk's value is replaced by the running value on entry and run = [the chunk continues the
// sequence of the token before it] e^{cs_E} run + value; chunks in order, or reversed (the gradient
// pass). Returns the last running value.
template <class S, class A>
HCP_HD A pass_chunks(const Ctx<S, A>& k, A* buf, i64 b, i64 h, i64 pn, A run, bool reverse) {
  const Dims& d = k.d;
  for (i64 n = 0; n < d.nch; ++n) {
    const i64 c = reverse ? d.nch - 1 - n : n;
    A* s = buf + k.st(b, c, h) + pn;
    const A loc = *s;
    *s = run;
    const i64 E = d.E(c);
    run = (k.seq(b, E) == k.prev_seq(b, c) ? exp(k.w.cs[k.tok(b, h, E)]) * run : A(0)) + loc;
  }
  return run;
}
// (b, h, p, n): sequential over chunks; states become chunk-start states; fin = state after token L-1.
template <class S, class A>
struct StatePass {
  Ctx<S, A> k;
  S* fin;
  HCP_HD void operator()(i64 e) const {
    const Dims& d = k.d;
    const i64 pn = e % d.PN(), h = (e / d.PN()) % d.H, b = e / (d.PN() * d.H);
    const A run0 = d.has_init ? A(val(k.in.init[(b * d.H + h) * d.PN() + pn])) : A(0);
    const A run = pass_chunks(k, k.w.states, b, h, pn, run0, false);
    if (fin) put(fin + (b * d.H + h) * d.PN() + pn, run);
  }
};
// (b, t, h, p): the output.
template <class S, class A>
struct ChunkScan {
  Ctx<S, A> k;
  S* y;
  HCP_HD void operator()(i64 e) const {
    const Dims& d = k.d;
    const i64 p = e % d.P, h = (e / d.P) % d.H, t = (e / (d.P * d.H)) % d.L, b = e / (d.P * d.H * d.L), g = h / d.hpg();
    const i64 c = t / d.Q, c0 = d.c0(c), st = k.seq(b, t);
    const A cst = k.w.cs[k.tok(b, h, t)];
    A acc = 0;
    for (i64 s = t; s >= c0 && k.seq(b, s) == st; --s)
      acc += exp(cst - k.w.cs[k.tok(b, h, s)]) * k.w.dtv[k.tok(b, h, s)] * k.w.CB[k.cb(b, c, g, t - c0, s - c0)] *
             k.xv(b, s, h, p);
    if (k.has_start(c) && st == k.prev_seq(b, c)) {
      const A* S0 = k.w.states + k.st(b, c, h) + p * d.N;
      A sc = 0;
      for (i64 n = 0; n < d.N; ++n) sc += k.Cv(b, t, g, n) * S0[n];
      acc += exp(cst) * sc;
    }
    const A Dh = k.in.D ? A(val(k.in.D[h])) : A(0);
    put(y + e, acc + Dh * k.xv(b, t, h, p));
  }
};

// ---- backward --------------------------------------------------------------------------------
template <class S, class A>
struct BwdCtx {
  Ctx<S, A> k;
  const S* dy;
  A* dstates;  // [B,nch,H,P,N] local, then the gradient w.r.t. each chunk's END state
  A* dyx;      // [B,nch,H,Q,Q] dy_i . x_j for j <= i (element path of Phase::Terms only)
  A* dcs;      // [B,H,L] d cs_t excluding the terms that land on the chunk end
  A* t3;       // [B,H,L] the end-state term of token s (lands on cs_E with +, on cs_s with -)
  A* ddt_dir;  // [B,H,L] d dt_eff, direct terms
  A* dyx_d;    // [B,H,L] dy_t . x_t (for dD)
  HCP_HD A dyv(i64 b, i64 t, i64 h, i64 p) const { return val(dy[((b * k.d.L + t) * k.d.H + h) * k.d.P + p]); }
  HCP_HD i64 yx(i64 b, i64 c, i64 h, i64 i, i64 j) const {
    return (((b * k.d.nch + c) * k.d.H + h) * k.d.Q + i) * k.d.Q + j;
  }
};
// (b, c, h, p, n): the chunk-start-state gradient from this chunk's outputs.
template <class S, class A>
struct DStateLocal {
  BwdCtx<S, A> q;
  HCP_HD void operator()(i64 e) const {
    const Ctx<S, A>& k = q.k;
    const Dims& d = k.d;
    const i64 n = e % d.N, p = (e / d.N) % d.P, h = (e / d.PN()) % d.H, c = (e / (d.PN() * d.H)) % d.nch,
              b = e / (d.PN() * d.H * d.nch), g = h / d.hpg();
    const i64 s0 = k.prev_seq(b, c);
    A acc = 0;
    for (i64 t = d.c0(c); t <= d.E(c) && k.seq(b, t) == s0; ++t)
      acc += exp(k.w.cs[k.tok(b, h, t)]) * q.dyv(b, t, h, p) * k.Cv(b, t, g, n);
    q.dstates[e] = acc;
  }
};
// (b, h, p, n): reverse state passing; dstates become end-state gradients; dinit = dSin(0).
template <class S, class A>
struct DStatePass {
  BwdCtx<S, A> q;
  const S* dfin;
  S* dinit;
  HCP_HD void operator()(i64 e) const {
    const Ctx<S, A>& k = q.k;
    const Dims& d = k.d;
    const i64 pn = e % d.PN(), h = (e / d.PN()) % d.H, b = e / (d.PN() * d.H);
    const A run0 = dfin ? A(val(dfin[(b * d.H + h) * d.PN() + pn])) : A(0);
    const A run = pass_chunks(k, q.dstates, b, h, pn, run0, true);
    if (dinit) put(dinit + (b * d.H + h) * d.PN() + pn, run);
  }
};
// (b, c, h, i, j): dy_i . x_j on the lower triangle.
template <class S, class A>
struct DyX {
  BwdCtx<S, A> q;
  HCP_HD void operator()(i64 e) const {
    const Dims& d = q.k.d;
    const i64 j = e % d.Q, i = (e / d.Q) % d.Q, h = (e / (d.Q * d.Q)) % d.H, c = (e / (d.Q * d.Q * d.H)) % d.nch,
              b = e / (d.Q * d.Q * d.H * d.nch);
    const i64 ti = d.c0(c) + i, tj = d.c0(c) + j;
    A acc = 0;
    if (j <= i && ti < d.L)
      for (i64 p = 0; p < d.P; ++p) acc += q.dyv(b, ti, h, p) * q.k.xv(b, tj, h, p);
    q.dyx[e] = acc;
  }
};
// (b, s, h, p): dx.
template <class S, class A>
struct Dx {
  BwdCtx<S, A> q;
  S* dx;
  HCP_HD void operator()(i64 e) const {
    const Ctx<S, A>& k = q.k;
    const Dims& d = k.d;
    const i64 p = e % d.P, h = (e / d.P) % d.H, s = (e / (d.P * d.H)) % d.L, b = e / (d.P * d.H * d.L), g = h / d.hpg();
    const i64 c = s / d.Q, c0 = d.c0(c), E = d.E(c), ss = k.seq(b, s);
    const A css = k.w.cs[k.tok(b, h, s)];
    A acc = 0;
    for (i64 t = s; t <= E && k.seq(b, t) == ss; ++t)
      acc += exp(k.w.cs[k.tok(b, h, t)] - css) * k.w.CB[k.cb(b, c, g, t - c0, s - c0)] * q.dyv(b, t, h, p);
    if (ss == k.seq(b, E)) {
      const A* dS = q.dstates + k.st(b, c, h) + p * d.N;
      A sb = 0;
      for (i64 n = 0; n < d.N; ++n) sb += dS[n] * k.Bv(b, s, g, n);
      acc += exp(k.w.cs[k.tok(b, h, E)] - css) * sb;
    }
    const A Dh = k.in.D ? A(val(k.in.D[h])) : A(0);
    put(dx + e, k.w.dtv[k.tok(b, h, s)] * acc + Dh * q.dyv(b, s, h, p));
  }
};
// (b, s, g, n): dB, the heads of the group summed in order.
template <class S, class A>
struct DB {
  BwdCtx<S, A> q;
  S* dB;
  HCP_HD void operator()(i64 e) const {
    const Ctx<S, A>& k = q.k;
    const Dims& d = k.d;
    const i64 n = e % d.N, g = (e / d.N) % d.G, s = (e / (d.N * d.G)) % d.L, b = e / (d.N * d.G * d.L);
    const i64 c = s / d.Q, c0 = d.c0(c), E = d.E(c), ss = k.seq(b, s);
    A acc = 0;
    for (i64 h = g * d.hpg(); h < (g + 1) * d.hpg(); ++h) {
      const A css = k.w.cs[k.tok(b, h, s)];
      A inner = 0;
      for (i64 t = s; t <= E && k.seq(b, t) == ss; ++t)
        inner += exp(k.w.cs[k.tok(b, h, t)] - css) * q.dyx[q.yx(b, c, h, t - c0, s - c0)] * k.Cv(b, t, g, n);
      if (ss == k.seq(b, E)) {
        const A* dS = q.dstates + k.st(b, c, h) + n;
        A sx = 0;
        for (i64 p = 0; p < d.P; ++p) sx += k.xv(b, s, h, p) * dS[p * d.N];
        inner += exp(k.w.cs[k.tok(b, h, E)] - css) * sx;
      }
      acc += k.w.dtv[k.tok(b, h, s)] * inner;
    }
    put(dB + e, acc);
  }
};
// (b, t, g, n): dC, the heads of the group summed in order.
template <class S, class A>
struct DC {
  BwdCtx<S, A> q;
  S* dC;
  HCP_HD void operator()(i64 e) const {
    const Ctx<S, A>& k = q.k;
    const Dims& d = k.d;
    const i64 n = e % d.N, g = (e / d.N) % d.G, t = (e / (d.N * d.G)) % d.L, b = e / (d.N * d.G * d.L);
    const i64 c = t / d.Q, c0 = d.c0(c), st = k.seq(b, t);
    const bool start = k.has_start(c) && st == k.prev_seq(b, c);
    A acc = 0;
    for (i64 h = g * d.hpg(); h < (g + 1) * d.hpg(); ++h) {
      const A cst = k.w.cs[k.tok(b, h, t)];
      A inner = 0;
      for (i64 s = t; s >= c0 && k.seq(b, s) == st; --s)
        inner += exp(cst - k.w.cs[k.tok(b, h, s)]) * k.w.dtv[k.tok(b, h, s)] * q.dyx[q.yx(b, c, h, t - c0, s - c0)] *
                 k.Bv(b, s, g, n);
      if (start) {
        const A* S0 = k.w.states + k.st(b, c, h) + n;
        A sy = 0;
        for (i64 p = 0; p < d.P; ++p) sy += q.dyv(b, t, h, p) * S0[p * d.N];
        inner += exp(cst) * sy;
      }
      acc += inner;
    }
    put(dC + e, acc);
  }
};
// (b, h, t): the per-token terms of d cs and d dt (u: t as the later token, s: t as the earlier one).
template <class S, class A>
struct TokenTerms {
  BwdCtx<S, A> q;
  HCP_HD void operator()(i64 e) const {
    const Ctx<S, A>& k = q.k;
    const Dims& d = k.d;
    const i64 t = e % d.L, h = (e / d.L) % d.H, b = e / (d.L * d.H), g = h / d.hpg();
    const i64 c = t / d.Q, c0 = d.c0(c), E = d.E(c), st = k.seq(b, t);
    const A cst = k.w.cs[e], dtt = k.w.dtv[e];
    A as_later = 0, as_earlier = 0, direct = 0;
    for (i64 s = t; s >= c0 && k.seq(b, s) == st; --s)
      as_later += exp(cst - k.w.cs[k.tok(b, h, s)]) * k.w.dtv[k.tok(b, h, s)] * k.w.CB[k.cb(b, c, g, t - c0, s - c0)] *
                  q.dyx[q.yx(b, c, h, t - c0, s - c0)];
    for (i64 u = t; u <= E && k.seq(b, u) == st; ++u)
      direct += exp(k.w.cs[k.tok(b, h, u)] - cst) * k.w.CB[k.cb(b, c, g, u - c0, t - c0)] *
                q.dyx[q.yx(b, c, h, u - c0, t - c0)];
    as_earlier = direct * dtt;
    A t2 = 0, t3 = 0, w = 0;
    if (k.has_start(c) && st == k.prev_seq(b, c)) {  // y_t's chunk-start term
      const A* S0 = k.w.states + k.st(b, c, h);
      A u = 0;
      for (i64 p = 0; p < d.P; ++p) {
        A sc = 0;
        for (i64 n = 0; n < d.N; ++n) sc += S0[p * d.N + n] * k.Cv(b, t, g, n);
        u += q.dyv(b, t, h, p) * sc;
      }
      t2 = exp(cst) * u;
    }
    if (st == k.seq(b, E)) {  // token t's term in the chunk's end state
      const A* dS = q.dstates + k.st(b, c, h);
      A v = 0;
      for (i64 p = 0; p < d.P; ++p) {
        A sb = 0;
        for (i64 n = 0; n < d.N; ++n) sb += dS[p * d.N + n] * k.Bv(b, t, g, n);
        v += k.xv(b, t, h, p) * sb;
      }
      const A ev = exp(k.w.cs[k.tok(b, h, E)] - cst) * v;
      direct += ev;
      t3 = ev * dtt;
    }
    for (i64 p = 0; p < d.P; ++p) w += q.dyv(b, t, h, p) * k.xv(b, t, h, p);
    q.dcs[e] = as_later - as_earlier + t2 - t3;
    q.t3[e] = t3;
    q.ddt_dir[e] = direct;
    q.dyx_d[e] = w;
  }
};
// (b, c, h): reverse cumulative sum of d cs over the chunk -> d dt (raw), and this chunk's partials of
// dA_log, D and dt_bias ([B,nch,H], summed by the caller in order).
template <class S, class A>
struct ChunkReduce {
  BwdCtx<S, A> q;
  S* ddt;
  A *part_dA_log, *part_dD, *part_ddtb;
  HCP_HD void operator()(i64 i) const {
    const Ctx<S, A>& k = q.k;
    const Dims& d = k.d;
    const i64 h = i % d.H, c = (i / d.H) % d.nch, b = i / (d.H * d.nch);
    const i64 c0 = d.c0(c), E = d.E(c);
    const A Ah = k.Ah(h);
    A end = 0;  // everything that lands on cs_E: the end-state terms and the state passed through
    for (i64 t = c0; t <= E; ++t) end += q.t3[k.tok(b, h, t)];
    if (k.has_start(c) && k.seq(b, E) == k.prev_seq(b, c)) {
      const A *S0 = k.w.states + k.st(b, c, h), *dS = q.dstates + k.st(b, c, h);
      A dot = 0;
      for (i64 e = 0; e < d.PN(); ++e) dot += S0[e] * dS[e];
      end += exp(k.w.cs[k.tok(b, h, E)]) * dot;
    }
    A rev = 0, dA = 0, dD = 0, dtb = 0;
    for (i64 t = E; t >= c0; --t) {
      const i64 o = k.tok(b, h, t);
      rev += q.dcs[o] + (t == E ? end : A(0));
      const A g = (q.ddt_dir[o] + Ah * rev) * k.w.ddtv[o];
      put(ddt + (b * d.L + t) * d.H + h, g);
      dA += k.w.dtv[o] * rev;
      dD += q.dyx_d[o];
      dtb += g;
    }
    part_dA_log[i] = dA * Ah;  // dA/dA_log = A
    part_dD[i] = dD;
    part_ddtb[i] = dtb;
  }
};

// ---- orchestration ---------------------------------------------------------------------------
// Exec: `template <class T> T* alloc(i64 n)` (owned by the exec) and `template <class F> void run(i64 n,
// const F& f)` (f(i) for every i in [0, n), in any order: every element function writes only its own
// outputs). An exec may also offer `bool replace(Phase, const BwdCtx&, const Io&)`, running a phase its
// own way and returning false where it does not cover the shape or type. A replaced phase writes the
// Io outputs listed below; its Work / BwdCtx outputs only where an element phase may read them, so an
// exec that replaces every phase of a call (kernels/cuda/ssd/ssd_tc.cu) may hand over between its phases
// in buffers of its own. The forward phases see a BwdCtx whose backward buffers are null.
enum class Phase {
  DtCumsum,     // k.w.dtv, k.w.ddtv, k.w.cs
  CB,           // k.w.CB
  States,       // k.w.states (chunk-local)
  Pass,         // k.w.states -> chunk-start states, io.fin
  Scan,         // io.y
  DStateLocal,  // q.dstates (chunk-local)
  DPass,        // q.dstates -> end-state gradients, io.dinit (from io.dfin)
  Terms,        // io.dx, io.dB, io.dC and the per-token q.dcs, q.t3, q.ddt_dir, q.dyx_d (q.dyx is null: an
                // exec replacing this phase keeps its own intermediates; the element path allocates it)
  Reduce        // io.ddt and the partials
};
template <class S, class A>
struct Io {
  S *y, *fin;
  const S* dfin;
  S *dinit, *dx, *ddt, *dB, *dC;
  A *part_dA_log, *part_dD, *part_ddtb;  // [B,nch,H]
};
template <class Exec, class S, class A>
bool replaced(Exec& ex, Phase ph, const BwdCtx<S, A>& q, const Io<S, A>& io) {
  if constexpr (requires { ex.replace(ph, q, io); })
    return ex.replace(ph, q, io);
  else
    return false;
}
template <class A, class S, class Exec>
Ctx<S, A> forward(Exec& ex, const In<S>& in, const Dims& d, S* y, S* fin) {
  Ctx<S, A> k{in, d, {}};
  const i64 BHL = d.B * d.H * d.L;
  k.w = {ex.template alloc<A>(BHL), ex.template alloc<A>(BHL), ex.template alloc<A>(BHL),
         ex.template alloc<A>(d.B * d.nch * d.G * d.Q * d.Q), ex.template alloc<A>(d.B * d.nch * d.H * d.PN())};
  const BwdCtx<S, A> q{k, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  const Io<S, A> io{y, fin, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  if (!replaced(ex, Phase::DtCumsum, q, io)) ex.run(d.B * d.H * d.nch, DtCumsum<S, A>{k});
  if (!replaced(ex, Phase::CB, q, io)) ex.run(d.B * d.nch * d.G * d.Q * d.Q, ChunkCB<S, A>{k});
  if (!replaced(ex, Phase::States, q, io)) ex.run(d.B * d.nch * d.H * d.PN(), ChunkState<S, A>{k});
  if (!replaced(ex, Phase::Pass, q, io)) ex.run(d.B * d.H * d.PN(), StatePass<S, A>{k, fin});
  if (y && !replaced(ex, Phase::Scan, q, io)) ex.run(d.B * d.L * d.H * d.P, ChunkScan<S, A>{k, y});
  return k;
}
template <class A>
struct Partials {
  A *dA_log, *dD, *ddt_bias;  // [B,nch,H]
};
template <class A, class S, class Exec>
Partials<A> backward(Exec& ex, const In<S>& in, const Dims& d, const S* dy, const S* dfin, S* dx, S* ddt, S* dB, S* dC,
                     S* dinit) {
  const Ctx<S, A> k = forward<A>(ex, in, d, static_cast<S*>(nullptr), static_cast<S*>(nullptr));
  const i64 BHL = d.B * d.H * d.L, BCH = d.B * d.nch * d.H;
  BwdCtx<S, A> q{k,
                 dy,
                 ex.template alloc<A>(BCH * d.PN()),
                 nullptr,
                 ex.template alloc<A>(BHL),
                 ex.template alloc<A>(BHL),
                 ex.template alloc<A>(BHL),
                 ex.template alloc<A>(BHL)};
  Partials<A> part{ex.template alloc<A>(BCH), ex.template alloc<A>(BCH), ex.template alloc<A>(BCH)};
  const Io<S, A> io{nullptr, nullptr, dfin, dinit, dx, ddt, dB, dC, part.dA_log, part.dD, part.ddt_bias};
  if (!replaced(ex, Phase::DStateLocal, q, io)) ex.run(BCH * d.PN(), DStateLocal<S, A>{q});
  if (!replaced(ex, Phase::DPass, q, io)) ex.run(d.B * d.H * d.PN(), DStatePass<S, A>{q, dfin, dinit});
  if (!replaced(ex, Phase::Terms, q, io)) {
    q.dyx = ex.template alloc<A>(BCH * d.Q * d.Q);
    ex.run(BCH * d.Q * d.Q, DyX<S, A>{q});
    ex.run(d.B * d.L * d.H * d.P, Dx<S, A>{q, dx});
    ex.run(d.B * d.L * d.G * d.N, DB<S, A>{q, dB});
    ex.run(d.B * d.L * d.G * d.N, DC<S, A>{q, dC});
    ex.run(BHL, TokenTerms<S, A>{q});
  }
  if (!replaced(ex, Phase::Reduce, q, io)) ex.run(BCH, ChunkReduce<S, A>{q, ddt, part.dA_log, part.dD, part.ddt_bias});
  return part;
}

}  // namespace hcp::ssdc
