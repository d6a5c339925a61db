// Host kernels against PyTorch (fp64) golden files made by tests/golden/make_golden.py on the GPU
// machine: SDPA attention (causal and full, GQA), RMSNorm, conv1d, RoPE, the MoE router,
// cross-entropy and an autograd Mamba2 recurrence; forward and gradients.
#include <gtest/gtest.h>

#include "io/results.hpp"
#include "kernels/kernels.hpp"
#include "unit/fd.hpp"

using namespace hcp;
using namespace hcp::kernels;

namespace {
const std::string kGolden = std::string(HCP_TEST_DATA_DIR) + "/golden/golden.h5";
// fp64 on both sides; the only differences are summation order: 1e-12 relative is ample.
constexpr double kAtol = 1e-12, kRtol = 1e-10;

std::vector<std::int64_t> as_ids(const Tensor& t) {
  std::vector<std::int64_t> v;
  for (double x : t.to_vector()) v.push_back(static_cast<std::int64_t>(x));
  return v;
}
Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.shape(), DType::F64); }
}  // namespace

TEST(Golden, AttentionSdpa) {
  ResultsReader g(kGolden);
  for (std::string tag : {"attention_causal", "attention_full"}) {
    Tensor q = g.read("/" + tag + "/q"), k = g.read("/" + tag + "/k"), v = g.read("/" + tag + "/v");
    Tensor dout = g.read("/" + tag + "/dout");
    const std::int64_t B = q.size(0), L = q.size(1);
    AttnParams p;
    p.heads = q.size(2);
    p.kv_heads = k.size(2);
    p.head_dim = q.size(3);
    p.mask = tag == "attention_causal" ? Mask::Causal : Mask::None;
    p.segments = segments_from_layout(SeqLayout::bshd(B, L), SeqLayout::bshd(B, L));
    Tensor o = zeros_like(q), lse = Tensor::zeros({B * L, p.heads}, DType::F64);
    attention_fwd(o, lse, q, k, v, p);
    test::expect_close(o, g.read("/" + tag + "/out"), kAtol, kRtol, tag + " out");
    Tensor dq = zeros_like(q), dk = zeros_like(k), dv = zeros_like(v);
    attention_bwd(dq, dk, dv, q, k, v, o, lse, dout, p);
    test::expect_close(dq, g.read("/" + tag + "/dq"), kAtol, kRtol, tag + " dq");
    test::expect_close(dk, g.read("/" + tag + "/dk"), kAtol, kRtol, tag + " dk");
    test::expect_close(dv, g.read("/" + tag + "/dv"), kAtol, kRtol, tag + " dv");
  }
}

TEST(Golden, RmsNormConvRope) {
  ResultsReader g(kGolden);
  {
    Tensor x = g.read("/rmsnorm/x"), w = g.read("/rmsnorm/w"), dy = g.read("/rmsnorm/dy");
    Tensor y = zeros_like(x), r = Tensor::zeros({x.size(0)}, DType::F64), dx = zeros_like(x), dw = zeros_like(w);
    rmsnorm_fwd(y, r, x, w, 1e-5);
    rmsnorm_bwd(dx, dw, x, w, r, dy);
    test::expect_close(y, g.read("/rmsnorm/y"), kAtol, kRtol, "rmsnorm y");
    test::expect_close(dx, g.read("/rmsnorm/dx"), kAtol, kRtol, "rmsnorm dx");
    test::expect_close(dw, g.read("/rmsnorm/dw"), kAtol, kRtol, "rmsnorm dw");
  }
  {
    Tensor x = g.read("/conv1d/x"), w = g.read("/conv1d/w"), b = g.read("/conv1d/b"), dy = g.read("/conv1d/dy");
    Tensor y = zeros_like(x), dx = zeros_like(x), dw = zeros_like(w), db = zeros_like(b);
    conv1d_fwd(y, x, w, &b, nullptr, true);
    conv1d_bwd(dx, dw, &db, x, w, &b, nullptr, true, dy);
    test::expect_close(y, g.read("/conv1d/y"), kAtol, kRtol, "conv1d y");
    test::expect_close(dx, g.read("/conv1d/dx"), kAtol, kRtol, "conv1d dx");
    test::expect_close(dw, g.read("/conv1d/dw"), kAtol, kRtol, "conv1d dw");
    test::expect_close(db, g.read("/conv1d/db"), kAtol, kRtol, "conv1d db");
  }
  {
    Tensor x = g.read("/rope/x"), dy = g.read("/rope/dy");
    auto pos = as_ids(g.read("/rope/positions"));
    Tensor y = zeros_like(x), dx = zeros_like(x);
    rope_fwd(y, x, pos, 10000.0, x.size(2));
    rope_bwd(dx, dy, pos, 10000.0, x.size(2));
    test::expect_close(y, g.read("/rope/y"), kAtol, kRtol, "rope y");
    test::expect_close(dx, g.read("/rope/dx"), kAtol, kRtol, "rope dx");
  }
}

