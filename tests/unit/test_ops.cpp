// conv1d, norms, linear, RoPE, embedding, cross-entropy: finite-difference gradients and
// independent checks of the forward; the float exp of the host softmax against libm; the host GEMM.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/host/common.hpp"
#include "kernels/host/gemm.hpp"
#include "kernels/kernels.hpp"
#include "unit/fd.hpp"

using namespace hcp;
using namespace hcp::kernels;
using hcp::test::rand;

TEST(Conv1d, ForwardByHandAndGradients) {
  const std::int64_t B = 2, L = 7, C = 3, W = 4;
  Tensor x = rand({B, L, C}, 1), w = rand({C, W}, 2), b = rand({C}, 3), dy = rand({B, L, C}, 4);
  // Packed: row 0 holds sequences [0,3) and [3,7).
  std::vector<std::int64_t> seq{0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
  for (bool silu : {false, true})
    for (bool packed : {false, true}) {
      const std::vector<std::int64_t>* s = packed ? &seq : nullptr;
      Tensor y = Tensor::zeros(x.shape(), DType::F64);
      conv1d_fwd(y, x, w, &b, s, silu);
      // Token 3 of row 0 starts a sequence when packed: only its own tap counts.
      double u = b.get(1) + w.get(1 * W + 3) * x.get((0 * L + 3) * C + 1);
      if (!packed)
        for (int k = 0; k < 3; ++k) u += w.get(1 * W + k) * x.get((0 * L + k) * C + 1);
      EXPECT_NEAR(y.get((0 * L + 3) * C + 1), silu ? u / (1 + std::exp(-u)) : u, 1e-14);
      auto loss = [&] {
        Tensor yy = Tensor::zeros(x.shape(), DType::F64);
        conv1d_fwd(yy, x, w, &b, s, silu);
        return test::dot(yy, dy);
      };
      Tensor dx = Tensor::zeros(x.shape(), DType::F64), dw = Tensor::zeros(w.shape(), DType::F64),
             db = Tensor::zeros(b.shape(), DType::F64);
      conv1d_bwd(dx, dw, &db, x, w, &b, s, silu, dy);
      test::fd_check(x, dx, loss, "conv dx");
      test::fd_check(w, dw, loss, "conv dw");
      test::fd_check(b, db, loss, "conv dbias");
    }
}

TEST(Conv1d, PackedEqualsOneByOne) {
  const std::int64_t L = 9, C = 2, W = 4;
  Tensor x = rand({1, L, C}, 5), w = rand({C, W}, 6);
  std::vector<std::int64_t> seq{0, 0, 1, 1, 1, 1, 2, 2, 2};
  Tensor y = Tensor::zeros(x.shape(), DType::F64);
  conv1d_fwd(y, x, w, nullptr, &seq, true);
  for (auto [s0, n] : {std::pair<int, int>{0, 2}, {2, 4}, {6, 3}}) {
    Tensor xs = x.slice(1, s0, n).clone(), ys = Tensor::zeros(xs.shape(), DType::F64);
    conv1d_fwd(ys, xs, w, nullptr, nullptr, true);
    EXPECT_EQ(y.slice(1, s0, n).clone().to_vector(), ys.to_vector());
  }
}

TEST(Norms, RmsNormGradients) {
  const std::int64_t M = 5, C = 6;
  Tensor x = rand({M, C}, 7), w = rand({C}, 8, 0.5, 1.5), dy = rand({M, C}, 9);
  auto loss = [&] {
    Tensor y = Tensor::zeros(x.shape(), DType::F64), r = Tensor::zeros({M}, DType::F64);
    rmsnorm_fwd(y, r, x, w, 1e-5);
    return test::dot(y, dy);
  };
  Tensor y = Tensor::zeros(x.shape(), DType::F64), r = Tensor::zeros({M}, DType::F64);
  rmsnorm_fwd(y, r, x, w, 1e-5);
  double ss = 0;
  for (int c = 0; c < C; ++c) ss += x.get(c) * x.get(c);
  EXPECT_NEAR(y.get(2), x.get(2) / std::sqrt(ss / C + 1e-5) * w.get(2), 1e-14);
  Tensor dx = Tensor::zeros(x.shape(), DType::F64), dw = Tensor::zeros(w.shape(), DType::F64);
  rmsnorm_bwd(dx, dw, x, w, r, dy);
  test::fd_check(x, dx, loss, "rmsnorm dx");
  test::fd_check(w, dw, loss, "rmsnorm dw");
}

TEST(Norms, GatedGroupRmsNormGradients) {
  const std::int64_t M = 3, C = 8, G = 2;
  Tensor x = rand({M, C}, 10), z = rand({M, C}, 11), w = rand({C}, 12, 0.5, 1.5), dy = rand({M, C}, 13);
  auto loss = [&] {
    Tensor y = Tensor::zeros(x.shape(), DType::F64), r = Tensor::zeros({M, G}, DType::F64);
    gated_rmsnorm_fwd(y, r, x, z, w, G, 1e-5);
    return test::dot(y, dy);
  };
  Tensor y = Tensor::zeros(x.shape(), DType::F64), r = Tensor::zeros({M, G}, DType::F64);
  gated_rmsnorm_fwd(y, r, x, z, w, G, 1e-5);
  // Group 1 of row 0 normalises channels 4..7 only.
  double ss = 0;
  auto g = [&](int c) { return x.get(c) * z.get(c) / (1 + std::exp(-z.get(c))); };
  for (int c = 4; c < 8; ++c) ss += g(c) * g(c);
  EXPECT_NEAR(y.get(5), g(5) / std::sqrt(ss / 4 + 1e-5) * w.get(5), 1e-14);
  Tensor dx = Tensor::zeros(x.shape(), DType::F64), dz = Tensor::zeros(z.shape(), DType::F64),
         dw = Tensor::zeros(w.shape(), DType::F64);
  gated_rmsnorm_bwd(dx, dz, dw, x, z, w, r, G, dy);
  test::fd_check(x, dx, loss, "gated dx");
  test::fd_check(z, dz, loss, "gated dz");
  test::fd_check(w, dw, loss, "gated dw");
  Tensor w7 = rand({7}, 1);
  EXPECT_NE(
      test::error_of([&] { gated_rmsnorm_fwd(y, r, x, z, w7, 2, 1e-5); }).find("groups (2) must divide channels (7)"),
      std::string::npos);
}

TEST(Dense, LinearGradients) {
  const std::int64_t M = 4, K = 5, N = 3;
  Tensor x = rand({M, K}, 14), W = rand({N, K}, 15), b = rand({N}, 16), dy = rand({M, N}, 17);
  auto loss = [&] {
    Tensor y = Tensor::zeros({M, N}, DType::F64);
    linear_fwd(y, x, W, &b);
    return test::dot(y, dy);
  };
  Tensor y = Tensor::zeros({M, N}, DType::F64);
  linear_fwd(y, x, W, &b);
  double e = b.get(1);
  for (int k = 0; k < K; ++k) e += x.get(2 * K + k) * W.get(1 * K + k);
  EXPECT_NEAR(y.get(2 * N + 1), e, 1e-14);
  Tensor dx = Tensor::zeros(x.shape(), DType::F64), dW = Tensor::zeros(W.shape(), DType::F64),
         db = Tensor::zeros(b.shape(), DType::F64);
  linear_bwd(&dx, &dW, &db, x, W, dy);
  test::fd_check(x, dx, loss, "linear dx");
  test::fd_check(W, dW, loss, "linear dW");
  test::fd_check(b, db, loss, "linear db");
  Tensor bad = rand({M, 4}, 1);
  EXPECT_NE(test::error_of([&] { linear_fwd(y, bad, W, nullptr); }).find("is not [M, K=5]"), std::string::npos);
}

TEST(Dense, RopeRotatesByGlobalPositionAndInverts) {
  const std::int64_t T = 4, H = 2, D = 6;
  Tensor x = rand({T, H, D}, 18), dy = rand({T, H, D}, 19);
  std::vector<std::int64_t> pos{0, 5, 1000, 70000};
  Tensor y = Tensor::zeros(x.shape(), DType::F64);
  rope_fwd(y, x, pos, 10000.0, 4);
  EXPECT_EQ(y.get(0), x.get(0));                                          // position 0: identity
  EXPECT_EQ(y.get(((1 * H) + 0) * D + 5), x.get(((1 * H) + 0) * D + 5));  // beyond rotary_dim: passthrough
  const double ang = 5.0;                                                 // position 5, pair 0 (frequency 1)
  EXPECT_NEAR(y.get((1 * H) * D + 0), x.get((1 * H) * D) * std::cos(ang) - x.get((1 * H) * D + 2) * std::sin(ang),
              1e-14);
  auto loss = [&] {
    Tensor yy = Tensor::zeros(x.shape(), DType::F64);
    rope_fwd(yy, x, pos, 10000.0, 4);
    return test::dot(yy, dy);
  };
  Tensor dx = Tensor::zeros(x.shape(), DType::F64);
  rope_bwd(dx, dy, pos, 10000.0, 4);
  test::fd_check(x, dx, loss, "rope dx");
  Tensor back = Tensor::zeros(x.shape(), DType::F64);
  rope_bwd(back, y, pos, 10000.0, 4);
  test::expect_close(back, x, 1e-14, 1e-13, "rope inverse");
}

TEST(Dense, EmbeddingAndCrossEntropy) {
  const std::int64_t V = 5, C = 3;
  Tensor table = rand({V, C}, 20);
  std::vector<std::int64_t> ids{1, 4, 1, 0};
  Tensor y = Tensor::zeros({4, C}, DType::F64), dy = rand({4, C}, 21);
  embedding_fwd(y, table, ids);
  EXPECT_EQ(y.get(2 * C + 1), table.get(1 * C + 1));
  auto eloss = [&] {
    Tensor yy = Tensor::zeros({4, C}, DType::F64);
    embedding_fwd(yy, table, ids);
    return test::dot(yy, dy);
  };
  Tensor dt = Tensor::zeros(table.shape(), DType::F64);
  embedding_bwd(dt, ids, dy);
  test::fd_check(table, dt, eloss, "embedding dtable");
  EXPECT_NE(test::error_of([&] {
              embedding_fwd(y, table, {1, 5, 0, 0});
            }).find("token id 5 outside"),
            std::string::npos);

  Tensor logits = rand({4, V}, 22, -3, 3);
  std::vector<std::int64_t> labels{2, -100, 4, 0};
  std::int64_t n = 0;
  double l = cross_entropy_fwd(logits, labels, -100, &n);
  EXPECT_EQ(n, 3);
  double e = 0;
  for (int t : {0, 2, 3}) {
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(logits.get(t * V + v));
    e += std::log(z) - logits.get(t * V + labels[t]);
  }
  EXPECT_NEAR(l, e, 1e-13);
  auto closs = [&] { return cross_entropy_fwd(logits, labels, -100, nullptr) / 3.0; };
  Tensor dl = Tensor::zeros(logits.shape(), DType::F64);
  cross_entropy_bwd(dl, logits, labels, -100, 1.0 / 3.0);
  test::fd_check(logits, dl, closs, "cross-entropy dlogits");
  EXPECT_NE(test::error_of([&] {
              cross_entropy_fwd(logits, {7, 0, 0, 0}, -100, nullptr);
            }).find("label 7 outside"),
            std::string::npos);
}

// The float exp of the host softmax against libm in double: within 2 ulp on [-87, 88], monotone,
// exact at 0; below -87 a tiny positive value; double goes to libm itself.
TEST(HostExp, FloatWithinTwoUlpOfLibm) {
  std::vector<float> x;
  for (double v = -87.0; v <= 88.0; v += 0.00731) x.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 1e-8f, -1e-8f, 0.34657f, -0.34657f, 88.0f, -87.0f}) x.push_back(v);
  std::vector<float> y = x;
  host::exp_inplace(y.data(), static_cast<std::int64_t>(y.size()));
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double ref = std::exp(static_cast<double>(x[i]));
    worst = std::max(worst, std::abs(y[i] - ref) / ref);
  }
  EXPECT_LE(worst, 2.0 * 0x1p-23) << "worst relative error " << worst;
  float one = 0.0f;
  host::exp_inplace(&one, 1);
  EXPECT_EQ(one, 1.0f);
  std::vector<float> ramp;
  for (int i = 0; i < 20000; ++i) ramp.push_back(-20.0f + 0.001f * static_cast<float>(i));
  host::exp_inplace(ramp.data(), static_cast<std::int64_t>(ramp.size()));
  for (std::size_t i = 1; i < ramp.size(); ++i) EXPECT_LE(ramp[i - 1], ramp[i]) << "at " << i;
  float low[2] = {-100.0f, -1e30f};
  host::exp_inplace(low, 2);
  EXPECT_TRUE(low[0] > 0 && low[0] < 1e-37f && low[1] == low[0]);
  double d = -1.5;
  host::exp_inplace(&d, 1);
  EXPECT_EQ(d, std::exp(-1.5));
}

