// Host attention: against naive softmax attention, packed vs one-by-one, block+merge vs full,
// finite-difference gradients, GQA, bad shapes.
#include <gtest/gtest.h>

#include "kernels/kernels.hpp"
#include "unit/fd.hpp"

using namespace hcp;
using namespace hcp::kernels;
using hcp::test::rand;

namespace {
// Naive reference over segments: materialises the score row, plain softmax.
Tensor naive(const Tensor& q, const Tensor& k, const Tensor& v, const AttnParams& p) {
  const std::int64_t H = p.heads, D = p.head_dim, grp = p.heads / p.kv_heads;
  Tensor o = Tensor::zeros(q.shape(), DType::F64);
  const double sc = p.scale != 0 ? p.scale : 1 / std::sqrt(double(D));
  for (auto& g : p.segments)
    for (std::int64_t i = 0; i < g.q_len; ++i)
      for (std::int64_t h = 0; h < H; ++h) {
        std::vector<double> s;
        for (std::int64_t j = 0; j < g.kv_len; ++j) {
          if (p.mask == Mask::Causal && g.kv_pos0 + j > g.q_pos0 + i) break;
          double d = 0;
          for (std::int64_t e = 0; e < D; ++e)
            d += q.get(((g.q_start + i) * H + h) * D + e) * k.get(((g.kv_start + j) * p.kv_heads + h / grp) * D + e);
          s.push_back(d * sc);
        }
        if (s.empty()) continue;
        double mx = *std::max_element(s.begin(), s.end()), z = 0;
        for (auto& x : s) z += (x = std::exp(x - mx));
        for (std::int64_t e = 0; e < D; ++e) {
          double acc = 0;
          for (std::size_t j = 0; j < s.size(); ++j)
            acc += s[j] / z * v.get(((g.kv_start + std::int64_t(j)) * p.kv_heads + h / grp) * D + e);
          o.set(((g.q_start + i) * H + h) * D + e, acc);
        }
      }
  return o;
}

AttnParams params(std::int64_t H, std::int64_t Hkv, std::int64_t D, Mask m, const SeqLayout& l, std::int64_t tile = 4) {
  AttnParams p;
  p.heads = H;
  p.kv_heads = Hkv;
  p.head_dim = D;
  p.mask = m;
  p.segments = segments_from_layout(l, l);
  p.kv_tile = tile;
  return p;
}
}  // namespace

TEST(Attention, MatchesNaiveBshdAndThd) {
  for (Mask m : {Mask::Causal, Mask::None})
    for (auto [H, Hkv] : {std::pair<int, int>{4, 4}, {4, 2}, {4, 1}}) {
      const std::int64_t D = 8;
      for (const SeqLayout& l : {SeqLayout::bshd(2, 13), SeqLayout::thd({0, 5, 6, 19, 26})}) {
        const std::int64_t T = l.total();
        Tensor q = rand({T, H, D}, 1), k = rand({T, Hkv, D}, 2), v = rand({T, Hkv, D}, 3);
        Tensor o = Tensor::zeros({T, H, D}, DType::F64), lse = Tensor::zeros({T, H}, DType::F64);
        auto p = params(H, Hkv, D, m, l);
        attention_fwd(o, lse, q, k, v, p);
        test::expect_close(o, naive(q, k, v, p), 1e-13, 1e-12, "o");
      }
    }
}

TEST(Attention, BottomRightCausalAndScale) {
  const std::int64_t H = 2, D = 4;
  auto ql = SeqLayout::thd({0, 3, 7}), kl = SeqLayout::thd({0, 8, 12});
  Tensor q = rand({7, H, D}, 4), k = rand({12, H, D}, 5), v = rand({12, H, D}, 6);
  AttnParams p;
  p.heads = p.kv_heads = H;
  p.head_dim = D;
  p.scale = 0.3;
  p.segments = segments_from_layout(ql, kl, true);
  EXPECT_EQ(p.segments[0].q_pos0, 5);
  Tensor o = Tensor::zeros({7, H, D}, DType::F64), lse = Tensor::zeros({7, H}, DType::F64);
  attention_fwd(o, lse, q, k, v, p);
  test::expect_close(o, naive(q, k, v, p), 1e-13, 1e-12, "o");
}

