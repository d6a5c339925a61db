// MoE router, aux loss, permute/combine and grouped expert MLPs: exact selection rules and
// finite-difference gradients.
#include <gtest/gtest.h>

#include "kernels/kernels.hpp"
#include "unit/fd.hpp"

using namespace hcp;
using namespace hcp::kernels;
using hcp::test::rand;

TEST(Moe, RouterSelectionRules) {
  RouterParams p;
  p.experts = 4;
  p.topk = 2;
  p.sigmoid = true;
  p.scaling = 2.5;
  // Token 0: scores ordered e2 > e0 > e3 > e1. A correction bias lifts e1 for selection only.
  Tensor logits = Tensor::from({1.0, -2.0, 3.0, 0.0}, {1, 4}, DType::F64);
  Tensor bias = Tensor::from({0, 5.0, 0, 0}, {4}, DType::F64);
  Tensor s = Tensor::zeros({1, 4}, DType::F64), w = Tensor::zeros({1, 2}, DType::F64);
  MoeRouting r;
  router_fwd(s, r, w, logits, nullptr, p);
  EXPECT_EQ(r.indices(), (std::vector<std::int64_t>{2, 0}));
  EXPECT_EQ(r.counts, (std::vector<std::int64_t>{1, 0, 1, 0}));
  router_fwd(s, r, w, logits, &bias, p);
  EXPECT_EQ(r.indices(), (std::vector<std::int64_t>{1, 2}));
  const double s1 = 1 / (1 + std::exp(2.0)), s2 = 1 / (1 + std::exp(-3.0));
  EXPECT_NEAR(w.get(0), 2.5 * s1 / (s1 + s2), 1e-14);  // weights from unbiased scores
  // Group-limited: groups {0,1} and {2,3}; only one group allowed -> both picks from group 1.
  p.n_group = 2;
  p.topk_group = 1;
  router_fwd(s, r, w, logits, nullptr, p);
  EXPECT_EQ(r.indices(), (std::vector<std::int64_t>{2, 3}));
  p.n_group = 3;
  EXPECT_NE(
      test::error_of([&] { router_fwd(s, r, w, logits, nullptr, p); }).find("n_group (3) must divide experts (4)"),
      std::string::npos);
}

TEST(Moe, RouterAndAuxLossGradients) {
  for (bool sig : {true, false}) {
    RouterParams p;
    p.experts = 6;
    p.topk = 2;
    p.sigmoid = sig;
    p.scaling = 1.7;
    const std::int64_t T = 5;
    // Well-separated logits so a finite-difference step never changes the selection.
    Tensor logits = Tensor::empty({T, 6}, DType::F64);
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t e = 0; e < 6; ++e) logits.set(t * 6 + e, 0.37 * double((e * 7 + t * 3) % 6) - 0.9);
    Tensor dw = rand({T, 2}, 1);
    MoeRouting idx;
    auto fwd = [&](Tensor& s, Tensor& w) { router_fwd(s, idx, w, logits, nullptr, p); };
    auto loss = [&] {
      Tensor s = Tensor::zeros({T, 6}, DType::F64), w = Tensor::zeros({T, 2}, DType::F64);
      fwd(s, w);
      return test::dot(w, dw) + 0.3 * moe_aux_loss_fwd(s, idx, p);
    };
    Tensor s = Tensor::zeros({T, 6}, DType::F64), w = Tensor::zeros({T, 2}, DType::F64);
    fwd(s, w);
    Tensor ds = Tensor::zeros({T, 6}, DType::F64), dl = Tensor::zeros({T, 6}, DType::F64);
    moe_aux_loss_bwd(ds, s, idx, p, 0.3);
    router_bwd(dl, s, idx, dw, &ds, p);
    test::fd_check(logits, dl, loss, sig ? "router dlogits (sigmoid)" : "router dlogits (softmax)");
  }
}

// A routing names its rule when misused: indices outside the experts, a combine before the
// permutation exists, a router backward over another number of tokens.
TEST(Moe, RoutingErrorsNameTheRule) {
  EXPECT_NE(test::error_of([] {
              moe_routing({0, 7}, 1, 4, Space::Host);
            }).find("expert index 7 outside [0, 4)"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              moe_routing({0, 1, 2}, 2, 4, Space::Host);
            }).find("not a whole number of tokens"),
            std::string::npos);
  const MoeRouting r = moe_routing({0, 1, 1, 3}, 2, 4, Space::Host);
  EXPECT_EQ(r.counts, (std::vector<std::int64_t>{1, 2, 0, 1}));
  Tensor y = Tensor::zeros({2, 3}, DType::F64), yp = Tensor::zeros({4, 3}, DType::F64),
         w = Tensor::zeros({2, 2}, DType::F64);
  EXPECT_NE(test::error_of([&] { moe_combine_fwd(y, yp, r, w); }).find("no permutation (moe_permute first)"),
            std::string::npos);
  RouterParams p;
  p.experts = 4;
  p.topk = 2;
  Tensor s = Tensor::zeros({3, 4}, DType::F64), dl = Tensor::zeros({3, 4}, DType::F64),
         dw = Tensor::zeros({3, 2}, DType::F64);
  EXPECT_NE(
      test::error_of([&] { router_bwd(dl, s, r, dw, nullptr, p); }).find("the routing has 4 assignments, expected 6"),
      std::string::npos);
}

