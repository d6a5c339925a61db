// CUDA kernels against the host kernels on the same random inputs: fp64 and fp32 tight, bf16 with
// a stated tolerance; several shapes, seq_idx (packed) cases, optional bias. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#include "cuda/gpu.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/kernels.hpp"
#include "unit/fd.hpp"
#include "unit/ssd_case.hpp"

using namespace hcp;
using namespace hcp::kernels;

namespace {

// Relative to the reference's largest magnitude: fp64 1e-12, fp32 2e-5, bf16 2e-2.
double tol(DType d) { return d == DType::F64 ? 1e-12 : d == DType::F32 ? 2e-5 : 2e-2; }
void expect_match(const Tensor& dev, const Tensor& host, DType d, const std::string& what) {
  Tensor got = dev.to(Space::Host);
  ErrorStats e = compare(got, host);
  EXPECT_LE(e.max_abs, tol(d) * std::max(e.ref_max, 1e-30))
      << what << " (" << to_string(d) << "): max abs " << e.max_abs << ", reference max " << e.ref_max;
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
      Tensor y = Tensor::zeros({M, C}, d), r = Tensor::zeros({M}, d), dx = Tensor::zeros({M, C}, d),
             dw = Tensor::zeros({C}, d);
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
  // Widths 2, 4 (the vectorised forward), 7 and 16 (the deck's limit); rows of 45 and 700 tokens (the
  // weight-gradient reduction splits the rows into slices); 96 channels (a partial 32-channel block).
  for (DType d : kTypes)
    for (auto [Wd, L] : {std::pair<std::int64_t, std::int64_t>{4, 45}, {2, 45}, {7, 700}, {16, 45}, {4, 700}})
      for (bool packed : {false, true})
        for (bool with_bias : {false, true}) {
          const std::int64_t B = packed ? 1 : 2, C = 96;
          std::vector<std::int64_t> seq;
          for (std::int64_t t = 0; t < B * L; ++t) seq.push_back(t < 10 ? 0 : t < 11 ? 1 : t < 30 ? 2 : 3);
          const std::vector<std::int64_t>* sp = packed ? &seq : nullptr;
          Tensor x = rnd({B, L, C}, 8, d), w = rnd({C, Wd}, 9, d), b = rnd({C}, 10, d), dy = rnd({B, L, C}, 11, d);
          Tensor y = Tensor::zeros(x.shape(), d), dx = Tensor::zeros(x.shape(), d), dw = Tensor::zeros(w.shape(), d),
                 db = Tensor::zeros({C}, d);
          conv1d_fwd(y, x, w, with_bias ? &b : nullptr, sp, true);
          conv1d_bwd(dx, dw, with_bias ? &db : nullptr, x, w, with_bias ? &b : nullptr, sp, true, dy);
          Tensor X = dev(x), Wt = dev(w), Bt = dev(b), DY = dev(dy), Y = zeros_like_on(y, Space::Cuda),
                 DX = zeros_like_on(dx, Space::Cuda), DW = zeros_like_on(dw, Space::Cuda),
                 DB = zeros_like_on(db, Space::Cuda);
          conv1d_fwd(Y, X, Wt, with_bias ? &Bt : nullptr, sp, true);
          conv1d_bwd(DX, DW, with_bias ? &DB : nullptr, X, Wt, with_bias ? &Bt : nullptr, sp, true, DY);
          const std::string tag = std::string(packed ? " packed" : "") + (with_bias ? " bias" : "") + " W" +
                                  std::to_string(Wd) + " L" + std::to_string(L);
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
             DX = zeros_like_on(dx, Space::Cuda), DW = zeros_like_on(dW, Space::Cuda),
             DB = zeros_like_on(db, Space::Cuda);
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
    // (head_dim, rotary_dim): scalar path (rd/2 not a vector multiple), vector path with a pass-through
    // tail, full rotation; positions up to ~1e5 test the fp64 angle.
    for (auto [Dr, rd] : {std::pair<std::int64_t, std::int64_t>{D, 12}, {64, 32}, {128, 128}}) {
      std::vector<std::int64_t> far;
      for (std::int64_t t = 0; t < T; ++t) far.push_back(Dr == D ? pos[static_cast<std::size_t>(t)] : 99000 + 37 * t);
      Tensor x = rnd({T, H, Dr}, 16, d), y = Tensor::zeros({T, H, Dr}, d),
             Y = Tensor::zeros({T, H, Dr}, d, Space::Cuda);
      rope_fwd(y, x, far, 10000.0, rd);
      Tensor X = dev(x);
      rope_fwd(Y, X, far, 10000.0, rd);
      const std::string tag = " D" + std::to_string(Dr) + " rd" + std::to_string(rd);
      expect_match(Y, y, d, "rope fwd" + tag);
      rope_bwd(y, x, far, 10000.0, rd);
      rope_bwd(Y, X, far, 10000.0, rd);
      expect_match(Y, y, d, "rope bwd" + tag);
    }

    Tensor table = rnd({V, C}, 17, d), e = Tensor::zeros({T, C}, d), E = Tensor::zeros({T, C}, d, Space::Cuda);
    embedding_fwd(e, table, ids);
    embedding_fwd(E, dev(table), ids);
    expect_match(E, e, d, "embedding fwd");
    Tensor dy = rnd({T, C}, 18, d), dt = Tensor::zeros({V, C}, d), DT = Tensor::zeros({V, C}, d, Space::Cuda);
    embedding_bwd(dt, ids, dy);
    embedding_bwd(DT, ids, dev(dy));
    expect_match(DT, dt, d, "embedding bwd");

    Tensor logits = rnd({T, V}, 19, d, -3, 3), dl = Tensor::zeros({T, V}, d),
           DL = Tensor::zeros({T, V}, d, Space::Cuda);
    std::int64_t n1 = 0, n2 = 0;
    const double l1 = cross_entropy_fwd(logits, labels, -100, &n1);
    const double l2 = cross_entropy_fwd(dev(logits), labels, -100, &n2);
    EXPECT_EQ(n1, n2);
    EXPECT_NEAR(l2, l1, tol(d) * std::abs(l1)) << "cross-entropy loss " << to_string(d);
    cross_entropy_bwd(dl, logits, labels, -100, 0.25);
    cross_entropy_bwd(DL, dev(logits), labels, -100, 0.25);
    expect_match(DL, dl, d, "cross-entropy dlogits");

    Tensor a = rnd({T, C}, 20, d), b = rnd({T, C}, 21, d), s = Tensor::zeros({T, C}, d),
           S = Tensor::zeros({T, C}, d, Space::Cuda);
    add(s, a, b);
    add(S, dev(a), dev(b));
    expect_match(S, s, d, "add");
    axpy(s, -0.5, a);
    axpy(S, -0.5, dev(a));
    expect_match(S, s, d, "axpy");
  }
}

TEST(CudaKernels, DtypeConversionMatchesHost) {
  REQUIRE_GPU();
  // Device Tensor::to(DType) against the host conversion, bit for bit: every pair of dtypes, values
  // spanning many binades (and bf16 rounding ties), a contiguous tensor and a strided slice.
  Tensor base = rnd({37, 29}, 91, DType::F64, -3, 3);
  for (std::int64_t i = 0; i < base.numel(); ++i)
    base.set(i, base.get(i) * std::pow(10.0, static_cast<double>(i % 13) - 6));
  base.set(0, 1.0 + 1.0 / 256);  // a bf16 tie (rounds to even)
  base.set(1, 0.0);
  for (DType from : kTypes)
    for (DType to : kTypes) {
      const Tensor h = base.to(from);
      for (bool strided : {false, true}) {
        const Tensor hs = strided ? h.slice(1, 3, 20) : h;
        const Tensor want = hs.to(to);
        const Tensor got = dev(h).slice(1, strided ? 3 : 0, strided ? 20 : 29).to(to).to(Space::Host);
        ASSERT_EQ(got.shape(), want.shape());
        const Tensor w = want.is_contiguous() ? want : want.clone();
        EXPECT_EQ(std::memcmp(got.raw(), w.raw(), w.nbytes()), 0)
            << to_string(from) << " -> " << to_string(to) << (strided ? " (strided)" : "");
      }
    }
}

TEST(CudaKernels, BitwiseRepeatable) {
  REQUIRE_GPU();
  Tensor x = rnd({64, 96, 128}, 22, DType::F32), w = rnd({128, 4}, 23, DType::F32),
         dy = rnd({64, 96, 128}, 24, DType::F32);
  Tensor X = dev(x), W = dev(w), DY = dev(dy);
  std::vector<std::vector<double>> runs;
  for (int i = 0; i < 2; ++i) {
    Tensor DX = Tensor::zeros(x.shape(), DType::F32, Space::Cuda),
           DW = Tensor::zeros(w.shape(), DType::F32, Space::Cuda);
    conv1d_bwd(DX, DW, nullptr, X, W, nullptr, nullptr, true, DY);
    runs.push_back(DW.to(Space::Host).to_vector());
  }
  EXPECT_EQ(runs[0], runs[1]);
  // The tensor-core attention backward (dK/dV summed over heads and segments without atomics).
  AttnParams p;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 64;
  p.segments = {{0, 150, 0, 150, 0, 0}, {150, 90, 0, 150, 60, 0}};
  Tensor q = dev(rnd({240, 4, 64}, 25, DType::BF16)), k = dev(rnd({150, 2, 64}, 26, DType::BF16)),
         v = dev(rnd({150, 2, 64}, 27, DType::BF16)), dout = dev(rnd({240, 4, 64}, 28, DType::BF16));
  std::vector<std::vector<double>> grads;
  for (int i = 0; i < 2; ++i) {
    Tensor o = Tensor::zeros(q.shape(), DType::BF16, Space::Cuda),
           lse = Tensor::zeros({240, 4}, DType::F32, Space::Cuda);
    Tensor dq = Tensor::zeros(q.shape(), DType::BF16, Space::Cuda),
           dk = Tensor::zeros(k.shape(), DType::BF16, Space::Cuda),
           dv = Tensor::zeros(v.shape(), DType::BF16, Space::Cuda);
    attention_fwd(o, lse, q, k, v, p);
    attention_bwd(dq, dk, dv, q, k, v, o, lse, dout, p);
    std::vector<double> all = o.to(Space::Host).to_vector();
    for (const Tensor* t : {&dq, &dk, &dv}) {
      const auto x = t->to(Space::Host).to_vector();
      all.insert(all.end(), x.begin(), x.end());
    }
    grads.push_back(all);
  }
  EXPECT_EQ(grads[0], grads[1]);
  // Many key tiles adding to each query block (the fused backward orders its fp32 dQ adds): one
  // causal sequence of 2048 tokens, D 128, five runs.
  AttnParams p2;
  p2.heads = 4;
  p2.kv_heads = 2;
  p2.head_dim = 128;
  p2.segments = {{0, 2048, 0, 2048, 0, 0}};
  Tensor q2 = dev(rnd({2048, 4, 128}, 29, DType::BF16)), k2 = dev(rnd({2048, 2, 128}, 30, DType::BF16)),
         v2 = dev(rnd({2048, 2, 128}, 31, DType::BF16)), do2 = dev(rnd({2048, 4, 128}, 32, DType::BF16));
  Tensor o2 = Tensor::zeros(q2.shape(), DType::BF16, Space::Cuda),
         lse2 = Tensor::zeros({2048, 4}, DType::F32, Space::Cuda);
  attention_fwd(o2, lse2, q2, k2, v2, p2);
  // Every repeatable form of the backward (bench.variant's), five runs each.
  for (AttnBwdKernel form : {AttnBwdKernel::Auto, AttnBwdKernel::Split, AttnBwdKernel::Fused}) {
    p2.bwd_kernel = form;
    std::vector<double> first;
    for (int i = 0; i < 5; ++i) {
      Tensor dq = Tensor::zeros(q2.shape(), DType::BF16, Space::Cuda),
             dk = Tensor::zeros(k2.shape(), DType::BF16, Space::Cuda),
             dv = Tensor::zeros(v2.shape(), DType::BF16, Space::Cuda);
      attention_bwd(dq, dk, dv, q2, k2, v2, o2, lse2, do2, p2);
      std::vector<double> all = dq.to(Space::Host).to_vector();
      for (const Tensor* t : {&dk, &dv}) {
        const auto x = t->to(Space::Host).to_vector();
        all.insert(all.end(), x.begin(), x.end());
      }
      if (i == 0)
        first = all;
      else
        EXPECT_EQ(first, all) << "attention backward (" << to_string(form) << ") run " << i;
    }
  }
}

TEST(CudaKernels, AttentionForwardBackwardSegmentsGqa) {
  REQUIRE_GPU();
  struct Case {
    std::int64_t H, Hkv, D;
    Mask mask;
    std::vector<AttnSegment> segs;
    std::int64_t tq, tkv;
  };
  std::vector<Case> cases;
  // Packed THD (3 sequences) causal GQA 4:2, D 64.
  cases.push_back(
      {4, 2, 64, Mask::Causal, {{0, 50, 0, 50, 0, 0}, {50, 7, 50, 7, 0, 0}, {57, 100, 57, 100, 0, 0}}, 157, 157});
  // CP-like blocks: two query chunks against one key block at position offsets (all-gather style,
  // key rows shared by two segments), MQA, D 128, plus a row with no visible key.
  cases.push_back(
      {4, 1, 128, Mask::Causal, {{0, 40, 0, 160, 40, 0}, {40, 40, 0, 160, 120, 0}, {80, 5, 0, 160, 0, 10}}, 85, 160});
  // Full (non-causal) attention, D 16, MHA.
  cases.push_back({2, 2, 16, Mask::None, {{0, 33, 0, 70, 0, 0}}, 33, 70});
  // Several 64-row tiles (bf16 D 64/128 take the tensor-core path): packed causal GQA with ragged
  // tails; non-causal with kv longer than q; two query blocks at offsets sharing one key block whose
  // tiles straddle both segments' visible ranges (p2p/all-gather CP style).
  cases.push_back({4, 2, 128, Mask::Causal, {{0, 200, 0, 200, 0, 0}, {200, 130, 200, 130, 0, 0}}, 330, 330});
  cases.push_back({2, 1, 64, Mask::None, {{0, 150, 0, 260, 0, 0}}, 150, 260});
  cases.push_back({4, 4, 64, Mask::Causal, {{0, 96, 0, 300, 250, 40}, {96, 100, 0, 300, 200, 0}}, 196, 300});
  // D 64 packed causal with several whole 128-key tiles before the diagonal (the D 64 forward's
  // 128-key tiles off the edge path) and a 300-token second sequence.
  cases.push_back({4, 2, 64, Mask::Causal, {{0, 520, 0, 520, 0, 0}, {520, 300, 520, 300, 0, 0}}, 820, 820});
  // The same at D 128 (the warp-specialised forward: five 128-key tiles, so each two-stage ring wraps
  // twice), and non-causal D 128 whose last key tile is partial (its V tile loaded without TMA).
  cases.push_back({4, 2, 128, Mask::Causal, {{0, 520, 0, 520, 0, 0}, {520, 300, 520, 300, 0, 0}}, 820, 820});
  cases.push_back({2, 1, 128, Mask::None, {{0, 150, 0, 260, 0, 0}}, 150, 260});
  // Fewer tokens than one 128-key TMA box (the tensor maps' extents end inside the box).
  cases.push_back({4, 2, 128, Mask::Causal, {{0, 50, 0, 50, 0, 0}, {50, 20, 50, 20, 0, 0}}, 70, 70});
  // 16 384 packed tokens in 128 causal sequences of 100 and 156, 8 query heads on one kv head: the
  // dK/dV kernel splits each group's heads over blocks (the least divisor of 8 giving 512 blocks:
  // 4 with the fused form's 128 key tiles, 2 with the split form's 64) and sums the fp32 shares.
  for (std::int64_t D : {128, 64}) {
    std::vector<AttnSegment> many;
    for (std::int64_t s = 0, at = 0; s < 128; ++s) {
      const std::int64_t n = s % 2 ? 156 : 100;
      many.push_back({at, n, at, n, 0, 0});
      at += n;
    }
    cases.push_back({8, 1, D, Mask::Causal, many, 16384, 16384});
  }
  // 60 causal sequences of 1 to 5 tokens (180 in all): a key tile holds more segments than the dK/dV
  // kernel keeps in shared memory (16), so its later jobs read their segments from global memory.
  for (std::int64_t D : {128, 64}) {
    std::vector<AttnSegment> tiny;
    std::int64_t at = 0;
    for (std::int64_t s = 0; s < 60; ++s) {
      const std::int64_t n = s % 5 + 1;
      tiny.push_back({at, n, at, n, 0, 0});
      at += n;
    }
    cases.push_back({4, 2, D, Mask::Causal, tiny, at, at});
  }
  for (DType d : kTypes)
    for (const auto& c : cases) {
      AttnParams p;
      p.heads = c.H;
      p.kv_heads = c.Hkv;
      p.head_dim = c.D;
      p.mask = c.mask;
      p.segments = c.segs;
      const DType ld = d == DType::F64 ? DType::F64 : DType::F32;
      Tensor q = rnd({c.tq, c.H, c.D}, 30, d), k = rnd({c.tkv, c.Hkv, c.D}, 31, d), v = rnd({c.tkv, c.Hkv, c.D}, 32, d),
             dout = rnd({c.tq, c.H, c.D}, 33, d);
      Tensor o = Tensor::zeros(q.shape(), d), lse = Tensor::zeros({c.tq, c.H}, ld), dq = Tensor::zeros(q.shape(), d),
             dk = Tensor::zeros(k.shape(), d), dv = Tensor::zeros(v.shape(), d);
      attention_fwd(o, lse, q, k, v, p);
      attention_bwd(dq, dk, dv, q, k, v, o, lse, dout, p);
      Tensor Q = dev(q), K = dev(k), V = dev(v), DO = dev(dout), O = zeros_like_on(o, Space::Cuda),
             L = zeros_like_on(lse, Space::Cuda), DQ = zeros_like_on(dq, Space::Cuda),
             DK = zeros_like_on(dk, Space::Cuda), DV = zeros_like_on(dv, Space::Cuda);
      attention_fwd(O, L, Q, K, V, p);
      attention_bwd(DQ, DK, DV, Q, K, V, O, L, DO, p);
      const std::string tag = " H" + std::to_string(c.H) + ":" + std::to_string(c.Hkv) + " D" + std::to_string(c.D);
      // bf16 at D 64 / 128 takes the tensor-core backward: each of its forms against the host as well.
      if (d == DType::BF16)
        for (AttnBwdKernel form : {AttnBwdKernel::Split, AttnBwdKernel::Fused, AttnBwdKernel::FusedUnordered,
                                   AttnBwdKernel::FusedOneDqWarp}) {
          AttnParams pf = p;
          pf.bwd_kernel = form;
          Tensor FQ = zeros_like_on(dq, Space::Cuda), FK = zeros_like_on(dk, Space::Cuda),
                 FV = zeros_like_on(dv, Space::Cuda);
          attention_bwd(FQ, FK, FV, Q, K, V, O, L, DO, pf);
          const std::string ft = tag + " (" + to_string(form) + ")";
          expect_match(FQ, dq, d, "attention dq" + ft);
          expect_match(FK, dk, d, "attention dk" + ft);
          expect_match(FV, dv, d, "attention dv" + ft);
        }
      expect_match(O, o, d, "attention o" + tag);
      // lse: -inf rows must match exactly; finite rows to tolerance.
      Tensor lh = L.to(Space::Host);
      for (std::int64_t i = 0; i < lse.numel(); ++i) {
        if (std::isinf(lse.get(i))) {
          EXPECT_TRUE(std::isinf(lh.get(i))) << "lse row " << i << tag;
        } else {
          // LSE is fp32 for fp32 and bf16 storage (fp64 for fp64): the same scores, so ~1e-4 relative.
          EXPECT_NEAR(lh.get(i), lse.get(i), (d == DType::F64 ? 1e-12 : 1e-4) * (1 + std::abs(lse.get(i))))
              << "lse row " << i << tag;
        }
      }
      expect_match(DQ, dq, d, "attention dq" + tag);
      expect_match(DK, dk, d, "attention dk" + tag);
      expect_match(DV, dv, d, "attention dv" + tag);
    }
}

// CP's partial-result combination: attention over two disjoint key blocks, merged by LSE, is
// attention over all keys, in O and in LSE. Causal rows that see no key of the second block
// (lse_b = -inf) must come through unchanged.
TEST(CudaKernels, AttentionMergeOfTwoKeyBlocksIsFullAttention) {
  REQUIRE_GPU();
  const std::int64_t T = 200, N = 260, split = 130, H = 4, Hkv = 2;
  for (DType d : kTypes)
    for (std::int64_t D : {64, 128})
      for (Mask mask : {Mask::None, Mask::Causal}) {
        const std::int64_t tkv = mask == Mask::Causal ? T : N, cut = mask == Mask::Causal ? 90 : split;
        const DType ld = d == DType::F64 ? DType::F64 : DType::F32;
        AttnParams p;
        p.heads = H;
        p.kv_heads = Hkv;
        p.head_dim = D;
        p.mask = mask;
        Tensor Q = dev(rnd({T, H, D}, 40, d)), K = dev(rnd({tkv, Hkv, D}, 41, d)), V = dev(rnd({tkv, Hkv, D}, 42, d));
        auto run = [&](AttnSegment seg, Tensor& o, Tensor& l) {
          o = Tensor::zeros({T, H, D}, d, Space::Cuda);
          l = Tensor::zeros({T, H}, ld, Space::Cuda);
          p.segments = {seg};
          attention_fwd(o, l, Q, K, V, p);
        };
        Tensor O, L, Oa, La, Ob, Lb;
        run({0, T, 0, tkv, 0, 0}, O, L);
        run({0, T, 0, cut, 0, 0}, Oa, La);
        run({0, T, cut, tkv - cut, 0, cut}, Ob, Lb);
        attention_merge(Oa, La, Ob, Lb);
        const std::string tag = std::string(mask == Mask::Causal ? " causal" : " full") + " D" + std::to_string(D);
        expect_match(Oa, O.to(Space::Host), d, "merged o" + tag);
        // LSE is fp32 (fp64 for fp64 inputs) whatever the storage type: hold it to that precision.
        Tensor got = La.to(Space::Host), want = L.to(Space::Host);
        const double rel = d == DType::F64 ? 1e-12 : 1e-5;
        for (std::int64_t i = 0; i < want.numel(); ++i)
          ASSERT_NEAR(got.get(i), want.get(i), rel * (1 + std::abs(want.get(i)))) << "merged lse row " << i << tag;
      }
}

// Operands the tensor-core path cannot take (a bf16 tensor 2 bytes past a 16-byte boundary: no
// cp.async / TMA rows) run the general kernels, and still match the host.
TEST(CudaKernels, AttentionUnalignedOperandsMatchHost) {
  REQUIRE_GPU();
  const std::int64_t T = 96, H = 4, Hkv = 2, D = 64;
  AttnParams p;
  p.heads = H;
  p.kv_heads = Hkv;
  p.head_dim = D;
  p.mask = Mask::Causal;
  p.segments = {{0, 60, 0, 60, 0, 0}, {60, 36, 60, 36, 0, 0}};
  Tensor q = rnd({T, H, D}, 70, DType::BF16), k = rnd({T, Hkv, D}, 71, DType::BF16),
         v = rnd({T, Hkv, D}, 72, DType::BF16), dout = rnd({T, H, D}, 73, DType::BF16);
  Tensor o = Tensor::zeros(q.shape(), DType::BF16), lse = Tensor::zeros({T, H}, DType::F32),
         dq = Tensor::zeros(q.shape(), DType::BF16), dk = Tensor::zeros(k.shape(), DType::BF16),
         dv = Tensor::zeros(v.shape(), DType::BF16);
  attention_fwd(o, lse, q, k, v, p);
  attention_bwd(dq, dk, dv, q, k, v, o, lse, dout, p);
  // The device copy of q one element into a larger buffer: a contiguous, misaligned view.
  Tensor qbuf = Tensor::zeros({q.numel() + 1}, DType::BF16, Space::Cuda);
  Tensor Q = qbuf.slice(0, 1, q.numel()).view(q.shape());
  Q.copy_from(dev(q));
  ASSERT_NE(reinterpret_cast<std::uintptr_t>(Q.raw()) % 16, 0u);
  Tensor K = dev(k), V = dev(v), DO = dev(dout), O = zeros_like_on(o, Space::Cuda), L = zeros_like_on(lse, Space::Cuda),
         DQ = zeros_like_on(dq, Space::Cuda), DK = zeros_like_on(dk, Space::Cuda), DV = zeros_like_on(dv, Space::Cuda);
  attention_fwd(O, L, Q, K, V, p);
  attention_bwd(DQ, DK, DV, Q, K, V, O, L, DO, p);
  expect_match(O, o, DType::BF16, "attention o (unaligned q)");
  expect_match(L, lse, DType::F32, "attention lse (unaligned q)");
  expect_match(DQ, dq, DType::BF16, "attention dq (unaligned q)");
  expect_match(DK, dk, DType::BF16, "attention dk (unaligned q)");
  expect_match(DV, dv, DType::BF16, "attention dv (unaligned q)");
}

namespace {
// One SSD case on the host and the GPU: y, final state and every gradient; with `packed`, a seq_idx
// with resets at `cuts` (token indices where a new sequence starts) and initial/final states.
void check_ssd(const test::SsdCase& hc, bool packed, const std::string& tag) {
  const DType d = hc.x.dtype();
  const SsdParams& p = hc.p;
  const std::int64_t B = p.batch, H = p.heads;
  const test::SsdCase dc = hc.on(Space::Cuda);
  Tensor dy = rnd(hc.x.shape(), 48, d), dfin = rnd(hc.init.shape(), 49, d);
  Tensor DY = dev(dy), DF = dev(dfin);
  // host
  Tensor y = hc.y(), fin = hc.states();
  ssd_fwd(y, &fin, hc.inputs(), p);
  test::SsdCase::Grads hg = hc.zero_grads();
  ssd_bwd(hg.ptrs(packed), hc.inputs(), dy, packed ? &dfin : nullptr, p);
  // device
  Tensor Y = dc.y(), FIN = dc.states();
  ssd_fwd(Y, &FIN, dc.inputs(), p);
  test::SsdCase::Grads dg = dc.zero_grads();
  ssd_bwd(dg.ptrs(packed), dc.inputs(), DY, packed ? &DF : nullptr, p);
  expect_match(Y, y, d, "ssd y" + tag);
  expect_match(FIN, fin, d, "ssd final state" + tag);
  expect_match(dg.dx, hg.dx, d, "ssd dx" + tag);
  expect_match(dg.ddt, hg.ddt, d, "ssd ddt" + tag);
  expect_match(dg.dA_log, hg.dA_log, d, "ssd dA_log" + tag);
  expect_match(dg.dB, hg.dB, d, "ssd dB" + tag);
  expect_match(dg.dC, hg.dC, d, "ssd dC" + tag);
  expect_match(dg.dD, hg.dD, d, "ssd dD" + tag);
  expect_match(dg.ddt_bias, hg.ddt_bias, d, "ssd ddt_bias" + tag);
  if (packed) expect_match(dg.dinit, hg.dinit, d, "ssd dinit" + tag);
  // Same inputs again: bitwise the same outputs.
  Tensor Y2 = dc.y(), FIN2 = dc.states();
  ssd_fwd(Y2, &FIN2, dc.inputs(), p);
  EXPECT_EQ(compare(Y2.to(Space::Host), Y.to(Space::Host)).max_abs, 0.0) << "ssd y repeat" << tag;
  EXPECT_EQ(compare(FIN2.to(Space::Host), FIN.to(Space::Host)).max_abs, 0.0) << "ssd final state repeat" << tag;
  // State passing: decay, the initial-state term and its backward (accumulating).
  if (!packed) {
    SsdInputs hi = hc.inputs(), di = dc.inputs();
    hi.init_states = &hc.init;
    di.init_states = &dc.init;
    Tensor a = Tensor::zeros({B, H}, d), Aa = Tensor::zeros({B, H}, d, Space::Cuda);
    ssd_run_decay(a, hi, p);
    ssd_run_decay(Aa, di, p);
    expect_match(Aa, a, d, "ssd run decay" + tag);
    ssd_init_state_fwd(y, hi, p);
    ssd_init_state_fwd(Y, di, p);
    expect_match(Y, y, d, "ssd initial-state term" + tag);
    Tensor dd = rnd({B, H}, 50, d);
    SsdStateGrads hsg{&hg.dC, &hg.ddt, &hg.dA_log, &hg.ddt_bias, &hg.dinit},
        dsg{&dg.dC, &dg.ddt, &dg.dA_log, &dg.ddt_bias, &dg.dinit};
    ssd_init_state_bwd(hsg, hi, &dy, &dd, p);
    Tensor DDc = dev(dd);
    ssd_init_state_bwd(dsg, di, &DY, &DDc, p);
    expect_match(dg.dC, hg.dC, d, "state-term dC" + tag);
    expect_match(dg.ddt, hg.ddt, d, "state-term ddt" + tag);
    expect_match(dg.dA_log, hg.dA_log, d, "state-term dA_log" + tag);
    expect_match(dg.ddt_bias, hg.ddt_bias, d, "state-term ddt_bias" + tag);
    expect_match(dg.dinit, hg.dinit, d, "state-term dS0" + tag);
    // The decay's gradient alone (state passing's zero-state pieces): its own parallel kernel.
    Tensor hA = Tensor::zeros({H}, d), hb = Tensor::zeros({H}, d), dA = Tensor::zeros({H}, d, Space::Cuda),
           db = Tensor::zeros({H}, d, Space::Cuda);
    SsdStateGrads hag{nullptr, &hg.ddt, &hA, &hb, nullptr}, dag{nullptr, &dg.ddt, &dA, &db, nullptr};
    ssd_init_state_bwd(hag, hi, nullptr, &dd, p);
    ssd_init_state_bwd(dag, di, nullptr, &DDc, p);
    expect_match(dg.ddt, hg.ddt, d, "decay ddt" + tag);
    expect_match(dA, hA, d, "decay dA_log" + tag);
    expect_match(db, hb, d, "decay ddt_bias" + tag);
    EXPECT_GT(compare(hA, Tensor::zeros({H}, d)).max_abs, 0.0) << "decay dA_log is zero" << tag;
  }
}
// seq_idx of a packed row: a new sequence starts at each of `cuts`.
test::SsdCase ssd_case(std::int64_t B, std::int64_t L, std::int64_t H, std::int64_t P, std::int64_t G, std::int64_t N,
                       std::int64_t Q, DType d, const std::vector<std::int64_t>& cuts = {}) {
  test::SsdCase c(B, L, H, P, G, N, Q, 40, d);
  c.use_seq = c.use_init = !cuts.empty();
  for (std::int64_t t = 0; t < B * L && !cuts.empty(); ++t)
    c.seq.push_back(static_cast<std::int64_t>(std::upper_bound(cuts.begin(), cuts.end(), t) - cuts.begin()));
  return c;
}
}  // namespace

TEST(CudaKernels, SsdForwardBackwardResetsStates) {
  REQUIRE_GPU();
  for (DType d : kTypes) {
    // BSHD batch 2, chunk 8; a packed row with seq_idx resets and initial/final states; P*N beyond
    // 48 KiB of shared memory (fp64), groups of 4 heads.
    check_ssd(ssd_case(2, 37, 4, 8, 2, 16, 8, d), false, " variant 0");
    check_ssd(ssd_case(1, 37, 4, 8, 2, 16, 16, d, {9, 10, 30}), true, " variant 1");
    check_ssd(ssd_case(2, 40, 8, 64, 2, 128, 16, d), false, " variant 2");
  }
}

// bf16 with head_dim 64 and chunk 128: the C·B^T, chunk-state and chunk-scan phases run on the tensor
// cores (kernels/cuda/ssd/ssd_tc.cu). Ragged last chunks, d_state 128 and 64, 8 heads per group, and a
// packed row whose resets fall inside a chunk, on a chunk boundary and one token after one.
TEST(CudaKernels, SsdTensorCorePhasesMatchHost) {
  REQUIRE_GPU();
  check_ssd(ssd_case(2, 300, 16, 64, 2, 128, 128, DType::BF16), false, " tc BSHD");
  check_ssd(ssd_case(1, 420, 8, 64, 1, 64, 128, DType::BF16, {50, 128, 129, 300}), true, " tc packed");
}

namespace {
std::vector<double> ids_of(const Tensor& t) { return t.to(Space::Host).to_vector(); }
}  // namespace

TEST(CudaKernels, MoeRouterPermuteCombineExperts) {
  REQUIRE_GPU();
  for (DType d : kTypes)
    for (int variant = 0; variant < 3; ++variant) {
      // 0: sigmoid router with correction bias, group-limited (4 groups, 2 kept: the thread-per-token
      //    kernel), renormalised, scaled, squared-ReLU experts, one expert never chosen; 1: softmax
      //    router (warp per token), SwiGLU; 2: sigmoid router without a group limit over 40 experts
      //    (warp per token, two per lane for some lanes) and rows of 30 / 21 channels, which the row
      //    kernels take one element per thread (16-byte access: multiples of 8 bf16 / 4 fp32).
      RouterParams rp;
      rp.experts = variant == 2 ? 40 : 16;
      rp.topk = 3;
      rp.sigmoid = variant != 1;
      rp.n_group = variant == 0 ? 4 : 1;
      rp.topk_group = variant == 0 ? 2 : 1;
      rp.scaling = variant == 0 ? 2.5 : 1.0;
      const Activation act = variant == 1 ? Activation::SwiGLU : Activation::SquaredReLU;
      const std::int64_t T = 45, C = variant == 2 ? 30 : 32, F = variant == 2 ? 21 : 24, E = rp.experts, K = rp.topk,
                         F1 = act == Activation::SwiGLU ? 2 * F : F;
      Tensor logits = rnd({T, E}, 60, d, -2, 2), bias = rnd({E}, 61, d, -0.1, 0.1);
      bias.set(5, -50.0);  // expert 5 never selected
      Tensor sc = Tensor::zeros({T, E}, d), w = Tensor::zeros({T, K}, d), SC = Tensor::zeros({T, E}, d, Space::Cuda),
             Wt = Tensor::zeros({T, K}, d, Space::Cuda);
      MoeRouting idx, IDX;  // the host's and the device's routing
      router_fwd(sc, idx, w, logits, &bias, rp);
      Tensor L = dev(logits), Bs = dev(bias);
      router_fwd(SC, IDX, Wt, L, &Bs, rp);
      expect_match(SC, sc, d, "router scores");
      expect_match(Wt, w, d, "router weights");
      EXPECT_EQ(IDX.indices(), idx.indices()) << "router selection " << to_string(d);
      EXPECT_EQ(IDX.counts, idx.counts) << "router counts " << to_string(d);
      EXPECT_EQ(idx.counts[5], 0);
      Tensor dw = rnd({T, K}, 62, d), dl = Tensor::zeros({T, E}, d), DL = Tensor::zeros({T, E}, d, Space::Cuda);
      router_bwd(dl, sc, idx, dw, nullptr, rp);
      router_bwd(DL, SC, IDX, dev(dw), nullptr, rp);
      expect_match(DL, dl, d, "router dlogits");
      // permute -> experts -> combine, and back
      Tensor x = rnd({T, C}, 63, d), xp = Tensor::zeros({T * K, C}, d), XP = Tensor::zeros({T * K, C}, d, Space::Cuda);
      moe_permute(xp, idx, x);
      Tensor X = dev(x);
      moe_permute(XP, IDX, X);
      EXPECT_EQ(IDX.sources(), idx.sources()) << "permutation (stable) " << to_string(d);
      EXPECT_EQ(ids_of(IDX.inv), ids_of(idx.inv)) << "inverse permutation " << to_string(d);
      const std::vector<std::int64_t>&cnt = idx.counts, &CNT = IDX.counts;
      const MoeRouting &src = idx, &SRC = IDX;
      expect_match(XP, xp, d, "permute");
      Tensor W1 = rnd({E, F1, C}, 64, d, -0.3, 0.3), W2 = rnd({E, C, F}, 65, d, -0.3, 0.3);
      Tensor yp = Tensor::zeros({T * K, C}, d), h = Tensor::zeros({T * K, F1}, d),
             YP = Tensor::zeros({T * K, C}, d, Space::Cuda), Hh = Tensor::zeros({T * K, F1}, d, Space::Cuda);
      expert_mlp_fwd(yp, h, xp, W1, W2, cnt, act);
      Tensor DW1 = dev(W1), DW2 = dev(W2);
      expert_mlp_fwd(YP, Hh, XP, DW1, DW2, CNT, act);
      expect_match(Hh, h, d, "expert h");
      expect_match(YP, yp, d, "expert yp");
      Tensor y = Tensor::zeros({T, C}, d), Y = Tensor::zeros({T, C}, d, Space::Cuda);
      moe_combine_fwd(y, yp, src, w);
      moe_combine_fwd(Y, YP, SRC, Wt);
      expect_match(Y, y, d, "combine");
      Tensor dy = rnd({T, C}, 66, d), dyp = Tensor::zeros({T * K, C}, d), dtw = Tensor::zeros({T, K}, d),
             DYP = Tensor::zeros({T * K, C}, d, Space::Cuda), DTW = Tensor::zeros({T, K}, d, Space::Cuda);
      moe_combine_bwd(dyp, dtw, dy, yp, src, w);
      moe_combine_bwd(DYP, DTW, dev(dy), YP, SRC, Wt);
      expect_match(DYP, dyp, d, "combine dyp");
      expect_match(DTW, dtw, d, "combine dtopk_w");
      Tensor dxp = Tensor::zeros({T * K, C}, d), dW1 = Tensor::zeros(W1.shape(), d), dW2 = Tensor::zeros(W2.shape(), d);
      Tensor DXP = Tensor::zeros({T * K, C}, d, Space::Cuda), GW1 = Tensor::zeros(W1.shape(), d, Space::Cuda),
             GW2 = Tensor::zeros(W2.shape(), d, Space::Cuda);
      expert_mlp_bwd(dxp, dW1, dW2, xp, W1, W2, h, cnt, act, dyp);
      expert_mlp_bwd(DXP, GW1, GW2, XP, DW1, DW2, Hh, CNT, act, DYP);
      expect_match(DXP, dxp, d, "expert dxp");
      expect_match(GW1, dW1, d, "expert dW1");
      expect_match(GW2, dW2, d, "expert dW2");
      {  // dx written over dy (as MoeLayer runs it): bitwise the device's separate-buffer result
        Tensor over = DYP.clone(), OW1 = Tensor::zeros(W1.shape(), d, Space::Cuda),
               OW2 = Tensor::zeros(W2.shape(), d, Space::Cuda);
        expert_mlp_bwd(over, OW1, OW2, XP, DW1, DW2, Hh, CNT, act, over);
        EXPECT_EQ(over.to(Space::Host).to_vector(), DXP.to(Space::Host).to_vector()) << "dx over dy " << to_string(d);
        EXPECT_EQ(OW1.to(Space::Host).to_vector(), GW1.to(Space::Host).to_vector())
            << "dW1, dx over dy " << to_string(d);
        EXPECT_EQ(OW2.to(Space::Host).to_vector(), GW2.to(Space::Host).to_vector())
            << "dW2, dx over dy " << to_string(d);
      }
      Tensor dx = Tensor::zeros({T, C}, d), DX = Tensor::zeros({T, C}, d, Space::Cuda);
      moe_permute_bwd(dx, dxp, src);
      moe_permute_bwd(DX, DXP, SRC);
      expect_match(DX, dx, d, "permute dx");
      // Load-balancing loss and its gradient (added into dscores).
      const double la = moe_aux_loss_fwd(sc, idx, rp), LA = moe_aux_loss_fwd(SC, IDX, rp);
      EXPECT_NEAR(LA, la, tol(d) * std::abs(la)) << "aux loss " << to_string(d);
      Tensor ds = rnd({T, E}, 67, d), DS = dev(ds);
      moe_aux_loss_bwd(ds, sc, idx, rp, 0.3);
      moe_aux_loss_bwd(DS, SC, IDX, rp, 0.3);
      expect_match(DS, ds, d, "aux loss dscores");
    }
}

namespace {
// One grouped GEMM on the device against an fp64 reference: groups of sizes[g] rows (M), or reduction
// lengths (K) when ta (as the weight gradients group them), the other extent `other`, N columns;
// inputs drawn from seeds seed + g (A) and seed + 10 + g (B); C pre-filled with 7 so that every
// element must be written.
void check_grouped_gemm(const std::vector<std::int64_t>& sizes, std::int64_t N, std::int64_t other, DType d, bool ta,
                        bool tb, unsigned seed, const std::string& what) {
  std::vector<cuda_impl::GemmGroupDesc> desc;
  std::vector<Tensor> hA, hB, dA, dB, dC;
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    const std::int64_t M = ta ? other : sizes[g], K = ta ? sizes[g] : other;
    hA.push_back(rnd(ta ? Shape{K, M} : Shape{M, K}, seed + g, d));
    hB.push_back(rnd(tb ? Shape{N, K} : Shape{K, N}, seed + 10 + g, d));
    dA.push_back(dev(hA.back()));
    dB.push_back(dev(hB.back()));
    const Shape cs{std::max<std::int64_t>(M, 1), N};
    dC.push_back(Tensor::from(std::vector<double>(static_cast<std::size_t>(cs[0] * N), 7.0), cs, d).to(Space::Cuda));
    desc.push_back({dA.back().raw(), dB.back().raw(), dC.back().raw(), M, N, K, ta ? M : K, tb ? K : N, N});
  }
  cuda_impl::grouped_gemm(ta, tb, desc, d);
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    const std::int64_t M = desc[g].M, K = desc[g].K;
    if (M == 0) continue;
    const std::vector<double> a = hA[g].to_vector(), b = hB[g].to_vector();
    std::vector<double> ref(static_cast<std::size_t>(M * N));
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t k = 0; k < K; ++k) {
        const double av = a[ta ? k * M + m : m * K + k];
        for (std::int64_t n = 0; n < N; ++n) ref[m * N + n] += av * b[tb ? n * K + k : k * N + n];
      }
    expect_match(dC[g], Tensor::from(ref, {M, N}, DType::F64), d,
                 what + " group " + std::to_string(g) + " ta " + std::to_string(ta) + " tb " + std::to_string(tb));
  }
}
}  // namespace

