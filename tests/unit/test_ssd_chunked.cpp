// The GPU's chunked SSD algorithm (kernels/cuda/ssd/chunked.hpp), run here element by element on the
// host, against the host oracle: forward, final states and every gradient, with seq_idx resets inside
// and across chunk boundaries, initial states, a ragged last chunk and chunks longer than the row.
// This lets CI (no GPU) check the element phases' mathematics (the fp64/fp32 kernels and the general
// bf16 path); the bf16 tensor-core phases (ssd_tc.cu: wgmma tiles, their layouts and pipelines) are
// not covered here and are tested only on a GPU (tests/cuda/test_cuda_kernels.cpp, test_cuda_cp.cpp).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kernels/cuda/ssd/chunked.hpp"
#include "unit/ssd_case.hpp"

using namespace hcp;
using namespace hcp::kernels;
using Case = hcp::test::SsdCase;

namespace {
// Runs every element function serially; scratch is filled with NaN so a read of an unwritten
// element shows up in the results.
struct SerialExec {
  std::vector<std::unique_ptr<double[]>> bufs;
  template <class T>
  T* alloc(std::int64_t n) {
    static_assert(std::is_same_v<T, double>);
    bufs.emplace_back(new double[static_cast<std::size_t>(std::max<std::int64_t>(n, 1))]);
    std::fill_n(bufs.back().get(), std::max<std::int64_t>(n, 1), std::nan(""));
    return bufs.back().get();
  }
  template <class F>
  void run(std::int64_t n, const F& f) {
    for (std::int64_t i = n - 1; i >= 0; --i) f(i);  // reverse order: no element may depend on another
  }
};

ssdc::Dims dims_of(const SsdParams& p, bool init) {
  return {p.batch,       p.seqlen,  p.heads,  p.head_dim,
          p.groups,      p.d_state, p.chunk,  (p.seqlen + p.chunk - 1) / p.chunk,
          p.dt_softplus, p.dt_min,  p.dt_max, init};
}
ssdc::In<double> in_of(const Case& c) {
  return {c.x.data<double>(),
          c.dt.data<double>(),
          c.A_log.data<double>(),
          c.B.data<double>(),
          c.C.data<double>(),
          c.D.data<double>(),
          c.dt_bias.data<double>(),
          c.use_init ? c.init.data<double>() : nullptr,
          c.use_seq ? c.seq.data() : nullptr};
}
void expect_near(const Tensor& got, const Tensor& want, const std::string& what) {
  const ErrorStats e = compare(got, want);
  EXPECT_LE(e.max_abs, 1e-12 * std::max(1.0, e.ref_max))
      << what << ": max abs " << e.max_abs << " (ref max " << e.ref_max << ")";
}

void check_case(Case& c, const std::string& tag) {
  // Host oracle.
  Tensor y_ref = c.y(), fin_ref = c.states(), dy = test::rand(c.x.shape(), 77), dfin = test::rand(fin_ref.shape(), 78);
  ssd_fwd(y_ref, &fin_ref, c.inputs(), c.p);
  Case::Grads g_ref = c.zero_grads();
  SsdGrads gp = g_ref.ptrs(c.use_init);
  ssd_bwd(gp, c.inputs(), dy, &dfin, c.p);
  // Element functions.
  const ssdc::Dims d = dims_of(c.p, c.use_init);
  Tensor y = c.y(), fin = c.states();
  {
    SerialExec ex;
    ssdc::forward<double>(ex, in_of(c), d, y.data<double>(), fin.data<double>());
  }
  expect_near(y, y_ref, tag + " y");
  expect_near(fin, fin_ref, tag + " final states");
  Case::Grads g = c.zero_grads();
  SerialExec ex;
  const ssdc::Partials<double> part = ssdc::backward<double>(
      ex, in_of(c), d, dy.data<double>(), dfin.data<double>(), g.dx.data<double>(), g.ddt.data<double>(),
      g.dB.data<double>(), g.dC.data<double>(), c.use_init ? g.dinit.data<double>() : nullptr);
  for (std::int64_t h = 0; h < d.H; ++h) {
    double a = 0, dd = 0, db = 0;
    for (std::int64_t bc = 0; bc < d.B * d.nch; ++bc) {
      a += part.dA_log[bc * d.H + h];
      dd += part.dD[bc * d.H + h];
      db += part.ddt_bias[bc * d.H + h];
    }
    g.dA_log.set(h, a);
    g.dD.set(h, dd);
    g.ddt_bias.set(h, db);
  }
  expect_near(g.dx, g_ref.dx, tag + " dx");
  expect_near(g.ddt, g_ref.ddt, tag + " ddt");
  expect_near(g.dB, g_ref.dB, tag + " dB");
  expect_near(g.dC, g_ref.dC, tag + " dC");
  expect_near(g.dA_log, g_ref.dA_log, tag + " dA_log");
  expect_near(g.dD, g_ref.dD, tag + " dD");
  expect_near(g.ddt_bias, g_ref.ddt_bias, tag + " ddt_bias");
  if (c.use_init) expect_near(g.dinit, g_ref.dinit, tag + " dinit");
}
}  // namespace

TEST(SsdChunkedElementwise, MatchesHostOracle) {
  const std::int64_t L = 23;
  for (std::int64_t chunk : {1, 4, 5, 8, 64})
    for (bool seq : {false, true})
      for (bool init : {false, true}) {
        Case c(2, L, 4, 3, 2, 5, chunk, 300);
        c.use_seq = seq;
        c.use_init = init;
        // Row 0: resets at 9 (a one-token sequence at 9), 10 and 20 (inside and at chunk edges);
        // row 1: one sequence.
        for (std::int64_t b = 0; b < 2; ++b)
          for (std::int64_t t = 0; t < L; ++t) c.seq.push_back(b == 0 ? (t < 9 ? 0 : t < 10 ? 1 : t < 20 ? 2 : 3) : 0);
        check_case(c, "chunk " + std::to_string(chunk) + (seq ? " seq_idx" : "") + (init ? " init" : ""));
      }
}

TEST(SsdChunkedElementwise, GroupsAndNoSoftplus) {
  for (std::int64_t G : {1, 3}) {
    Case c(1, 17, 6, 4, G, 3, 4, 400 + static_cast<std::uint64_t>(G));
    c.p.dt_softplus = false;
    c.dt = test::rand(c.dt.shape(), 9, 0.05, 0.6);
    c.dt_bias = test::rand(c.dt_bias.shape(), 10, 0.0, 0.1);
    c.use_init = true;
    check_case(c, "groups " + std::to_string(G));
  }
  Case c(2, 16, 2, 2, 1, 2, 4, 500);  // dt clamp: some gradients stop
  c.p.dt_min = 0.3;
  c.p.dt_max = 0.9;
  check_case(c, "dt clamp");
}