TEST(Attention, PackedEqualsOneByOne) {
  const std::int64_t H = 2, D = 8;
  const std::vector<std::int64_t> cu{0, 7, 9, 20};
  const std::int64_t T = cu.back();
  Tensor q = rand({T, H, D}, 7), k = rand({T, H, D}, 8), v = rand({T, H, D}, 9);
  Tensor o = Tensor::zeros({T, H, D}, DType::F64), lse = Tensor::zeros({T, H}, DType::F64);
  attention_fwd(o, lse, q, k, v, params(H, H, D, Mask::Causal, SeqLayout::thd(cu)));
  for (std::size_t s = 0; s + 1 < cu.size(); ++s) {
    const std::int64_t n = cu[s + 1] - cu[s];
    Tensor qs = q.slice(0, cu[s], n).clone(), ks = k.slice(0, cu[s], n).clone(), vs = v.slice(0, cu[s], n).clone();
    Tensor os = Tensor::zeros({n, H, D}, DType::F64), ls = Tensor::zeros({n, H}, DType::F64);
    attention_fwd(os, ls, qs, ks, vs, params(H, H, D, Mask::Causal, SeqLayout::bshd(1, n)));
    EXPECT_EQ(o.slice(0, cu[s], n).clone().to_vector(), os.to_vector()) << "sequence " << s;
    EXPECT_EQ(lse.slice(0, cu[s], n).clone().to_vector(), ls.to_vector()) << "sequence " << s;
  }
}

TEST(Attention, BlocksWithOffsetsAndMergeEqualFull) {
  // Q rows [8,16) of a 16-token causal sequence, against keys split in blocks [0,6) and [6,16).
  const std::int64_t H = 2, D = 4, L = 16;
  Tensor q = rand({L, H, D}, 10), k = rand({L, H, D}, 11), v = rand({L, H, D}, 12);
  Tensor of = Tensor::zeros({L, H, D}, DType::F64), lf = Tensor::zeros({L, H}, DType::F64);
  attention_fwd(of, lf, q, k, v, params(H, H, D, Mask::Causal, SeqLayout::bshd(1, L)));
  Tensor qb = q.slice(0, 8, 8).clone();
  Tensor k1 = k.slice(0, 0, 6).clone(), v1 = v.slice(0, 0, 6).clone();
  Tensor k2 = k.slice(0, 6, 10).clone(), v2 = v.slice(0, 6, 10).clone();
  AttnParams p;
  p.heads = p.kv_heads = H;
  p.head_dim = D;
  p.kv_tile = 3;
  p.segments = {{0, 8, 0, 6, 8, 0}};
  Tensor o = Tensor::zeros({8, H, D}, DType::F64), l = Tensor::zeros({8, H}, DType::F64);
  attention_fwd(o, l, qb, k1, v1, p);
  p.segments = {{0, 8, 0, 10, 8, 6}};
  Tensor o2 = Tensor::zeros({8, H, D}, DType::F64), l2 = Tensor::zeros({8, H}, DType::F64);
  attention_fwd(o2, l2, qb, k2, v2, p);
  attention_merge(o, l, o2, l2);
  test::expect_close(o, of.slice(0, 8, 8).clone(), 1e-14, 1e-13, "merged o");
  test::expect_close(l, lf.slice(0, 8, 8).clone(), 1e-14, 1e-13, "merged lse");
  // A fully masked block: lse -inf, o 0, and merging it changes nothing.
  p.segments = {{0, 8, 0, 6, 0, 100}};
  Tensor o3 = Tensor::zeros({8, H, D}, DType::F64), l3 = Tensor::zeros({8, H}, DType::F64);
  attention_fwd(o3, l3, qb, k1, v1, p);
  for (std::int64_t i = 0; i < l3.numel(); ++i) EXPECT_TRUE(std::isinf(l3.get(i)) && l3.get(i) < 0);
  Tensor before = o.clone();
  attention_merge(o, l, o3, l3);
  EXPECT_EQ(o.to_vector(), before.to_vector());
}