TEST(Golden, RouterAndCrossEntropy) {
  ResultsReader g(kGolden);
  {
    Tensor logits = g.read("/router/logits"), bias = g.read("/router/bias"), dw = g.read("/router/dw");
    RouterParams p;
    p.experts = logits.size(1);
    p.topk = dw.size(1);
    p.sigmoid = true;
    p.scaling = 2.5;
    Tensor s = zeros_like(logits), w = zeros_like(dw), dl = zeros_like(logits);
    MoeRouting idx;
    router_fwd(s, idx, w, logits, &bias, p);
    EXPECT_EQ(idx.indices(), as_ids(g.read("/router/topk_idx")));
    test::expect_close(s, g.read("/router/scores"), kAtol, kRtol, "router scores");
    // torch renormalises without the 1e-20 guard: a relative 1e-20 difference.
    test::expect_close(w, g.read("/router/topk_w"), kAtol, kRtol, "router topk_w");
    router_bwd(dl, s, idx, dw, nullptr, p);
    test::expect_close(dl, g.read("/router/dlogits"), kAtol, kRtol, "router dlogits");
  }
  {
    Tensor logits = g.read("/cross_entropy/logits");
    auto labels = as_ids(g.read("/cross_entropy/labels"));
    std::int64_t n = 0;
    double loss = cross_entropy_fwd(logits, labels, -100, &n);
    EXPECT_EQ(n, 8);
    EXPECT_NEAR(loss, g.read("/cross_entropy/loss").get(0), 1e-12);
    Tensor dl = zeros_like(logits);
    cross_entropy_bwd(dl, logits, labels, -100, 1.0);
    test::expect_close(dl, g.read("/cross_entropy/dlogits"), kAtol, kRtol, "cross-entropy dlogits");
  }
}

TEST(Golden, Mamba2Ssd) {
  ResultsReader g(kGolden);
  Tensor x = g.read("/ssd/x"), dt = g.read("/ssd/dt"), A_log = g.read("/ssd/A_log"), B = g.read("/ssd/B"),
         C = g.read("/ssd/C"), D = g.read("/ssd/D"), dtb = g.read("/ssd/dt_bias"), dy = g.read("/ssd/dy");
  SsdParams p;
  p.batch = x.size(0);
  p.seqlen = x.size(1);
  p.heads = x.size(2);
  p.head_dim = x.size(3);
  p.groups = B.size(2);
  p.d_state = B.size(3);
  p.chunk = 4;  // 11 tokens: two full chunks and a ragged one
  const SsdInputs in{&x, &dt, &A_log, &B, &C, &D, &dtb};
  Tensor y = zeros_like(x);
  ssd_fwd(y, nullptr, in, p);
  test::expect_close(y, g.read("/ssd/y"), kAtol, kRtol, "ssd y");
  Tensor dx = zeros_like(x), ddt = zeros_like(dt), dA = zeros_like(A_log), dB = zeros_like(B), dC = zeros_like(C),
         dD = zeros_like(D), ddb = zeros_like(dtb);
  SsdGrads gr{&dx, &ddt, &dA, &dB, &dC, &dD, &ddb, nullptr};
  ssd_bwd(gr, in, dy, nullptr, p);
  for (auto [name, t] : std::vector<std::pair<std::string, Tensor*>>{
           {"dx", &dx}, {"ddt", &ddt}, {"dA_log", &dA}, {"dB", &dB}, {"dC", &dC}, {"dD", &dD}, {"ddt_bias", &ddb}})
    test::expect_close(*t, g.read("/ssd/" + name), kAtol, kRtol, "ssd " + name);
}
