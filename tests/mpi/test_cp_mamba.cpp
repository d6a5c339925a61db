// Mamba2 hidden-parallel CP against cp=1 (output, input gradient, every parameter gradient) for
// BSHD, THD single and THD packed, n_groups above, equal to and below cp; the packed cp=1 layer
// against its sequences run one by one; errors for shapes that do not divide.
#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/mpi_communicator.hpp"
#include "cp/layout.hpp"
#include "kernels/kernels.hpp"
#include "model/mamba2.hpp"
#include "mpi/comm_bytes.hpp"
#include "unit/fd.hpp"

using namespace hcp;
using namespace hcp::model;

namespace {
Mamba2Config small(std::int64_t groups) {
  Mamba2Config c;
  c.hidden = 12;
  c.heads = 8;
  c.head_dim = 2;
  c.groups = groups;
  c.d_state = 4;
  c.chunk = 8;
  return c;
}
struct Result {
  Tensor y, dh;
  ParamMap grads;
};
// Runs the layer on `comm` for the global input, returns global-order output / input gradient.
Result run(Communicator& comm, const Mamba2Config& c, const SeqLayout& g, const Tensor& h, const Tensor& dy,
           const ParamMap& p, cp::Partition part = cp::Partition::DCS) {
  const int cp = comm.size(), r = comm.rank();
  Mamba2HP layer(comm, c, g, part);
  Tensor hl = cp::dcs_partition(h, g, cp, r, part), dyl = cp::dcs_partition(dy, g, cp, r, part);
  Tensor y = Tensor::zeros(hl.shape(), h.dtype()), dh = Tensor::zeros(hl.shape(), h.dtype());
  Result out;
  comm.reset_counters();
  layer.forward(y, hl, p);
  test::expect_mamba_fwd_bytes(comm, cp::MambaCp::HiddenParallel, c, g, part, h.dtype());
  layer.backward(dh, out.grads, dyl, p);
  test::expect_mamba_bytes(comm, cp::MambaCp::HiddenParallel, c, g, part, h.dtype(), out.grads);
  out.y = cp::dcs_gather(comm, y, g, part);
  out.dh = cp::dcs_gather(comm, dh, g, part);
  return out;
}
SeqLayout layout_of(const std::string& f) {
  return f == "bshd" || f == "bshd_contiguous" ? SeqLayout::bshd(2, 16)
         : f == "thd1"                         ? SeqLayout::thd({0, 24})
                                               : SeqLayout::thd({0, 8, 24, 32});
}
}  // namespace

class MambaHpGrid : public ::testing::TestWithParam<std::tuple<std::string, std::int64_t, DType>> {};

TEST_P(MambaHpGrid, MatchesCp1) {
  auto [format, groups, dtype] = GetParam();
  MpiCommunicator world(MPI_COMM_WORLD);
  auto self = world.split(world.rank(), 0);  // cp = 1 on the same backend
  const Mamba2Config c = small(groups);
  const SeqLayout g = layout_of(format);
  const int cp = world.size();
  if (c.groups < cp && cp % c.groups != 0) GTEST_SKIP() << "cp % n_groups != 0";
  if (c.groups >= cp && c.groups % cp != 0) GTEST_SKIP() << "n_groups % cp != 0";
  ParamMap p = mamba2_init(c, dtype, 5);
  Tensor h = test::rand({g.total(), c.hidden}, 11, -1, 1, dtype),
         dy = test::rand({g.total(), c.hidden}, 12, -1, 1, dtype);
  Result ref = run(*self, c, g, h, dy, p);
  // bshd_contiguous: tokens split into cp contiguous pieces per row, as a plain all-gather
  // attention layer leaves them (no DCS to undo).
  Result got = run(world, c, g, h, dy, p, format == "bshd_contiguous" ? cp::Partition::Contiguous : cp::Partition::DCS);
  const double rtol = dtype == DType::F64 ? 1e-10 : 2e-5, atol = dtype == DType::F64 ? 1e-12 : 1e-6;
  test::expect_close(got.y, ref.y, atol, rtol, "y");
  test::expect_close(got.dh, ref.dh, atol, rtol, "dh");
  for (auto& [n, t] : ref.grads) test::expect_close(got.grads.at(n), t, atol * 10, rtol, "d" + n);
}

INSTANTIATE_TEST_SUITE_P(Grid, MambaHpGrid,
                         ::testing::Combine(::testing::Values("bshd", "thd1", "thdpacked", "bshd_contiguous"),
                                            ::testing::Values(1, 2, 8), ::testing::Values(DType::F64, DType::F32)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_groups" + std::to_string(std::get<1>(info.param)) + "_" +
                                  hcp::to_string(std::get<2>(info.param));
                         });