TEST(Attention, GradientsFiniteDifference) {
  for (Mask m : {Mask::Causal, Mask::None}) {
    const std::int64_t H = 4, Hkv = 2, D = 3;
    auto l = SeqLayout::thd({0, 4, 9});
    const std::int64_t T = 9;
    Tensor q = rand({T, H, D}, 13), k = rand({T, Hkv, D}, 14), v = rand({T, Hkv, D}, 15), w = rand({T, H, D}, 16);
    auto p = params(H, Hkv, D, m, l, 2);
    auto loss = [&] {
      Tensor o = Tensor::zeros({T, H, D}, DType::F64), lse = Tensor::zeros({T, H}, DType::F64);
      attention_fwd(o, lse, q, k, v, p);
      return test::dot(o, w);
    };
    Tensor o = Tensor::zeros({T, H, D}, DType::F64), lse = Tensor::zeros({T, H}, DType::F64);
    attention_fwd(o, lse, q, k, v, p);
    Tensor dq = Tensor::zeros(q.shape(), DType::F64), dk = Tensor::zeros(k.shape(), DType::F64),
           dv = Tensor::zeros(v.shape(), DType::F64);
    attention_bwd(dq, dk, dv, q, k, v, o, lse, w, p);
    test::fd_check(q, dq, loss, "dq");
    test::fd_check(k, dk, loss, "dk");
    test::fd_check(v, dv, loss, "dv");
  }
}

// Sequences longer than one query block of the tiled host kernel (64 rows), key tiles that end
// inside and outside the causal edge, a segment that sees no keys: O against the naive reference and
// the backward against a central difference of <w, O> along one random direction of (q, k, v).
TEST(Attention, ManyQueryBlocksAndKeyTiles) {
  for (Mask m : {Mask::Causal, Mask::None})
    for (std::int64_t tile : {7, 64, 200}) {
      const std::int64_t H = 4, Hkv = 2, D = 16;
      auto l = SeqLayout::thd({0, 150, 151, 280});
      const std::int64_t T = l.total();
      Tensor q = rand({T, H, D}, 31), k = rand({T, Hkv, D}, 32), v = rand({T, Hkv, D}, 33), w = rand({T, H, D}, 34);
      auto p = params(H, Hkv, D, m, l, tile);
      AttnSegment none{};  // query rows that see no key: O = 0, LSE = -inf, no gradient
      none.q_start = 150;
      none.q_len = 1;
      none.kv_start = 0;
      none.kv_len = 10;
      none.q_pos0 = 0;
      none.kv_pos0 = 5;
      if (m == Mask::Causal) p.segments[1] = none;
      Tensor o = Tensor::zeros({T, H, D}, DType::F64), lse = Tensor::zeros({T, H}, DType::F64);
      attention_fwd(o, lse, q, k, v, p);
      test::expect_close(o, naive(q, k, v, p), 1e-13, 1e-12, "o, kv_tile " + std::to_string(tile));
      if (m == Mask::Causal) {
        EXPECT_TRUE(std::isinf(lse.get(150 * H)) && lse.get(150 * H) < 0);
      }
      Tensor dq = Tensor::zeros(q.shape(), DType::F64), dk = Tensor::zeros(k.shape(), DType::F64),
             dv = Tensor::zeros(v.shape(), DType::F64);
      attention_bwd(dq, dk, dv, q, k, v, o, lse, w, p);
      Tensor uq = rand(q.shape(), 35), uk = rand(k.shape(), 36), uv = rand(v.shape(), 37);
      auto loss_at = [&](double eps) {
        Tensor qe = q.clone(), ke = k.clone(), ve = v.clone();
        for (std::int64_t i = 0; i < q.numel(); ++i) qe.set(i, q.get(i) + eps * uq.get(i));
        for (std::int64_t i = 0; i < k.numel(); ++i) ke.set(i, k.get(i) + eps * uk.get(i));
        for (std::int64_t i = 0; i < v.numel(); ++i) ve.set(i, v.get(i) + eps * uv.get(i));
        Tensor oe = Tensor::zeros({T, H, D}, DType::F64), le = Tensor::zeros({T, H}, DType::F64);
        attention_fwd(oe, le, qe, ke, ve, p);
        return test::dot(oe, w);
      };
      const double eps = 1e-5, fd = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
      const double an = test::dot(dq, uq) + test::dot(dk, uk) + test::dot(dv, uv);
      EXPECT_NEAR(an, fd, 1e-7 * std::max(1.0, std::abs(fd))) << "kv_tile " << tile;
    }
}

