#include <gtest/gtest.h>

#include <cmath>

#include "core/phase_times.hpp"
#include "core/seq_layout.hpp"
#include "core/tensor.hpp"

using namespace hcp;

TEST(Tensor, ShapeStridesAndViews) {
  Tensor t = Tensor::zeros({2, 3, 4}, DType::F32);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  for (int i = 0; i < 24; ++i) t.set(i, i);
  Tensor v = t.view({6, -1});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_EQ(v.get(5), 5.0);
  Tensor s = t.slice(1, 1, 2);  // [2,2,4], non-contiguous
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.get(0), 4.0);
  EXPECT_EQ(s.get(8), 16.0);
  Tensor c = s.clone();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector(), s.to_vector());
  EXPECT_THROW(t.view({5, 5}), Error);
  EXPECT_THROW(t.slice(0, 1, 2), Error);
  EXPECT_THROW(t.data<double>(), Error);
}

TEST(Tensor, WrapDoesNotOwn) {
  std::vector<double> buf(6, 1.5);
  Tensor t = Tensor::wrap(buf.data(), {2, 3}, DType::F64);
  EXPECT_FALSE(t.owns());
  t.set(4, 2.0);
  EXPECT_EQ(buf[4], 2.0);
}

TEST(Tensor, Bf16RoundTripAndRounding) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 65504.0f, 1e-3f}) {
    bf16 b(f);
    EXPECT_NEAR(static_cast<float>(b), f, std::abs(f) * 1.0f / 128.0f) << f;
  }
  // 1 + 2^-8 is exactly half-way between two bf16 values: rounds to even (1.0).
  EXPECT_EQ(static_cast<float>(bf16(1.00390625f)), 1.0f);
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16(NAN))));
  Tensor t = Tensor::from({1.0, 2.0, 3.0}, {3}, DType::BF16);
  Tensor f = t.to(DType::F32);
  EXPECT_EQ(f.to_vector(), (std::vector<double>{1.0, 2.0, 3.0}));
}

TEST(Tensor, DeterministicFill) {
  Tensor a = Tensor::empty({100}, DType::F64), b = Tensor::empty({100}, DType::F64);
  fill_uniform(a, 42);
  fill_uniform(b, 42);
  EXPECT_EQ(a.to_vector(), b.to_vector());
  fill_uniform(b, 43);
  EXPECT_NE(a.to_vector(), b.to_vector());
  for (double v : a.to_vector()) EXPECT_TRUE(v >= -1 && v < 1);
}

