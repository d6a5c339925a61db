// CUDA kernels against the host kernels on the same random inputs: fp64 and fp32 tight, bf16 with
// a stated tolerance; several shapes, seq_idx (packed) cases, optional bias. Skips without a GPU.
#include <gtest/gtest.h>

#include <functional>

#include "kernels/cuda/runtime.hpp"
#include "kernels/kernels.hpp"
#include "unit/fd.hpp"

using namespace hcp;
using namespace hcp::kernels;

namespace {
bool gpu() {
  if (cuda::device_count() == 0) return false;
  cuda::init(0);
  return true;
}
#define REQUIRE_GPU() \
  if (!gpu()) GTEST_SKIP() << "no usable GPU (" << cuda::unavailable_reason() << ")"

// Relative to the reference's largest magnitude: fp64 1e-12, fp32 2e-5, bf16 2e-2.
double tol(DType d) { return d == DType::F64 ? 1e-12 : d == DType::F32 ? 2e-5 : 2e-2; }
void expect_match(const Tensor& dev, const Tensor& host, DType d, const std::string& what) {
  Tensor got = dev.to(Space::Host);
  ErrorStats e = compare(got, host);
  EXPECT_LE(e.max_abs, tol(d) * std::max(e.ref_max, 1e-30)) << what << " (" << to_string(d) << "): max abs " << e.max_abs
                                                             << ", reference max " << e.ref_max;
}
Tensor rnd(const Shape& s, std::uint64_t seed, DType d, double lo = -1, double hi = 1) {
  return test::rand(s, seed, lo, hi, d);
}
Tensor dev(const Tensor& t) { return t.to(Space::Cuda); }
Tensor zeros_like_on(const Tensor& t, Space sp) { return Tensor::zeros(t.shape(), t.dtype(), sp); }
const DType kTypes[] = {DType::F64, DType::F32, DType::BF16};
}  // namespace

TEST(CudaKernels, RmsNormForwardBackward) {
  REQUIRE_GPU();
  for (DType d : kTypes)
    for (auto [M, C] : {std::pair<std::int64_t, std::int64_t>{7, 33}, {64, 1024}, {3, 4096}}) {
      Tensor x = rnd({M, C}, 1, d), w = rnd({C}, 2, d, 0.5, 1.5), dy = rnd({M, C}, 3, d);
      Tensor y = Tensor::zeros({M, C}, d), r = Tensor::zeros({M}, d), dx = Tensor::zeros({M, C}, d), dw = Tensor::zeros({C}, d);
      rmsnorm_fwd(y, r, x, w, 1e-5);
      rmsnorm_bwd(dx, dw, x, w, r, dy);
      Tensor Y = zeros_like_on(y, Space::Cuda), R = zeros_like_on(r, Space::Cuda), DX = zeros_like_on(dx, Space::Cuda),
             DW = zeros_like_on(dw, Space::Cuda);
      Tensor X = dev(x), W = dev(w), DY = dev(dy);
      rmsnorm_fwd(Y, R, X, W, 1e-5);
      rmsnorm_bwd(DX, DW, X, W, R, DY);
      expect_match(Y, y, d, "rmsnorm y");
      expect_match(DX, dx, d, "rmsnorm dx");
      expect_match(DW, dw, d, "rmsnorm dw");
    }
}

TEST(CudaKernels, GatedRmsNormForwardBackward) {
  REQUIRE_GPU();
  for (DType d : kTypes)
    for (std::int64_t G : {1, 4}) {
      const std::int64_t M = 37, C = 256;
      Tensor x = rnd({M, C}, 4, d), z = rnd({M, C}, 5, d), w = rnd({C}, 6, d, 0.5, 1.5), dy = rnd({M, C}, 7, d);
      Tensor y = Tensor::zeros({M, C}, d), r = Tensor::zeros({M, G}, d), dx = Tensor::zeros({M, C}, d),
             dz = Tensor::zeros({M, C}, d), dw = Tensor::zeros({C}, d);
      gated_rmsnorm_fwd(y, r, x, z, w, G, 1e-5);
      gated_rmsnorm_bwd(dx, dz, dw, x, z, w, r, G, dy);
      Tensor Y = zeros_like_on(y, Space::Cuda), R = zeros_like_on(r, Space::Cuda), DX = zeros_like_on(dx, Space::Cuda),
             DZ = zeros_like_on(dz, Space::Cuda), DW = zeros_like_on(dw, Space::Cuda);
      Tensor X = dev(x), Z = dev(z), W = dev(w), DY = dev(dy);
      gated_rmsnorm_fwd(Y, R, X, Z, W, G, 1e-5);
      gated_rmsnorm_bwd(DX, DZ, DW, X, Z, W, R, G, DY);
      expect_match(Y, y, d, "gated y");
      expect_match(DX, dx, d, "gated dx");
      expect_match(DZ, dz, d, "gated dz");
      expect_match(DW, dw, d, "gated dw");
    }
}