TEST(Attention, Fp32AndBf16Inputs) {
  const std::int64_t H = 2, D = 16, T = 33;
  auto l = SeqLayout::bshd(1, T);
  Tensor q = rand({T, H, D}, 17), k = rand({T, H, D}, 18), v = rand({T, H, D}, 19);
  Tensor o = Tensor::zeros({T, H, D}, DType::F64), lse = Tensor::zeros({T, H}, DType::F64);
  auto p = params(H, H, D, Mask::Causal, l, 8);
  attention_fwd(o, lse, q, k, v, p);
  Tensor o32 = Tensor::zeros({T, H, D}, DType::F32), l32 = Tensor::zeros({T, H}, DType::F32);
  attention_fwd(o32, l32, q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), p);
  test::expect_close(o32, o, 1e-6, 1e-5, "fp32 o");
  Tensor qb = q.to(DType::BF16), kb = k.to(DType::BF16), vb = v.to(DType::BF16);
  Tensor ob = Tensor::zeros({T, H, D}, DType::BF16), lb = Tensor::zeros({T, H}, DType::F32);
  attention_fwd(ob, lb, qb, kb, vb, p);
  // bf16 storage of inputs and output: relative error of a few bf16 ulps (2^-8 each).
  test::expect_close(ob, o, 2e-2, 2e-2, "bf16 o");
}

TEST(Attention, BadShapesAreClearErrors) {
  Tensor q = rand({4, 3, 2}, 1), k = rand({4, 2, 2}, 2), o = Tensor::zeros({4, 3, 2}, DType::F64),
         l = Tensor::zeros({4, 3}, DType::F64);
  AttnParams p;
  p.heads = 3;
  p.kv_heads = 2;
  p.head_dim = 2;
  p.segments = segments_from_layout(SeqLayout::bshd(1, 4), SeqLayout::bshd(1, 4));
  EXPECT_NE(
      test::error_of([&] { attention_fwd(o, l, q, k, k, p); }).find("heads (3) must be divisible by kv_heads (2)"),
      std::string::npos);
  p.heads = 3;
  p.kv_heads = 3;
  Tensor k3 = rand({4, 3, 2}, 3);
  p.segments = segments_from_layout(SeqLayout::thd({0, 2, 9}), SeqLayout::thd({0, 2, 9}));
  EXPECT_NE(test::error_of([&] { attention_fwd(o, l, q, k3, k3, p); }).find("outside the 4 query rows"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              segments_from_layout(SeqLayout::thd({0, 4}), SeqLayout::thd({0, 2, 4}));
            }).find("cu_seqlens_q has 1 sequences, cu_seqlens_kv 2"),
            std::string::npos);
}