TEST(MambaCpLayout, Cp2hpHp2cpRoundTripAndContent) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const int cp = world.size(), r = world.rank();
  for (const SeqLayout& g : {SeqLayout::bshd(2, 16), SeqLayout::thd({0, 8, 24, 32})}) {
    Tensor x = test::rand({g.total(), 4 * cp}, 21);
    Tensor xl = cp::dcs_partition(x, g, cp, r);
    Tensor xh = cp::cp2hp(world, xl, g);
    // Every token in global order, channel block r.
    EXPECT_EQ(xh.to_vector(), x.slice(1, r * 4, 4).clone().to_vector());
    EXPECT_EQ(cp::hp2cp(world, xh, g).to_vector(), xl.to_vector());
    Tensor xc = cp::dcs_partition(x, g, cp, r, cp::Partition::Contiguous);
    EXPECT_EQ(cp::cp2hp(world, xc, g, cp::Partition::Contiguous).to_vector(), x.slice(1, r * 4, 4).clone().to_vector());
  }
  // Contiguous: rank r holds the r-th piece of every row.
  auto g = SeqLayout::bshd(2, 8);
  if (cp == 2) {
    EXPECT_EQ(cp::dcs_global_index(g, 2, 1, cp::Partition::Contiguous),
              (std::vector<std::int64_t>{4, 5, 6, 7, 12, 13, 14, 15}));
  }
}

TEST(MambaCp1, PackedEqualsSequencesOneByOne) {
  MpiCommunicator world(MPI_COMM_WORLD);
  auto self = world.split(world.rank(), 0);
  const Mamba2Config c = small(2);
  const std::vector<std::int64_t> cu{0, 8, 24, 32};
  const SeqLayout g = SeqLayout::thd(cu);
  ParamMap p = mamba2_init(c, DType::F64, 6);
  Tensor h = test::rand({32, c.hidden}, 13), dy = test::rand({32, c.hidden}, 14);
  Result packed = run(*self, c, g, h, dy, p);
  ParamMap gsum = zeros_like(p);
  for (std::size_t s = 0; s + 1 < cu.size(); ++s) {
    const std::int64_t n = cu[s + 1] - cu[s];
    Result one = run(*self, c, SeqLayout::bshd(1, n), h.slice(0, cu[s], n).clone(), dy.slice(0, cu[s], n).clone(), p);
    test::expect_close(packed.y.slice(0, cu[s], n).clone(), one.y, 1e-13, 1e-11, "y of sequence " + std::to_string(s));
    test::expect_close(packed.dh.slice(0, cu[s], n).clone(), one.dh, 1e-13, 1e-11,
                       "dh of sequence " + std::to_string(s));
    for (auto& [nm, t] : one.grads) kernels::axpy(gsum[nm], 1.0, t);
  }
  for (auto& [nm, t] : gsum)
    test::expect_close(packed.grads.at(nm), t, 1e-12, 1e-10, "d" + nm + " (sum over sequences)");
}

TEST(MambaCp1, ParameterGradientsFiniteDifference) {
  MpiCommunicator world(MPI_COMM_WORLD);
  auto self = world.split(world.rank(), 0);
  Mamba2Config c = small(2);
  c.hidden = 6;
  c.heads = 4;
  c.head_dim = 2;
  c.d_state = 2;
  c.chunk = 3;
  const SeqLayout g = SeqLayout::thd({0, 4, 10});
  ParamMap p = mamba2_init(c, DType::F64, 7);
  Tensor h = test::rand({10, c.hidden}, 15), dy = test::rand({10, c.hidden}, 16);
  Result r = run(*self, c, g, h, dy, p);
  auto loss = [&] {
    Mamba2HP layer(*self, c, g);
    Tensor y = Tensor::zeros(h.shape(), DType::F64);
    layer.forward(y, h, p);
    return test::dot(y, dy);
  };
  test::fd_check(h, r.dh, loss, "dh");
  for (auto& [n, t] : p) test::fd_check(t, r.grads.at(n), loss, "d" + n);
}

TEST(MambaCpErrors, DivisibilityRules) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const int cp = world.size();
  if (cp == 1) GTEST_SKIP() << "needs cp > 1";
  Mamba2Config c = small(1);
  c.heads = 2 * cp + 1;  // never divisible by cp
  EXPECT_NE(test::error_of([&] {
              Mamba2HP m(world, c, SeqLayout::bshd(1, 8 * cp));
            }).find("heads (" + std::to_string(c.heads) + ") divisible by cp (" + std::to_string(cp) + ")"),
            std::string::npos);
  c = small(2);
  c.heads = 3 * cp;
  c.groups = 3;  // cp=2: 3 % 2 != 0; cp=4: 3 < 4 and 4 % 3 != 0
  EXPECT_NE(test::error_of([&] { Mamba2HP m(world, c, SeqLayout::bshd(1, 8 * cp)); }).find("mamba.n_groups (3)"),
            std::string::npos);
  c = small(2);
  EXPECT_NE(test::error_of([&] {
              Mamba2HP m(world, c, SeqLayout::thd({0, 2 * cp + 2}));
            }).find("multiple of 2*cp"),
            std::string::npos);
}