TEST(CudaKernels, Conv1dForwardBackwardWithSeqIdx) {
  REQUIRE_GPU();
  for (DType d : kTypes)
    for (bool packed : {false, true})
      for (bool with_bias : {false, true}) {
        const std::int64_t B = packed ? 1 : 2, L = 45, C = 96, Wd = 4;
        std::vector<std::int64_t> seq;
        for (std::int64_t t = 0; t < B * L; ++t) seq.push_back(t < 10 ? 0 : t < 11 ? 1 : t < 30 ? 2 : 3);
        const std::vector<std::int64_t>* sp = packed ? &seq : nullptr;
        Tensor x = rnd({B, L, C}, 8, d), w = rnd({C, Wd}, 9, d), b = rnd({C}, 10, d), dy = rnd({B, L, C}, 11, d);
        Tensor y = Tensor::zeros(x.shape(), d), dx = Tensor::zeros(x.shape(), d), dw = Tensor::zeros(w.shape(), d),
               db = Tensor::zeros({C}, d);
        conv1d_fwd(y, x, w, with_bias ? &b : nullptr, sp, true);
        conv1d_bwd(dx, dw, with_bias ? &db : nullptr, x, w, with_bias ? &b : nullptr, sp, true, dy);
        Tensor X = dev(x), Wt = dev(w), Bt = dev(b), DY = dev(dy), Y = zeros_like_on(y, Space::Cuda),
               DX = zeros_like_on(dx, Space::Cuda), DW = zeros_like_on(dw, Space::Cuda), DB = zeros_like_on(db, Space::Cuda);
        conv1d_fwd(Y, X, Wt, with_bias ? &Bt : nullptr, sp, true);
        conv1d_bwd(DX, DW, with_bias ? &DB : nullptr, X, Wt, with_bias ? &Bt : nullptr, sp, true, DY);
        const std::string tag = std::string(packed ? " packed" : "") + (with_bias ? " bias" : "");
        expect_match(Y, y, d, "conv y" + tag);
        expect_match(DX, dx, d, "conv dx" + tag);
        expect_match(DW, dw, d, "conv dw" + tag);
        if (with_bias) expect_match(DB, db, d, "conv db" + tag);
      }
}

TEST(CudaKernels, LinearForwardBackward) {
  REQUIRE_GPU();
  for (DType d : kTypes)
    for (auto [M, K, N] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{5, 7, 3}, {128, 256, 384}}) {
      Tensor x = rnd({M, K}, 12, d), W = rnd({N, K}, 13, d), b = rnd({N}, 14, d), dy = rnd({M, N}, 15, d);
      Tensor y = Tensor::zeros({M, N}, d), dx = Tensor::zeros({M, K}, d), dW = Tensor::zeros({N, K}, d),
             db = Tensor::zeros({N}, d);
      linear_fwd(y, x, W, &b);
      linear_bwd(&dx, &dW, &db, x, W, dy);
      Tensor X = dev(x), Wt = dev(W), Bt = dev(b), DY = dev(dy), Y = zeros_like_on(y, Space::Cuda),
             DX = zeros_like_on(dx, Space::Cuda), DW = zeros_like_on(dW, Space::Cuda), DB = zeros_like_on(db, Space::Cuda);
      linear_fwd(Y, X, Wt, &Bt);
      linear_bwd(&DX, &DW, &DB, X, Wt, DY);
      expect_match(Y, y, d, "linear y");
      expect_match(DX, dx, d, "linear dx");
      expect_match(DW, dW, d, "linear dW");
      expect_match(DB, db, d, "linear db");
    }
}