TEST(CudaKernels, GroupedGemmUnevenGroupsAllTransposes) {
  REQUIRE_GPU();
  // Groups with 0, 1, 70, 131 and 9 rows (M) or reduction lengths (K). N = 100 / other = 45 take the
  // element-wise path; the rest (multiples of 8) take the pipelined bf16 tensor-core path in three of
  // the four modes: partial M/N tiles, a 128-row tile whose second 64 rows lie beyond the group, two N
  // tiles of the 256-wide wgmma kernels whose second is multiplied 256 (N = 392), 64 (N = 320) or 128
  // (N = 384) wide (the 192-wide default: 64, 128 and full last tiles), a K tail inside a 64-deep stage; for the TMA
  // kernel's clusters, pairs of tiles sharing B (131 rows, other = 136 / 200), pairs of two groups' odd tiles and an
  // odd tile left with an idle partner (70, 1 and 9 rows; other = 72).
  for (auto [N, other] :
       {std::pair<std::int64_t, std::int64_t>{100, 45}, {136, 200}, {392, 136}, {320, 72}, {384, 136}})
    for (DType d : kTypes)
      for (int mode = 0; mode < 4; ++mode)
        check_grouped_gemm({70, 0, 131, 1, 9}, N, other, d, mode & 1, mode & 2, 60, "grouped gemm");
}

