// The decode steps (one token per sequence) against the whole-sequence kernels: ssd_step from a
// prefill's final state reproduces ssd_fwd's outputs token by token and its final state, and
// conv1d_step from a zero window reproduces conv1d_fwd; the shape and dtype rules refuse a state in
// the wrong dtype and a window of the wrong width.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "unit/ssd_case.hpp"

using namespace hcp;
using namespace hcp::kernels;

namespace {
// Token t of a [B,L,...] tensor as a contiguous [B,1,...] one.
Tensor token(const Tensor& t, std::int64_t i) { return t.slice(1, i, 1).clone(); }

double rel_err(const Tensor& got, const Tensor& want) {
  const ErrorStats e = compare(got, want);
  return e.max_abs / std::max(e.ref_max, 1e-300);
}

// Prefill the first L0 tokens (ssd_fwd, final state), then step through the rest; every stepped
// output and the last state against ssd_fwd over the whole row.
void step_after_prefill(DType d, double tol) {
  test::SsdCase c(2, 29, 4, 8, 2, 16, 8, 71, d);
  const std::int64_t L = c.p.seqlen, L0 = 11;
  Tensor y_all = c.y(), fin_all = Tensor::zeros({2, 4, 8, 16}, acc_dtype(d));
  ssd_fwd(y_all, &fin_all, c.inputs(), c.p);

  test::SsdCase pre = c;
  pre.p.seqlen = L0;
  for (Tensor* t : {&pre.x, &pre.dt, &pre.B, &pre.C}) *t = t->slice(1, 0, L0).clone();
  Tensor y_pre = pre.y(), state = Tensor::zeros({2, 4, 8, 16}, acc_dtype(d));
  ssd_fwd(y_pre, &state, pre.inputs(), pre.p);

  SsdParams one = c.p;
  one.seqlen = 1;
  for (std::int64_t t = L0; t < L; ++t) {
    const Tensor x = token(c.x, t), dt = token(c.dt, t), B = token(c.B, t), C = token(c.C, t);
    const SsdInputs in{&x, &dt, &c.A_log, &B, &C, &c.D, &c.dt_bias, nullptr, nullptr};
    Tensor y = Tensor::zeros(x.shape(), d);
    ssd_step(y, state, in, one);
    EXPECT_LE(rel_err(y, token(y_all, t)), tol) << to_string(d) << " token " << t;
  }
  EXPECT_LE(rel_err(state, fin_all), tol) << to_string(d) << " final state";
}
}  // namespace

TEST(DecodeStep, SsdStepContinuesThePrefill) {
  step_after_prefill(DType::F64, 1e-12);
  step_after_prefill(DType::F32, 2e-5);
}

TEST(DecodeStep, SsdStepRefusesABf16State) {
  test::SsdCase c(1, 1, 2, 4, 1, 8, 8, 5, DType::BF16);
  Tensor y = c.y(), state = Tensor::zeros({1, 2, 4, 8}, DType::BF16);
  EXPECT_THROW(ssd_step(y, state, c.inputs(), c.p), Error);
  state = Tensor::zeros({1, 2, 4, 8}, DType::F32);
  EXPECT_NO_THROW(ssd_step(y, state, c.inputs(), c.p));
}

TEST(DecodeStep, Conv1dStepIsTheCausalConvolution) {
  for (bool silu : {false, true}) {
    const std::int64_t B = 2, L = 9, C = 6, W = 4;
    const Tensor x = test::rand({B, L, C}, 31, -1, 1, DType::F64), w = test::rand({C, W}, 32, -1, 1, DType::F64),
                 bias = test::rand({C}, 33, -1, 1, DType::F64);
    Tensor y_all = Tensor::zeros({B, L, C}, DType::F64);
    conv1d_fwd(y_all, x, w, &bias, nullptr, silu);
    Tensor window = Tensor::zeros({B, W - 1, C}, DType::F64);
    for (std::int64_t t = 0; t < L; ++t) {
      const Tensor xt = x.slice(1, t, 1).clone().view({B, C});
      Tensor y = Tensor::zeros({B, C}, DType::F64);
      conv1d_step(y, window, xt, w, &bias, silu);
      const Tensor want = y_all.slice(1, t, 1).clone().view({B, C});
      for (std::int64_t i = 0; i < B * C; ++i) ASSERT_EQ(y.get(i), want.get(i)) << "token " << t << " element " << i;
    }
    // the window holds the last W - 1 inputs, oldest first
    const Tensor tail = x.slice(1, L - (W - 1), W - 1).clone();
    for (std::int64_t i = 0; i < tail.numel(); ++i) EXPECT_EQ(window.get(i), tail.get(i)) << i;
  }
}

TEST(DecodeStep, Conv1dStepRefusesAWindowOfTheWrongWidth) {
  const Tensor x = Tensor::zeros({2, 6}, DType::F64), w = Tensor::zeros({6, 4}, DType::F64);
  Tensor y = Tensor::zeros({2, 6}, DType::F64), window = Tensor::zeros({2, 4, 6}, DType::F64);
  EXPECT_THROW(conv1d_step(y, window, x, w, nullptr, true), Error);
}
