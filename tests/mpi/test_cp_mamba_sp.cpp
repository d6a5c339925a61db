// Mamba2 state-passing CP against cp=1 and against hidden-parallel CP (output, input gradient,
// every parameter gradient) for BSHD, THD single, THD packed (with chunks shorter than the conv
// halo) and BSHD split contiguously; shapes hidden parallel cannot run (heads not divisible by cp,
// cp = 3); the halo plan and the state scan on their own.
#include <gtest/gtest.h>

#include <mpi.h>
#include <cmath>

#include "comm/mpi_communicator.hpp"
#include "cp/layout.hpp"
#include "cp/state_passing.hpp"
#include "model/mamba2.hpp"
#include "model/mamba2_strategy.hpp"
#include "mpi/comm_bytes.hpp"
#include "unit/fd.hpp"

using namespace hcp;
using namespace hcp::model;

namespace {
Mamba2Config small(std::int64_t heads, std::int64_t groups) {
  Mamba2Config c;
  c.hidden = 10;
  c.heads = heads;
  c.head_dim = 2;
  c.groups = groups;
  c.d_state = 3;
  c.chunk = 3;  // pieces span several SSD chunks, ragged at both ends
  return c;
}
struct Result {
  Tensor y, dh;
  ParamMap grads;
};
Result run(MambaCp strategy, Communicator& comm, const Mamba2Config& c, const SeqLayout& g, const Tensor& h,
           const Tensor& dy, const ParamMap& p, cp::Partition part) {
  const int cp = comm.size(), r = comm.rank();
  auto layer = make_mamba2(strategy, comm, c, g, part);
  Tensor hl = cp::dcs_partition(h, g, cp, r, part), dyl = cp::dcs_partition(dy, g, cp, r, part);
  Tensor y = Tensor::zeros(hl.shape(), h.dtype()), dh = Tensor::zeros(hl.shape(), h.dtype());
  Result out;
  comm.reset_counters();
  layer->forward(y, hl, p);
  test::expect_mamba_fwd_bytes(comm, strategy, c, g, part, h.dtype());
  layer->backward(dh, out.grads, dyl, p);
  test::expect_mamba_bytes(comm, strategy, c, g, part, h.dtype(), out.grads);
  out.y = cp::dcs_gather(comm, y, g, part);
  out.dh = cp::dcs_gather(comm, dh, g, part);
  return out;
}
// Lengths in units of 2*cp so that every cp (1..4) divides them; the packed case has a sequence of
// one token per chunk (2*cp tokens), shorter than the conv halo of 3.
SeqLayout layout_of(const std::string& f, int cp) {
  const std::int64_t m = 2 * cp;
  if (f == "bshd" || f == "bshd_contiguous") return SeqLayout::bshd(2, 4 * m);
  if (f == "thd1") return SeqLayout::thd({0, 5 * m});
  return SeqLayout::thd({0, 3 * m, 4 * m, 6 * m});
}
bool hp_can_run(const Mamba2Config& c, int cp) {
  if (c.heads % cp) return false;
  return c.groups >= cp ? c.groups % cp == 0 : cp % c.groups == 0;
}
void expect_same(const Result& got, const Result& ref, DType dtype, const std::string& what) {
  const double rtol = dtype == DType::F64 ? 1e-10 : 3e-5, atol = dtype == DType::F64 ? 1e-12 : 2e-6;
  test::expect_close(got.y, ref.y, atol, rtol, what + " y");
  test::expect_close(got.dh, ref.dh, atol, rtol, what + " dh");
  for (auto& [n, t] : ref.grads) test::expect_close(got.grads.at(n), t, atol * 10, rtol, what + " d" + n);
}
}  // namespace

class MambaSp : public ::testing::TestWithParam<std::tuple<std::string, std::tuple<int, int>, DType>> {};