TEST(CudaKernels, GroupedGemmDeepKSeveralTiles) {
  REQUIRE_GPU();
  // bf16 on the pipelined kernels with reductions of 8-9 stages (the 4-stage ring wraps twice, a K
  // tail in the last stage), several M tiles per group (300, 520 and 257 rows: the 256-row tiles'
  // halves beyond a group, an empty group) and N = 392 (a 256-wide tile and a 136-wide one; two
  // 192-wide tiles and an 8-wide one), in all four operand layouts.
  for (int mode = 0; mode < 4; ++mode)
    check_grouped_gemm({300, 0, 520, 64, 257}, 392, 456, DType::BF16, mode & 1, mode & 2, 180, "grouped gemm (deep K)");
}

TEST(CudaKernels, SsdStateScanMatchesHost) {
  REQUIRE_GPU();
  // 7 slots: sequence 0 runs through slots 3, 0, 5; sequence 1 is slot 6 alone; sequence 2 runs 1, 4;
  // slot 2 belongs to no sequence and must stay untouched.
  const std::vector<std::int64_t> order = {3, 0, 5, 6, 1, 4}, off = {0, 3, 4, 6};
  for (DType d : {DType::F64, DType::F32}) {
    const Shape s{7, 3, 4, 5};
    Tensor S = rnd(s, 80, d), a = rnd({7, 3}, 81, d, 0.1, 0.9), g = rnd(s, 82, d), keep = rnd(s, 83, d);
    Tensor Sin = keep.clone(), dS = keep.clone(), da = rnd({7, 3}, 84, d);
    Tensor SIN = dev(keep), DS = dev(keep), DA = dev(da);
    ssd_state_scan_fwd(Sin, S, a, order, off);
    ssd_state_scan_fwd(SIN, dev(S), dev(a), order, off);
    expect_match(SIN, Sin, d, "state scan Sin");
    ssd_state_scan_bwd(dS, da, g, Sin, a, order, off);
    ssd_state_scan_bwd(DS, DA, dev(g), SIN, dev(a), order, off);
    expect_match(DS, dS, d, "state scan dS");
    expect_match(DA, da, d, "state scan da");
  }
}