TEST(Moe, PermuteCombineAndExpertsAgainstPerTokenLoop) {
  const std::int64_t T = 6, C = 4, F = 3, E = 4, K = 2;
  const std::vector<std::int64_t> idx{0, 2, 2, 3, 0, 2, 3, 0, 2, 0, 0, 3};  // expert 1 receives no tokens
  Tensor x = rand({T, C}, 2), tw = rand({T, K}, 3, 0.1, 1.0);
  for (Activation act : {Activation::SquaredReLU, Activation::SwiGLU}) {
    const std::int64_t F1 = act == Activation::SwiGLU ? 2 * F : F;
    Tensor W1 = rand({E, F1, C}, 4), W2 = rand({E, C, F}, 5), dy = rand({T, C}, 6);
    auto forward = [&](Tensor& y, Tensor& xp, Tensor& h, Tensor& yp, MoeRouting& r) {
      r = moe_routing(idx, K, E, Space::Host);
      moe_permute(xp, r, x);
      expert_mlp_fwd(yp, h, xp, W1, W2, r.counts, act);
      moe_combine_fwd(y, yp, r, tw);
    };
    Tensor y = Tensor::zeros({T, C}, DType::F64), xp = Tensor::zeros({T * K, C}, DType::F64),
           h = Tensor::zeros({T * K, F1}, DType::F64), yp = Tensor::zeros({T * K, C}, DType::F64);
    MoeRouting route;
    forward(y, xp, h, yp, route);
    const std::vector<std::int64_t>& counts = route.counts;
    EXPECT_EQ(counts, (std::vector<std::int64_t>{5, 0, 4, 3}));
    // Stable: expert 0's rows are assignments 0, 4, 7, 9, 10 in order, then expert 2's, expert 3's.
    EXPECT_EQ(route.sources(), (std::vector<std::int64_t>{0, 4, 7, 9, 10, 1, 2, 5, 8, 3, 6, 11}));
    // Per-token reference: y_t = sum_k w_tk * MLP_{e_tk}(x_t).
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (std::int64_t k = 0; k < K; ++k) {
          const std::int64_t e = idx[static_cast<std::size_t>(t * K + k)];
          double out = 0;
          for (std::int64_t f = 0; f < F; ++f) {
            double hg = 0, hu = 0;
            for (std::int64_t j = 0; j < C; ++j) {
              hg += W1.get((e * F1 + f) * C + j) * x.get(t * C + j);
              if (act == Activation::SwiGLU) hu += W1.get((e * F1 + F + f) * C + j) * x.get(t * C + j);
            }
            const double a =
                act == Activation::SquaredReLU ? std::pow(std::max(hg, 0.0), 2) : hg / (1 + std::exp(-hg)) * hu;
            out += W2.get((e * C + c) * F + f) * a;
          }
          acc += tw.get(t * K + k) * out;
        }
        EXPECT_NEAR(y.get(t * C + c), acc, 1e-13);
      }
    auto loss = [&] {
      Tensor y2 = Tensor::zeros({T, C}, DType::F64), xp2 = Tensor::zeros({T * K, C}, DType::F64),
             h2 = Tensor::zeros({T * K, F1}, DType::F64), yp2 = Tensor::zeros({T * K, C}, DType::F64);
      MoeRouting r2;
      forward(y2, xp2, h2, yp2, r2);
      return test::dot(y2, dy);
    };
    Tensor dyp = Tensor::zeros(yp.shape(), DType::F64), dtw = Tensor::zeros(tw.shape(), DType::F64),
           dxp = Tensor::zeros(xp.shape(), DType::F64), dW1 = Tensor::zeros(W1.shape(), DType::F64),
           dW2 = Tensor::zeros(W2.shape(), DType::F64), dx = Tensor::zeros(x.shape(), DType::F64);
    moe_combine_bwd(dyp, dtw, dy, yp, route, tw);
    expert_mlp_bwd(dxp, dW1, dW2, xp, W1, W2, h, counts, act, dyp);
    moe_permute_bwd(dx, dxp, route);
    const std::string tag = act == Activation::SwiGLU ? " (swiglu)" : " (squared relu)";
    // dxp may be dyp itself (MoeLayer writes dx over dy): bitwise the same gradients.
    Tensor over = dyp.clone(), oW1 = Tensor::zeros(W1.shape(), DType::F64), oW2 = Tensor::zeros(W2.shape(), DType::F64);
    expert_mlp_bwd(over, oW1, oW2, xp, W1, W2, h, counts, act, over);
    EXPECT_EQ(over.to_vector(), dxp.to_vector()) << "dx written over dy" << tag;
    EXPECT_EQ(oW1.to_vector(), dW1.to_vector()) << "dW1 with dx over dy" << tag;
    EXPECT_EQ(oW2.to_vector(), dW2.to_vector()) << "dW2 with dx over dy" << tag;
    test::fd_check(x, dx, loss, "moe dx" + tag);
    test::fd_check(tw, dtw, loss, "moe dtopk_w" + tag);
    test::fd_check(W1, dW1, loss, "moe dW1" + tag);
    test::fd_check(W2, dW2, loss, "moe dW2" + tag);
    for (std::int64_t i = 0; i < F1 * C; ++i) EXPECT_EQ(dW1.get(1 * F1 * C + i), 0.0);  // idle expert
  }
}
