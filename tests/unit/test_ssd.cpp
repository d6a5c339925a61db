// Mamba2 SSD: chunked equals sequential (seq_idx resets, initial states, ragged last chunk),
// packed equals one-by-one, finite-difference gradients of every input and parameter.
#include <gtest/gtest.h>

#include "kernels/kernels.hpp"
#include "unit/fd.hpp"
#include "unit/ssd_case.hpp"

using namespace hcp;
using namespace hcp::kernels;
using hcp::test::rand;

using Case = hcp::test::SsdCase;

TEST(Ssd, ChunkedEqualsSequential) {
  for (std::int64_t chunk : {1, 4, 5, 64}) {
    Case c(2, 23, 4, 3, 2, 5, chunk, 100);
    c.use_init = true;
    c.use_seq = true;
    c.seq.clear();
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t t = 0; t < 23; ++t) c.seq.push_back(b == 0 ? (t < 9 ? 0 : (t < 10 ? 1 : 2)) : 0);
    for (bool seq : {false, true})
      for (bool init : {false, true}) {
        c.use_seq = seq;
        c.use_init = init;
        Tensor y1 = c.y(), y2 = c.y(), f1 = c.states(), f2 = c.states();
        ssd_fwd(y1, &f1, c.inputs(), c.p);
        ssd_sequential_fwd(y2, &f2, c.inputs(), c.p);
        test::expect_close(y1, y2, 1e-12, 1e-11, "y chunk " + std::to_string(chunk));
        test::expect_close(f1, f2, 1e-12, 1e-11, "final states chunk " + std::to_string(chunk));
      }
  }
}

TEST(Ssd, PackedEqualsOneByOne) {
  // Three sequences of lengths 6, 1, 9 packed in one row; the state must reset at each start.
  const std::vector<std::int64_t> cu{0, 6, 7, 16};
  Case c(1, 16, 2, 2, 1, 3, 4, 200);
  c.use_seq = true;
  for (std::size_t s = 0; s + 1 < cu.size(); ++s)
    for (std::int64_t t = cu[s]; t < cu[s + 1]; ++t) c.seq.push_back(static_cast<std::int64_t>(s));
  Tensor y = c.y();
  ssd_fwd(y, nullptr, c.inputs(), c.p);
  for (std::size_t s = 0; s + 1 < cu.size(); ++s) {
    const std::int64_t n = cu[s + 1] - cu[s];
    Case one(1, n, 2, 2, 1, 3, 4, 0);
    one.x = c.x.slice(1, cu[s], n).clone();
    one.dt = c.dt.slice(1, cu[s], n).clone();
    one.B = c.B.slice(1, cu[s], n).clone();
    one.C = c.C.slice(1, cu[s], n).clone();
    one.A_log = c.A_log;
    one.D = c.D;
    one.dt_bias = c.dt_bias;
    Tensor ys = one.y();
    ssd_fwd(ys, nullptr, one.inputs(), one.p);
    test::expect_close(y.slice(1, cu[s], n).clone(), ys, 1e-13, 1e-12, "sequence " + std::to_string(s));
  }
}

TEST(Ssd, GradientsFiniteDifference) {
  for (bool packed : {false, true}) {
    Case c(2, 7, 4, 2, 2, 3, 3, 300);
    c.use_init = !packed;
    c.use_seq = packed;
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t t = 0; t < 7; ++t) c.seq.push_back(t < 3 ? 0 : 1);
    c.p.dt_max = 5.0;
    Tensor w = rand(c.x.shape(), 301), wf = rand({2, 4, 2, 3}, 302);
    auto loss = [&] {
      Tensor y = c.y(), f = c.states();
      ssd_fwd(y, &f, c.inputs(), c.p);
      return test::dot(y, w) + test::dot(f, wf);
    };
    auto gr = c.zero_grads();
    SsdGrads g = gr.ptrs(c.use_init);
    ssd_bwd(g, c.inputs(), w, &wf, c.p);
    const std::string tag = packed ? " (packed)" : "";
    test::fd_check(c.x, gr.dx, loss, "dx" + tag);
    test::fd_check(c.dt, gr.ddt, loss, "ddt" + tag);
    test::fd_check(c.A_log, gr.dA_log, loss, "dA_log" + tag);
    test::fd_check(c.B, gr.dB, loss, "dB" + tag);
    test::fd_check(c.C, gr.dC, loss, "dC" + tag);
    test::fd_check(c.D, gr.dD, loss, "dD" + tag);
    test::fd_check(c.dt_bias, gr.ddt_bias, loss, "ddt_bias" + tag);
    if (c.use_init) test::fd_check(c.init, gr.dinit, loss, "dinit_states");
  }
}

TEST(Ssd, DtClampStopsGradient) {
  Case c(1, 4, 2, 2, 1, 2, 2, 400);
  c.dt = rand(c.dt.shape(), 401, 3.0, 4.0);  // softplus(dt + bias) > 2 everywhere
  c.p.dt_max = 1.0;
  Tensor w = rand(c.x.shape(), 402);
  auto gr = c.zero_grads();
  SsdGrads g = gr.ptrs(false);
  ssd_bwd(g, c.inputs(), w, nullptr, c.p);
  for (double v : gr.ddt.to_vector()) EXPECT_EQ(v, 0.0);
}