// The doubling state scan's kernels: composition of affine maps (B first, reading A, then A) and
// the per-head dot product (P*N = 600: several warp strides), against the host and against a direct
// evaluation of one element.
TEST(CudaKernels, SsdStateComposeAndDotMatchHost) {
  REQUIRE_GPU();
  for (DType d : {DType::F64, DType::F32}) {
    const Shape s{5, 3, 20, 30};
    Tensor A = rnd({5, 3}, 85, d, 0.1, 0.9), B = rnd(s, 86, d), Ap = rnd({5, 3}, 87, d, 0.1, 0.9), Bp = rnd(s, 88, d);
    const double want_b = A.get(4) * Bp.get(4 * 600 + 7) + B.get(4 * 600 + 7), want_a = A.get(4) * Ap.get(4);
    Tensor DA = dev(A), DB = dev(B);
    ssd_state_compose(A, B, Ap, Bp);
    ssd_state_compose(DA, DB, dev(Ap), dev(Bp));
    EXPECT_NEAR(B.get(4 * 600 + 7), want_b, 1e-6);
    EXPECT_NEAR(A.get(4), want_a, 1e-7);
    expect_match(DB, B, d, "state compose B");
    expect_match(DA, A, d, "state compose A");
    Tensor da = Tensor::zeros({5, 3}, d), DDA = dev(da);
    ssd_state_dot(da, B, Bp);
    ssd_state_dot(DDA, DB, dev(Bp));
    expect_match(DDA, da, d, "state dot");
  }
}