TEST(CudaKernels, RopeEmbeddingCrossEntropyElementwise) {
  REQUIRE_GPU();
  for (DType d : kTypes) {
    const std::int64_t T = 29, H = 3, D = 16, V = 50, C = 24;
    std::vector<std::int64_t> pos, ids, labels;
    for (std::int64_t t = 0; t < T; ++t) {
      pos.push_back(1000 + 37 * t);
      ids.push_back((t * 7) % V);
      labels.push_back(t % 5 == 0 ? -100 : (t * 11) % V);
    }
    Tensor x = rnd({T, H, D}, 16, d), y = Tensor::zeros({T, H, D}, d), Y = Tensor::zeros({T, H, D}, d, Space::Cuda);
    rope_fwd(y, x, pos, 10000.0, 12);
    Tensor X = dev(x);
    rope_fwd(Y, X, pos, 10000.0, 12);
    expect_match(Y, y, d, "rope fwd");
    rope_bwd(y, x, pos, 10000.0, 12);
    rope_bwd(Y, X, pos, 10000.0, 12);
    expect_match(Y, y, d, "rope bwd");

    Tensor table = rnd({V, C}, 17, d), e = Tensor::zeros({T, C}, d), E = Tensor::zeros({T, C}, d, Space::Cuda);
    embedding_fwd(e, table, ids);
    embedding_fwd(E, dev(table), ids);
    expect_match(E, e, d, "embedding fwd");
    Tensor dy = rnd({T, C}, 18, d), dt = Tensor::zeros({V, C}, d), DT = Tensor::zeros({V, C}, d, Space::Cuda);
    embedding_bwd(dt, ids, dy);
    embedding_bwd(DT, ids, dev(dy));
    expect_match(DT, dt, d, "embedding bwd");

    Tensor logits = rnd({T, V}, 19, d, -3, 3), dl = Tensor::zeros({T, V}, d), DL = Tensor::zeros({T, V}, d, Space::Cuda);
    std::int64_t n1 = 0, n2 = 0;
    const double l1 = cross_entropy_fwd(logits, labels, -100, &n1);
    const double l2 = cross_entropy_fwd(dev(logits), labels, -100, &n2);
    EXPECT_EQ(n1, n2);
    EXPECT_NEAR(l2, l1, tol(d) * std::abs(l1)) << "cross-entropy loss " << to_string(d);
    cross_entropy_bwd(dl, logits, labels, -100, 0.25);
    cross_entropy_bwd(DL, dev(logits), labels, -100, 0.25);
    expect_match(DL, dl, d, "cross-entropy dlogits");

    Tensor a = rnd({T, C}, 20, d), b = rnd({T, C}, 21, d), s = Tensor::zeros({T, C}, d), S = Tensor::zeros({T, C}, d, Space::Cuda);
    add(s, a, b);
    add(S, dev(a), dev(b));
    expect_match(S, s, d, "add");
    axpy(s, -0.5, a);
    axpy(S, -0.5, dev(a));
    expect_match(S, s, d, "axpy");
  }
}

TEST(CudaKernels, BitwiseRepeatable) {
  REQUIRE_GPU();
  Tensor x = rnd({64, 96, 128}, 22, DType::F32), w = rnd({128, 4}, 23, DType::F32), dy = rnd({64, 96, 128}, 24, DType::F32);
  Tensor X = dev(x), W = dev(w), DY = dev(dy);
  std::vector<std::vector<double>> runs;
  for (int i = 0; i < 2; ++i) {
    Tensor DX = Tensor::zeros(x.shape(), DType::F32, Space::Cuda), DW = Tensor::zeros(w.shape(), DType::F32, Space::Cuda);
    conv1d_bwd(DX, DW, nullptr, X, W, nullptr, nullptr, true, DY);
    runs.push_back(DW.to(Space::Host).to_vector());
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(CudaKernels, HostOnlyOpsOnCudaTensorsSayWhy) {
  REQUIRE_GPU();
  // Ops without a CUDA implementation yet name the tensor's space instead of reading device memory.
  Tensor q = Tensor::zeros({4, 2, 8}, DType::F32, Space::Cuda), o = Tensor::zeros({4, 2, 8}, DType::F32, Space::Cuda),
         lse = Tensor::zeros({4, 2}, DType::F32, Space::Cuda);
  AttnParams p;
  p.heads = p.kv_heads = 2;
  p.head_dim = 8;
  p.segments = {{0, 4, 0, 4, 0, 0}};
  EXPECT_NE(test::error_of([&] { attention_fwd(o, lse, q, q, q, p); }).find("CUDA"), std::string::npos);
}