// The host GEMM (BLAS or loops) against a plain triple loop: every transpose pair, leading
// dimensions wider than the rows, alpha and beta, and K = 0 (C = beta C).
TEST(HostGemm, TransposesStridesAlphaBeta) {
  std::vector<double> A(400), B(400), C(400);
  for (std::size_t i = 0; i < A.size(); ++i) {
    A[i] = std::sin(0.37 * static_cast<double>(i));
    B[i] = std::cos(0.91 * static_cast<double>(i));
    C[i] = std::sin(1.3 * static_cast<double>(i) + 0.2);
  }
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (std::int64_t K : {9, 0}) {
        const std::int64_t M = 7, N = 5, lda = ta ? M + 2 : K + 1, ldb = tb ? K + 3 : N + 1, ldc = N + 2;
        std::vector<double> got = C;
        host::gemm(ta, tb, M, N, K, 0.5, A.data(), lda, B.data(), ldb, 2.0, got.data(), ldc);
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (std::int64_t k = 0; k < K; ++k)
              s += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            EXPECT_NEAR(got[i * ldc + j], 0.5 * s + 2.0 * C[i * ldc + j], 1e-13) << ta << tb << " K " << K;
          }
        for (std::int64_t i = 0; i < M; ++i)  // the padding between rows is left alone
          for (std::int64_t j = N; j < ldc; ++j) EXPECT_EQ(got[i * ldc + j], C[i * ldc + j]);
      }
}