// The decode steps against the host, three steps each from a random state: ssd_step at a small head
// and at the Nano head (P 64, N 128: several rows per warp, lanes over N), fp64, fp32 and bf16 (its
// state in fp32); conv1d_step with a random window (the window after the steps too).
TEST(CudaKernels, DecodeStepsMatchHost) {
  REQUIRE_GPU();
  for (DType d : kTypes) {
    const DType sd = acc_dtype(d);
    for (const auto& [H, P, G, N] :
         {std::array<std::int64_t, 4>{4, 8, 2, 16}, std::array<std::int64_t, 4>{8, 64, 2, 128}}) {
      test::SsdCase c(3, 1, H, P, G, N, 8, 90, d);
      const test::SsdCase g = c.on(Space::Cuda);
      Tensor state = rnd({3, H, P, N}, 91, sd), STATE = dev(state);
      for (int step = 0; step < 3; ++step) {
        Tensor y = c.y(), Y = g.y();
        ssd_step(y, state, c.inputs(), c.p);
        ssd_step(Y, STATE, g.inputs(), g.p);
        expect_match(Y, y, d, "ssd_step y, P " + std::to_string(P));
      }
      expect_match(STATE, state, sd, "ssd_step state, P " + std::to_string(P));
    }
    const std::int64_t B = 3, C = 40, W = 4;
    const Tensor w = rnd({C, W}, 92, d), bias = rnd({C}, 93, d), Wd = dev(w), BIAS = dev(bias);
    Tensor win = rnd({B, W - 1, C}, 94, d), WIN = dev(win);
    for (int step = 0; step < 3; ++step) {
      const Tensor x = rnd({B, C}, 95 + static_cast<std::uint64_t>(step), d);
      Tensor y = Tensor::zeros({B, C}, d), Y = dev(y);
      conv1d_step(y, win, x, w, &bias, true);
      conv1d_step(Y, WIN, dev(x), Wd, &BIAS, true);
      expect_match(Y, y, d, "conv1d_step y");
    }
    expect_match(WIN, win, d, "conv1d_step window");
  }
}

TEST(CudaKernels, AdamWUpdateAndSumOfSquares) {
  REQUIRE_GPU();
  for (DType d : {DType::F64, DType::F32}) {
    Tensor p = rnd({37, 19}, 90, d), g = rnd({37, 19}, 91, d), m = rnd({37, 19}, 92, d),
           v = rnd({37, 19}, 93, d, 0.0, 1.0);
    Tensor P = dev(p), G = dev(g), M = dev(m), V = dev(v);
    const AdamWStep s{3e-3, 0.9, 0.95, 0.19, 0.0975, 1e-8, 0.01, 0.7};
    adamw_update(p, g, m, v, s);
    adamw_update(P, G, M, V, s);
    expect_match(P, p, d, "adamw p");
    expect_match(M, m, d, "adamw m");
    expect_match(V, v, d, "adamw v");
    const double h = sum_squares(g), c = sum_squares(G);
    EXPECT_NEAR(c, h, tol(d) * h) << to_string(d);
    EXPECT_EQ(c, sum_squares(G)) << "sum_squares must repeat bitwise";
  }
}
