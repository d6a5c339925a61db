// MoE with expert parallelism against EP = 1 on the same tokens: every EP size that divides the
// world (1, 2, 4 at np 4; groups of ep consecutive ranks, the ranks holding the same experts summing
// their gradients), each rank holding only its experts' W1 / W2 — outputs, input gradients and every
// parameter gradient, including experts that receive no token (their correction bias keeps them out
// of every top-k), and the expert weights per rank at 1/ep of the whole; finite differences of the
// layer at EP = 1.
#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/mpi_communicator.hpp"
#include "cp/layout.hpp"
#include "model/hybrid.hpp"
#include "model/layers.hpp"
#include "unit/fd.hpp"

using namespace hcp;
using namespace hcp::model;

namespace {
MoeConfig cfg(std::int64_t shared) {
  MoeConfig c;
  c.hidden = 6;
  c.experts = 8;
  c.topk = 3;
  c.ffn = 5;
  c.shared_ffn = shared;
  c.scaling = 2.5;
  return c;
}
// Experts 5, 6 and 7 are never selected.
ParamMap params(const MoeConfig& c, DType dt, RowRange experts = {}) {
  ParamMap p = moe_init(c, dt, 9, experts);
  for (std::int64_t e = 5; e < c.experts; ++e) p["e_bias"].set(e, -100.0);
  return p;
}
}  // namespace

class MoeEp : public ::testing::TestWithParam<std::tuple<std::int64_t, DType>> {};

TEST_P(MoeEp, MatchesEp1) {
  auto [shared, dtype] = GetParam();
  MpiCommunicator world(MPI_COMM_WORLD);
  auto self = world.split(world.rank(), 0);
  const int n = world.size(), r = world.rank();
  const MoeConfig c = cfg(shared);
  const ParamMap whole = params(c, dtype);
  const std::int64_t Tl = 5, T = Tl * n;
  Tensor x = test::rand({T, c.hidden}, 3, -1, 1, dtype), dy = test::rand({T, c.hidden}, 4, -1, 1, dtype);
  // EP = 1 on every token (one rank's view).
  MoeLayer ref(*self, *self, *self, c);
  Tensor ry = Tensor::zeros({T, c.hidden}, dtype), rdx = Tensor::zeros({T, c.hidden}, dtype);
  ParamMap rg;
  ref.forward(ry, x, whole);
  ref.backward(rdx, rg, dy, whole);
  const double rtol = dtype == DType::F64 ? 1e-12 : 1e-5, atol = dtype == DType::F64 ? 1e-13 : 1e-6;
  for (int ep = 1; ep <= n; ++ep) {
    if (n % ep != 0) continue;
    SCOPED_TRACE("ep " + std::to_string(ep));
    // Every rank routes its own Tl tokens; rank r holds experts of EP rank r % ep only.
    const ExpertGroups groups(world, ep);
    const RowRange mine = model::local_experts(groups, c.experts);
    ASSERT_EQ(mine.first, (r % ep) * (c.experts / ep));
    const ParamMap p = params(c, dtype, mine);
    EXPECT_EQ(p.at("W1").numel() * ep, whole.at("W1").numel());
    EXPECT_EQ(p.at("W2").numel() * ep, whole.at("W2").numel());
    MoeLayer layer(groups.ep(), groups.replicas(), world, c);
    Tensor xl = x.slice(0, r * Tl, Tl).clone(), dyl = dy.slice(0, r * Tl, Tl).clone();
    Tensor y = Tensor::zeros({Tl, c.hidden}, dtype), dx = Tensor::zeros({Tl, c.hidden}, dtype);
    ParamMap g;
    layer.forward(y, xl, p);
    layer.backward(dx, g, dyl, p);
    for (std::int64_t e = 0; e < mine.rows; ++e)
      if (mine.first + e >= 5) {
        EXPECT_EQ(layer.local_counts()[static_cast<std::size_t>(e)], 0) << "expert " << mine.first + e;
      }
    Tensor gy = Tensor::zeros({T, c.hidden}, dtype), gdx = Tensor::zeros({T, c.hidden}, dtype);
    world.all_gather(y, gy);
    world.all_gather(dx, gdx);
    test::expect_close(gy, ry, atol, rtol, "y");
    test::expect_close(gdx, rdx, atol, rtol, "dx");
    ASSERT_EQ(g.size(), rg.size());
    for (auto& [nm, t] : rg) {
      Tensor got = g.at(nm);
      if (is_expert_weight(nm)) {  // this rank's rows, the same on every replica; gathered over the EP group
        Shape s = got.shape();
        s[0] = c.experts;
        Tensor all = Tensor::zeros(s, dtype);
        groups.ep().all_gather(got, all);
        got = all;
      }
      test::expect_close(got, t, atol, rtol, "d" + nm);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, MoeEp,
                         ::testing::Combine(::testing::Values(0, 7), ::testing::Values(DType::F64, DType::F32)),
                         [](const auto& info) {
                           return "shared" + std::to_string(std::get<0>(info.param)) + "_" +
                                  hcp::to_string(std::get<1>(info.param));
                         });

TEST(MoeLayerFd, EveryGradient) {
  MpiCommunicator world(MPI_COMM_WORLD);
  auto self = world.split(world.rank(), 0);
  const MoeConfig c = cfg(4);
  ParamMap p = params(c, DType::F64);
  Tensor x = test::rand({4, c.hidden}, 5), dy = test::rand({4, c.hidden}, 6);
  MoeLayer layer(*self, *self, *self, c);
  Tensor y = Tensor::zeros(x.shape(), DType::F64), dx = Tensor::zeros(x.shape(), DType::F64);
  ParamMap g;
  layer.forward(y, x, p);
  layer.backward(dx, g, dy, p);
  auto loss = [&] {
    MoeLayer l(*self, *self, *self, c);
    Tensor yy = Tensor::zeros(x.shape(), DType::F64);
    l.forward(yy, x, p);
    return test::dot(yy, dy);
  };
  test::fd_check(x, dx, loss, "dx");
  for (const char* n : {"router", "W1", "W2", "shared_W1", "shared_W2"})
    test::fd_check(p[n], g.at(n), loss, std::string("d") + n);
  for (std::int64_t i = 0; i < c.experts; ++i) EXPECT_EQ(g.at("e_bias").get(i), 0.0);
}

TEST(MoeLayerErrors, ExpertsNotDivisible) {
  MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() < 3) GTEST_SKIP() << "needs an EP size that does not divide 8";
  MoeConfig c = cfg(0);
  c.experts = 6;
  if (6 % world.size() == 0) GTEST_SKIP();
  EXPECT_NE(test::error_of([&] {
              MoeLayer m(world, *world.split(world.rank(), 0), world, c);
            }).find("moe.experts (6) divisible by the EP size"),
            std::string::npos);
}