TEST_P(MambaSp, MatchesCp1AndHiddenParallel) {
  auto [format, hg, dtype] = GetParam();
  MpiCommunicator world(MPI_COMM_WORLD);
  auto self = world.split(world.rank(), 0);
  const int cp = world.size();
  const Mamba2Config c = small(std::get<0>(hg), std::get<1>(hg));
  const SeqLayout g = layout_of(format, cp);
  const auto part = format == "bshd_contiguous" ? cp::Partition::Contiguous : cp::Partition::DCS;
  ParamMap p = mamba2_init(c, dtype, 5);
  Tensor h = test::rand({g.total(), c.hidden}, 11, -1, 1, dtype),
         dy = test::rand({g.total(), c.hidden}, 12, -1, 1, dtype);
  Result ref = run(MambaCp::HiddenParallel, *self, c, g, h, dy, p, cp::Partition::DCS);
  Result sp = run(MambaCp::StatePassing, world, c, g, h, dy, p, part);
  expect_same(sp, ref, dtype, "state_passing vs cp=1:");
  if (hp_can_run(c, cp)) {
    Result hp = run(MambaCp::HiddenParallel, world, c, g, h, dy, p, part);
    expect_same(sp, hp, dtype, "state_passing vs hidden_parallel:");
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, MambaSp,
                         ::testing::Combine(::testing::Values("bshd", "thd1", "thdpacked", "bshd_contiguous"),
                                            ::testing::Values(std::make_tuple(8, 2), std::make_tuple(8, 8),
                                                              std::make_tuple(6, 1), std::make_tuple(6, 3)),
                                            ::testing::Values(DType::F64, DType::F32)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_heads" +
                                  std::to_string(std::get<0>(std::get<1>(info.param))) + "_groups" +
                                  std::to_string(std::get<1>(std::get<1>(info.param))) + "_" +
                                  hcp::to_string(std::get<2>(info.param));
                         });

// The halo plan: every extended row holds the token `halo - m` places before its piece (or zero
// before the sequence start), checked against the global tensor; the gradient path is the adjoint.
TEST(MambaSpLayout, ConvHaloGatherAndAdjoint) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const int cp = world.size(), r = world.rank();
  for (auto part : {cp::Partition::DCS, cp::Partition::Contiguous})
    for (std::int64_t halo : {0, 1, 3, 7}) {
      const SeqLayout g = SeqLayout::thd({0, 2 * cp, 8 * cp, 12 * cp});
      Tensor x = test::rand({g.total(), 3}, 31);
      cp::ConvHalo plan(g, cp, r, part, halo);
      Tensor ext = plan.gather(world, cp::dcs_partition(x, g, cp, r, part));
      const auto pieces = cp::local_pieces(g, cp, r, part);
      int bad = 0;  // no early return: the other ranks still enter the collectives below
      for (std::size_t i = 0; i < pieces.size(); ++i)
        for (std::int64_t m = 0; m < halo + pieces[i].len; ++m) {
          const std::int64_t tok = pieces[i].gstart - halo + m;
          for (std::int64_t c = 0; c < 3; ++c) {
            const double want = tok >= g.cu_seqlens[pieces[i].seq] ? x.get(tok * 3 + c) : 0.0;
            if (ext.get((plan.ext_start(i) + m) * 3 + c) != want && ++bad <= 3)
              ADD_FAILURE() << "halo " << halo << " piece " << i << " row " << m << " channel " << c;
          }
        }
      // <gather(x), e> == <x, scatter_back(e)> summed over ranks.
      Tensor e = test::rand(ext.shape(), 32 + static_cast<std::uint64_t>(r));
      Tensor back = plan.scatter_back(world, e);
      Tensor xl = cp::dcs_partition(x, g, cp, r, part);
      const double lhs = world.all_reduce_scalar(test::dot(ext, e)), rhs = world.all_reduce_scalar(test::dot(xl, back));
      EXPECT_NEAR(lhs, rhs, 1e-12 * std::abs(lhs));
      const double sent = world.all_reduce_scalar(static_cast<double>(plan.remote_rows_sent()));
      EXPECT_EQ(static_cast<std::int64_t>(sent), cp::model_halo_rows(g, cp, part, halo));
    }
}