// Large tensors are filled by several threads: every element is still the function of its index
// that the one-thread path gives (a prefix of a large tensor equals a small one), in every dtype, and the rows of
// Parameters are drawn from seeds the project defines: FNV-1a of the name (published test vectors),
// splitmix64 (of the seed, then of seed ^ mixed index), and the map to [lo, hi). Pinned to the bit,
// so another compiler or standard library cannot draw other parameters from the same deck. The
// values were computed by an independent implementation of the same formulas.
TEST(Tensor, SeedsAndFillsArePinned) {
  EXPECT_EQ(name_hash(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(name_hash("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(name_hash("foobar"), 0x85944171f73967e8ull);
  const std::uint64_t seed = mix64(7 ^ name_hash("in_proj.weight"));  // parameter in_proj.weight, seed 7
  EXPECT_EQ(seed, 0xed5ef41b6902f8acull);
  Tensor t = Tensor::empty({3}, DType::F64);
  fill_uniform(t, seed, -1.0, 1.0);
  EXPECT_EQ(t.get(0), -0x1.408b8e59ed9fap-1);
  EXPECT_EQ(t.get(1), -0x1.37a2e06fd4ef4p-1);
  EXPECT_EQ(t.get(2), -0x1.6410e79853264p-2);
}

// fill_uniform_rows are the rows of the whole.
TEST(Tensor, ThreadedFillIsTheSameFunctionOfTheIndex) {
  const std::int64_t n = (std::int64_t{1} << 20) + 37;  // above the threading threshold
  for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
    Tensor big = Tensor::empty({n}, dt), small = Tensor::empty({1000}, dt);
    fill_uniform(big, 7, -2, 3);
    fill_uniform(small, 7, -2, 3);
    for (std::int64_t i = 0; i < 1000; ++i) ASSERT_EQ(big.get(i), small.get(i)) << to_string(dt) << " " << i;
    Tensor whole = Tensor::empty({4, n / 4 + 1}, dt);
    fill_uniform(whole, 9);
    Tensor part = Tensor::empty({2, n / 4 + 1}, dt);
    fill_uniform_rows(part, 9, {3, 1});
    const std::int64_t w = n / 4 + 1;
    for (std::int64_t j = 0; j < w; j += 997) {
      ASSERT_EQ(part.get(j), whole.get(3 * w + j));
      ASSERT_EQ(part.get(w + j), whole.get(w + j));
    }
  }
}

// Dtype conversions of large contiguous tensors run over threads: every element is converted as the
// element-wise path converts it (fp64 -> fp32 -> bf16 -> fp32 -> fp64 rounds once per narrowing).
TEST(Tensor, ThreadedConversionMatchesElementWise) {
  const std::int64_t n = (std::int64_t{1} << 20) + 13;
  Tensor a = Tensor::empty({n}, DType::F64);
  fill_uniform(a, 5, -1e3, 1e3);
  const Tensor f = a.to(DType::F32), b = f.to(DType::BF16), back = b.to(DType::F64), bd = a.to(DType::BF16);
  for (std::int64_t i = 0; i < n; i += 4093) {
    ASSERT_EQ(f.get(i), static_cast<double>(static_cast<float>(a.get(i)))) << i;
    ASSERT_EQ(b.get(i), static_cast<double>(static_cast<float>(bf16(static_cast<float>(a.get(i)))))) << i;
    ASSERT_EQ(back.get(i), b.get(i)) << i;
    ASSERT_EQ(bd.get(i), b.get(i)) << i;
  }
  ASSERT_EQ(f.get(n - 1), static_cast<double>(static_cast<float>(a.get(n - 1))));
}

// NaN is never within a tolerance: in the result, in the reference, or in both.
TEST(Tensor, CompareCountsNanAsInfiniteDifference) {
  const double nan = std::nan(""), inf = INFINITY;
  Tensor a = Tensor::zeros({4}, DType::F64), b = Tensor::zeros({4}, DType::F64);
  for (auto [x, y] : {std::pair<double, double>{nan, 1.0}, {1.0, nan}, {nan, nan}, {inf, 1.0}, {inf, -inf}}) {
    a.set(1, x);
    b.set(1, y);
    const ErrorStats e = compare(a, b);
    EXPECT_FALSE(e.max_abs <= 1e-3) << x << " vs " << y;
    EXPECT_EQ(e.nonfinite, 1) << x << " vs " << y;
  }
  a.set(1, -inf);
  b.set(1, -inf);  // the same infinity matches (a row with no key has LSE -inf on both sides)
  EXPECT_EQ(compare(a, b).max_abs, 0.0);
  EXPECT_TRUE(std::isnan(nan_max(0.5, nan)));
  EXPECT_TRUE(std::isnan(nan_max(nan, 0.5)));
  EXPECT_EQ(nan_max(0.5, 2.0), 2.0);
}

// Each phase keeps the most tensor bytes alive at once during it: a temporary freed inside a nested
// phase counts toward both, one allocated after the nested phase toward the outer only, and the
// step's own high-water is untouched by the phases' marks.
TEST(PhaseTimes, TensorHighWaterPerPhase) {
  const std::int64_t base = tensor_bytes_live(Space::Host);
  reset_tensor_peak(Space::Host);
  PhaseTimes ph;
  Tensor kept;
  ph.time("outer", Space::Host, [&] {
    ph.time("inner", Space::Host, [&] {
      Tensor tmp = Tensor::zeros({1000}, DType::F64);  // 8000 bytes, freed at once
      kept = Tensor::zeros({100}, DType::F64);         // 800 bytes, kept
    });
    Tensor late = Tensor::zeros({1500}, DType::F64);  // 12000 bytes beside `kept`
  });
  ph.time("after", Space::Host, [&] { Tensor t = Tensor::zeros({10}, DType::F64); });
  ph.time("outer2", Space::Host, [&] {
    ph.time("inner2", Space::Host, [&] { Tensor big = Tensor::zeros({2500}, DType::F64); });  // 20000 bytes
  });
  const auto& pk = ph.peaks();
  EXPECT_EQ(pk.at("inner").bytes - base, 8800);
  EXPECT_EQ(pk.at("outer").bytes - base, 12800);
  EXPECT_EQ(pk.at("after").bytes - base, 880);
  EXPECT_EQ(pk.at("inner2").bytes - base, 20800);
  EXPECT_EQ(pk.at("outer2").bytes - base, 20800);  // the nested phase's temporary counts outside too
  EXPECT_EQ(pk.at("inner").depth, 1);
  EXPECT_EQ(pk.at("outer").depth, 0);
  EXPECT_EQ(tensor_bytes_peak(Space::Host) - base, 20800);
  ph.reset();
  EXPECT_TRUE(ph.peaks().empty());
}

TEST(Layout, BshdAndThd) {
  auto l = SeqLayout::bshd(3, 8);
  EXPECT_EQ(l.cu_seqlens, (std::vector<std::int64_t>{0, 8, 16, 24}));
  auto t = SeqLayout::thd({0, 4, 12});
  EXPECT_EQ(t.nseq(), 2);
  EXPECT_EQ(t.len(1), 8);
  EXPECT_THROW(SeqLayout::thd({1, 4}), Error);
  EXPECT_THROW(SeqLayout::thd({0, 4, 2}), Error);
}

TEST(Error, NamesFileAndLine) {
  try {
    HCP_CHECK(1 == 2, "the rule ", 42);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("test_core.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("the rule 42"), std::string::npos) << m;
  }
}