TEST(Ssd, Fp32MatchesFp64) {
  Case c(1, 40, 4, 4, 2, 8, 16, 500);
  Tensor y = c.y();
  ssd_fwd(y, nullptr, c.inputs(), c.p);
  Case f = c;
  for (Tensor* t : {&f.x, &f.dt, &f.A_log, &f.B, &f.C, &f.D, &f.dt_bias}) *t = t->to(DType::F32);
  Tensor y32 = Tensor::zeros(c.x.shape(), DType::F32);
  ssd_fwd(y32, nullptr, f.inputs(), f.p);
  test::expect_close(y32, y, 1e-5, 1e-4, "fp32 y");
}

TEST(Ssd, BadShapesAreClearErrors) {
  Case c(1, 4, 3, 2, 2, 2, 2, 600);
  Tensor y = c.y();
  EXPECT_NE(test::error_of([&] { ssd_fwd(y, nullptr, c.inputs(), c.p); }).find("n_groups (2) must divide heads (3)"),
            std::string::npos);
  Case d(1, 4, 2, 2, 1, 2, 2, 601);
  d.use_seq = true;
  d.seq = {0, 1};
  Tensor y2 = d.y();
  EXPECT_NE(test::error_of([&] { ssd_fwd(y2, nullptr, d.inputs(), d.p); }).find("seq_idx has 2 entries"),
            std::string::npos);
  d.seq = {0, 1, 0, 1};
  EXPECT_NE(test::error_of([&] { ssd_fwd(y2, nullptr, d.inputs(), d.p); }).find("non-decreasing"), std::string::npos);
}

// State passing: a zero-state run plus the initial-state term equals the run from that state; the
// final state is decay * S0 + the zero-state final state; finite differences of the term's backward.
TEST(SsdStatePassing, InitStateTermAndDecayCompose) {
  Case c(2, 11, 4, 3, 2, 5, 4, 300);
  c.use_init = true;
  Tensor yfull = c.y(), ffull = c.states();
  ssd_fwd(yfull, &ffull, c.inputs(), c.p);
  c.use_init = false;
  Tensor y = c.y(), f0 = c.states(), decay = Tensor::zeros({2, 4}, DType::F64);
  ssd_fwd(y, &f0, c.inputs(), c.p);
  ssd_run_decay(decay, c.inputs(), c.p);
  c.use_init = true;
  ssd_init_state_fwd(y, c.inputs(), c.p);
  test::expect_close(y, yfull, 1e-13, 1e-12, "y");
  Tensor fsum = f0.clone();
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::int64_t e = 0; e < 15; ++e) {
        const std::int64_t i = (b * 4 + h) * 15 + e;
        fsum.set(i, f0.get(i) + decay.get(b * 4 + h) * c.init.get(i));
      }
  test::expect_close(fsum, ffull, 1e-13, 1e-12, "final state");
}

TEST(SsdStatePassing, InitStateBackwardFiniteDifference) {
  Case c(2, 7, 4, 3, 2, 3, 4, 310);
  c.use_init = true;
  Tensor dy = rand({2, 7, 4, 3}, 320), ddecay = rand({2, 4}, 321);
  auto loss = [&] {
    Tensor y = c.y(), a = Tensor::zeros({2, 4}, DType::F64);
    ssd_init_state_fwd(y, c.inputs(), c.p);
    ssd_run_decay(a, c.inputs(), c.p);
    return test::dot(y, dy) + test::dot(a, ddecay);
  };
  auto g = c.zero_grads();
  // Accumulating semantics: start from ones and subtract them afterwards.
  for (Tensor* t : {&g.dC, &g.ddt, &g.dA_log, &g.ddt_bias}) t->fill(1.0);
  SsdStateGrads sg{&g.dC, &g.ddt, &g.dA_log, &g.ddt_bias, &g.dinit};
  ssd_init_state_bwd(sg, c.inputs(), &dy, nullptr, c.p);
  ssd_init_state_bwd(sg, c.inputs(), nullptr, &ddecay, c.p);
  for (Tensor* t : {&g.dC, &g.ddt, &g.dA_log, &g.ddt_bias})
    for (std::int64_t i = 0; i < t->numel(); ++i) t->set(i, t->get(i) - 1.0);
  test::fd_check(c.C, g.dC, loss, "dC");
  test::fd_check(c.dt, g.ddt, loss, "ddt");
  test::fd_check(c.A_log, g.dA_log, loss, "dA_log");
  test::fd_check(c.dt_bias, g.ddt_bias, loss, "ddt_bias");
  test::fd_check(c.init, g.dinit, loss, "dinit_states");
  EXPECT_NE(test::error_of([&] {
              c.use_seq = true;
              c.seq.assign(14, 0);
              Tensor y = c.y();
              ssd_init_state_fwd(y, c.inputs(), c.p);
            }).find("no seq_idx"),
            std::string::npos);
}