// Bytes: the state exchange is independent of the sequence length. All-gather: 2 (cp-1) pieces
// H (P N + 1) values per rank and step (states + decays forward, state gradients backward);
// doubling: its model (every round and shift whose partner piece is on another rank), on
// all_to_all_v beside the conv halo.
TEST(MambaSpLayout, StateBytesIndependentOfLength) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const int cp = world.size();
  for (const auto ex : {cp::StateExchange::AllGather, cp::StateExchange::Doubling}) {
    Mamba2Config c = small(6, 3);
    c.state_exchange = ex;
    const std::int64_t H = c.heads, PN = c.head_dim * c.d_state;
    std::vector<std::int64_t> states;
    for (std::int64_t L : {4, 16}) {
      const SeqLayout g = SeqLayout::bshd(1, L * 2 * cp);
      ParamMap p = mamba2_init(c, DType::F64, 3);
      Tensor h = test::rand({g.total(), c.hidden}, 1), dy = test::rand({g.total(), c.hidden}, 2);
      world.reset_counters();
      run(MambaCp::StatePassing, world, c, g, h, dy, p, cp::Partition::DCS);
      const auto sent = [&](const char* op) {
        return world.counters().count(op) ? world.counters().at(op).bytes_sent : 0;
      };
      // run() also all-gathers y and dh ([T, hidden]) for the comparison; the halo goes by all_to_all_v.
      const std::int64_t gathers = 2 * (cp - 1) * (g.total() / cp) * c.hidden * 8;
      const std::int64_t halo =
          cp::model_halo_rows_sent(g, cp, cp::Partition::DCS, c.conv - 1, world.rank()) * c.conv_dim() * 8;
      states.push_back(sent("all_gather") - gathers + sent("all_to_all_v") - halo);
      EXPECT_EQ(states.back(), cp::model_state_elements_sent(g, cp, world.rank(), cp::Partition::DCS, ex, H, PN) * 8)
          << cp::to_string(ex) << " L " << L;
      if (ex == cp::StateExchange::AllGather) {
        EXPECT_EQ(states.back(), (cp - 1) * 2 * H * (2 * PN + 1) * 8);
      }
    }
    EXPECT_EQ(states[0], states[1]) << cp::to_string(ex) << ": state bytes depend on the sequence length";
  }
}

// The doubling scan (O(log cp) rounds) against the all-gather scan and cp=1 on every layout,
// including ranks holding adjacent pieces (DCS: rank cp-1) and the contiguous split.
TEST(MambaSpExchange, DoublingMatchesAllGatherAndCp1) {
  MpiCommunicator world(MPI_COMM_WORLD);
  auto self = world.split(world.rank(), 0);
  const int cp = world.size();
  for (const std::string format : {"bshd", "thd1", "thdpacked", "bshd_contiguous"}) {
    const auto part = format == "bshd_contiguous" ? cp::Partition::Contiguous : cp::Partition::DCS;
    Mamba2Config c = small(6, 3);
    const SeqLayout g = layout_of(format, cp);
    ParamMap p = mamba2_init(c, DType::F64, 7);
    Tensor h = test::rand({g.total(), c.hidden}, 31), dy = test::rand({g.total(), c.hidden}, 32);
    const Result ref = run(MambaCp::StatePassing, *self, c, g, h, dy, p, cp::Partition::DCS);
    c.state_exchange = cp::StateExchange::Doubling;
    const Result dbl = run(MambaCp::StatePassing, world, c, g, h, dy, p, part);
    c.state_exchange = cp::StateExchange::AllGather;
    const Result ag = run(MambaCp::StatePassing, world, c, g, h, dy, p, part);
    expect_same(dbl, ref, DType::F64, format + " doubling vs cp=1");
    expect_same(dbl, ag, DType::F64, format + " doubling vs allgather");
  }
}

// The byte models to cp = 1024 (no communication): doubling's largest per-rank count grows as
// log2(cp) (at most 2 (2 ceil(log2 2cp) + 2) states a sequence), the all-gather's as cp; auto takes
// the all-gather at cp <= 4 and doubling from cp = 8 on.
TEST(MambaSpLayout, StateScanModelsToLargeCp) {
  const std::int64_t H = 64, PN = 64 * 128;
  std::int64_t prev_ratio = 0;
  for (int cp : {2, 4, 8, 16, 64, 256, 1024}) {
    const SeqLayout g = SeqLayout::bshd(1, 2 * cp * 4);
    std::int64_t dbl = 0, ag = 0;
    for (int q = 0; q < cp; ++q) {
      dbl = std::max(dbl,
                     cp::model_state_elements_sent(g, cp, q, cp::Partition::DCS, cp::StateExchange::Doubling, H, PN));
      ag = std::max(ag,
                    cp::model_state_elements_sent(g, cp, q, cp::Partition::DCS, cp::StateExchange::AllGather, H, PN));
    }
    const auto rounds = static_cast<std::int64_t>(std::ceil(std::log2(2.0 * cp)));
    EXPECT_LE(dbl, 2 * (2 * rounds + 2) * H * (PN + 1)) << "cp " << cp;
    EXPECT_EQ(ag, (cp - 1) * 2 * H * (2 * PN + 1)) << "cp " << cp;
    const auto chosen = cp::resolve_state_exchange(g, cp, cp::Partition::DCS, cp::StateExchange::Auto, PN);
    EXPECT_EQ(chosen, cp <= 4 ? cp::StateExchange::AllGather : cp::StateExchange::Doubling) << "cp " << cp;
    EXPECT_GE(ag / dbl, prev_ratio) << "cp " << cp;  // the advantage grows with cp
    prev_ratio = ag / dbl;
  }
  EXPECT_GE(prev_ratio, 80);  // cp = 1024: (cp-1)(2PN+1) against ~2 (2*11+2) (PN+1) states
}

TEST(MambaSpErrors, LayoutRules) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const int cp = world.size();
  if (cp == 1) GTEST_SKIP() << "needs cp > 1";
  EXPECT_NE(test::error_of([&] {
              Mamba2SP m(world, small(6, 3), SeqLayout::thd({0, 2 * cp + 2}));
            }).find("multiple of 2*cp"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              Mamba2SP m(world, small(6, 4), SeqLayout::bshd(1, 8 * cp));
            }).find("mamba.n_groups (4) must divide mamba.heads (6)"),
            std::string::npos);
  EXPECT_EQ(model::mamba_cp_from_string("state_passing"), MambaCp::StatePassing);
  EXPECT_NE(test::error_of([] {
              model::mamba_cp_from_string("ring");
            }).find("unknown Mamba CP strategy 'ring' (expected hidden_parallel or state_passing)"),
            std::string::npos);
}

// bf16 state passing: the per-head parameter gradients (A_log, D, dt_bias) are sums over many pieces
// and over the ranks; each piece's part and the rank sums are added in fp32 and rounded once. Both
// bf16 runs are measured against the same layer in fp64 on the same (bf16-exact) inputs: CP may add
// no more than the cp=1 bf16 run's own error and four bf16 roundings of the largest magnitude
// (4 * 2^-8) to it. Measured at np 1-5: CP 1.4e-3..5.7e-2 from fp64 where cp=1 in bf16 is
// 1.4e-3..6.8e-2; the largest excess is ddt_bias at cp 4 (2.0e-2 against 4.6e-3). Rounding each
// piece's part to bf16 and summing the ranks in bf16 had given dA_log 3.2e-2 from the cp=1 bf16 run
// at cp 2 (parts of opposite sign cancel).
TEST(MambaSpBf16, PerHeadGradientsRoundOnce) {
  MpiCommunicator world(MPI_COMM_WORLD);
  auto self = world.split(world.rank(), 0);
  const int cp = world.size();
  Mamba2Config c = small(4, 2);
  c.hidden = 16;
  c.head_dim = 4;
  c.d_state = 4;
  c.chunk = 4;
  const std::int64_t m = 2 * cp;  // six sequences of 2..7 units of 2*cp: many pieces per rank
  std::vector<std::int64_t> cu{0};
  for (std::int64_t k = 0; k < 6; ++k) cu.push_back(cu.back() + (2 + k) * m);
  const SeqLayout g = SeqLayout::thd(cu);
  const ParamMap p = mamba2_init(c, DType::BF16, 9);
  const Tensor h = test::rand({g.total(), c.hidden}, 21, -1, 1, DType::BF16);
  const Tensor dy = test::rand({g.total(), c.hidden}, 22, -1, 1, DType::BF16);
  const Result ref = run(MambaCp::StatePassing, *self, c, g, h, dy, p, cp::Partition::DCS);
  const Result got = run(MambaCp::StatePassing, world, c, g, h, dy, p, cp::Partition::DCS);
  ParamMap p64;
  for (const auto& [n, t] : p) p64[n] = t.to(DType::F64);
  const Result exact =
      run(MambaCp::StatePassing, *self, c, g, h.to(DType::F64), dy.to(DType::F64), p64, cp::Partition::DCS);
  for (const char* n : {"A_log", "D", "dt_bias"}) {
    const ErrorStats e_cp = compare(got.grads.at(n), exact.grads.at(n)),
                     e_1 = compare(ref.grads.at(n), exact.grads.at(n));
    const double rel_cp = e_cp.max_abs / e_cp.ref_max, rel_1 = e_1.max_abs / e_1.ref_max;
    EXPECT_LE(rel_cp, 2 * rel_1 + 4 * 0x1p-8)
        << "d" << n << " at cp " << cp << ": cp=1 in bf16 is " << rel_1 << " from fp64";
  }
}
