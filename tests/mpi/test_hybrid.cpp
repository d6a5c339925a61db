// The hybrid model end to end under CP against cp=1 on the same padded layout: loss, logits
// gradient (gathered) and every parameter gradient, for each attention strategy x format
// (BSHD, THD single sequence, THD packed) x Mamba CP strategy; the packed loss equals the sequences' losses one by one.
#include <gtest/gtest.h>

#include <mpi.h>
#include <algorithm>

#include "comm/mpi_communicator.hpp"
#include "cp/layout.hpp"
#include "model/hybrid.hpp"
#include "model/mamba2_strategy.hpp"
#include "unit/fd.hpp"

using namespace hcp;
using namespace hcp::model;

namespace {
HybridConfig small(cp::AttnStrategy s, MambaCp m) {
  HybridConfig c;
  c.pattern = "M*E-ME";
  c.vocab = 23;
  c.hidden = 12;
  c.mamba.heads = 4;
  c.mamba.head_dim = 3;
  c.mamba.groups = 2;
  c.mamba.d_state = 4;
  c.mamba.chunk = 5;
  c.mamba_cp = m;
  c.attn.heads = 4;
  c.attn.kv_heads = 2;
  c.attn.head_dim = 4;
  c.attn.strategy = s;
  c.moe.experts = 4;
  c.moe.topk = 2;
  c.moe.ffn = 6;
  c.moe.shared_ffn = 5;
  c.moe.scaling = 2.5;
  c.mlp.ffn = 10;
  return c;
}
struct Batch {
  SeqLayout layout;
  std::vector<std::int64_t> tokens, labels;
};
// BSHD: 2 rows of 8*cp_max tokens; THD: three sequences packed and padded to 2*cp.
Batch make_batch(const std::string& f, int cp) {
  std::vector<std::vector<std::int64_t>> seqs;
  const std::vector<std::int64_t> lens = f == "bshd"   ? std::vector<std::int64_t>{32, 32}
                                         : f == "thd1" ? std::vector<std::int64_t>{37}
                                                       : std::vector<std::int64_t>{13, 6, 21};
  for (std::size_t s = 0; s < lens.size(); ++s) {
    std::vector<std::int64_t> q;
    for (std::int64_t t = 0; t < lens[s]; ++t) q.push_back(static_cast<std::int64_t>((s * 7 + t * t * 3 + t) % 23));
    seqs.push_back(q);
  }
  cp::PackedBatch pb = cp::pack_sequences(seqs, cp, 0);
  Batch b;
  b.layout = f == "bshd" ? SeqLayout::bshd(2, 32) : pb.layout;
  b.tokens = pb.tokens;
  b.labels = pb.labels;
  return b;
}
std::vector<std::int64_t> local_ids(const std::vector<std::int64_t>& v, const SeqLayout& g, int cp, int r) {
  std::vector<std::int64_t> out;
  for (auto i : cp::dcs_global_index(g, cp, r)) out.push_back(v[static_cast<std::size_t>(i)]);
  return out;
}
struct Out {
  StepResult r;
  ParamMap grads;  // whole (the experts' gathered over each EP group)
  Tensor dlogits;
  std::int64_t held = 0, expert_held = 0;  // parameter elements this rank holds, and of those the experts'
};
// One step on `comm` with experts split over groups of `ep` ranks (0: the whole group), each rank
// initialising only its own experts.
Out run(Communicator& comm, const HybridConfig& c, const Batch& b, std::uint64_t seed, int ep = 0) {
  const int cp = comm.size(), r = comm.rank();
  const ExpertGroups groups(comm, ep);
  const ShardMap shards = expert_shards(c, groups);
  const ParamMap p = hybrid_init(c, DType::F64, seed, &groups);
  HybridModel m(comm, c, b.layout, &groups);
  Out o;
  o.r = m.step(p, local_ids(b.tokens, b.layout, cp, r), local_ids(b.labels, b.layout, cp, r), o.grads);
  o.dlogits = cp::dcs_gather(comm, m.dlogits(), b.layout);
  for (auto& [n, t] : p) {
    o.held += t.numel();
    if (shards.count(n)) o.expert_held += t.numel();
  }
  for (auto& [n, sh] : shards) {
    Shape s = o.grads.at(n).shape();
    s[0] = sh.total;
    Tensor whole = Tensor::zeros(s, DType::F64);
    groups.ep().all_gather(o.grads.at(n), whole);
    o.grads[n] = whole;
  }
  return o;
}
}  // namespace

class Hybrid : public ::testing::TestWithParam<std::tuple<std::string, cp::AttnStrategy, MambaCp>> {};

TEST_P(Hybrid, MatchesCp1) {
  auto [format, strat, mcp] = GetParam();
  MpiCommunicator world(MPI_COMM_WORLD);
  auto self = world.split(world.rank(), 0);
  const int cp = world.size();
  HybridConfig c = small(strat, mcp);
  if (strat == cp::AttnStrategy::A2A_P2P) c.attn.cp_inner = cp % 2 == 0 ? 2 : 1;  // np 4: 2 x 2
  const Batch b = make_batch(format, cp);
  Out ref = run(*self, c, b, 3);
  Out got = run(world, c, b, 3);
  EXPECT_GT(ref.r.label_tokens, 0);
  EXPECT_EQ(got.r.label_tokens, ref.r.label_tokens);
  EXPECT_NEAR(got.r.loss, ref.r.loss, 1e-12 * std::abs(ref.r.loss));
  test::expect_close(got.dlogits, ref.dlogits, 1e-14, 1e-10, "dlogits");
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  for (auto& [n, t] : ref.grads) test::expect_close(got.grads.at(n), t, 1e-13, 1e-10, "d" + n);
}

// Every EP size that divides cp (1, 2, 4 at np 4) gives the cp=1 loss and gradients, and a rank's
// expert weights are 1/ep of them (param_count says the same).
TEST(HybridEp, EverySizeMatchesCp1AndHoldsItsShare) {
  MpiCommunicator world(MPI_COMM_WORLD);
  auto self = world.split(world.rank(), 0);
  const int cp = world.size();
  const HybridConfig c = small(cp::AttnStrategy::P2P, MambaCp::HiddenParallel);
  const Batch b = make_batch("thdpacked", cp);
  const Out ref = run(*self, c, b, 6);
  EXPECT_EQ(ref.held, param_count(c, 1).total);
  for (int ep = 1; ep <= cp; ++ep) {
    if (cp % ep != 0 || c.moe.experts % ep != 0) continue;
    SCOPED_TRACE("ep " + std::to_string(ep));
    const Out got = run(world, c, b, 6, ep);
    EXPECT_NEAR(got.r.loss, ref.r.loss, 1e-12 * std::abs(ref.r.loss));
    for (auto& [n, t] : ref.grads) test::expect_close(got.grads.at(n), t, 1e-13, 1e-10, "d" + n);
    EXPECT_EQ(got.expert_held * ep, ref.expert_held);
    EXPECT_EQ(got.held, param_count(c, ep).total);
    EXPECT_EQ(got.expert_held, param_count(c, ep).experts);
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, Hybrid,
                         ::testing::Combine(::testing::Values("bshd", "thd1", "thdpacked"),
                                            ::testing::ValuesIn(cp::attn_strategy_ids()),
                                            ::testing::ValuesIn(mamba_cp_ids())),
                         [](const auto& info) {
                           std::string s = cp::to_string(std::get<1>(info.param));
                           std::replace(s.begin(), s.end(), '+', '_');
                           return std::get<0>(info.param) + "_" + s + "_" + to_string(std::get<2>(info.param));
                         });

TEST(HybridCp1, PackedLossIsSumOfSequences) {
  MpiCommunicator world(MPI_COMM_WORLD);
  auto self = world.split(world.rank(), 0);
  const HybridConfig c = small(cp::AttnStrategy::P2P, MambaCp::StatePassing);
  const Batch b = make_batch("thdpacked", 1);
  const ParamMap p = hybrid_init(c, DType::F64, 4);
  HybridModel packed(*self, c, b.layout);
  const StepResult all = packed.forward(p, b.tokens, b.labels);
  double sum = 0;
  std::int64_t count = 0;
  for (std::int64_t s = 0; s < b.layout.nseq(); ++s) {
    const auto a = b.layout.cu_seqlens[static_cast<std::size_t>(s)], n = b.layout.len(s);
    std::vector<std::int64_t> t(b.tokens.begin() + a, b.tokens.begin() + a + n),
        l(b.labels.begin() + a, b.labels.begin() + a + n);
    HybridModel one(*self, c, SeqLayout::bshd(1, n));
    const StepResult r = one.forward(p, t, l);
    sum += r.loss * static_cast<double>(r.label_tokens);
    count += r.label_tokens;
  }
  EXPECT_EQ(count, all.label_tokens);
  EXPECT_NEAR(all.loss, sum / static_cast<double>(count), 1e-12);
}

TEST(HybridCp1, GradientsFiniteDifference) {
  MpiCommunicator world(MPI_COMM_WORLD);
  auto self = world.split(world.rank(), 0);
  HybridConfig c = small(cp::AttnStrategy::P2P, MambaCp::StatePassing);
  c.pattern = "M*E-";
  const Batch b = make_batch("thdpacked", 1);
  ParamMap p = hybrid_init(c, DType::F64, 5);
  HybridModel m(*self, c, b.layout);
  ParamMap g;
  m.step(p, b.tokens, b.labels, g);
  auto loss = [&] { return HybridModel(*self, c, b.layout).forward(p, b.tokens, b.labels).loss; };
  // A few elements of every parameter (all elements would take long): first, middle and last.
  for (auto& [n, t] : p) {
    if (is_buffer(n)) continue;
    for (std::int64_t i : {std::int64_t{0}, t.numel() / 2, t.numel() - 1}) {
      const double x0 = t.get(i), h = 1e-6;
      t.set(i, x0 + h);
      const double lp = loss();
      t.set(i, x0 - h);
      const double lm = loss();
      t.set(i, x0);
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(g.at(n).get(i), fd, 1e-7 + 1e-5 * std::abs(fd)) << n << "[" << i << "]";
    }
  }
}

// a2a+p2p's inner and outer groups are made once per model and inner size, not once per layer:
// the two a2a+p2p layers of "*E*" run over the same levels, a p2p layer beside them over none.
TEST(HybridLevels, A2aP2pLayersShareTheirGroups) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const int cp = world.size();
  if (cp < 4 || cp % 2) GTEST_SKIP() << "needs an even np >= 4 (inner 2, outer >= 2)";
  HybridConfig c = small(cp::AttnStrategy::A2A_P2P, MambaCp::HiddenParallel);
  c.pattern = "*E*-*";
  c.ep = 1;
  c.attn.cp_inner = 2;
  c.attn_layers = {cp::AttnStrategy::A2A_P2P, cp::AttnStrategy::P2P, cp::AttnStrategy::A2A_P2P};
  const SeqLayout g = SeqLayout::bshd(1, 4 * cp);
  HybridModel m(world, c, g);
  const ParamMap p = hybrid_init(c, DType::F64, 5);
  std::vector<std::int64_t> tok(static_cast<std::size_t>(g.total() / cp)), lab(tok.size());
  for (std::size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<std::int64_t>((i * 7 + 3) % 23);
    lab[i] = static_cast<std::int64_t>((i * 5 + 1) % 23);
  }
  ParamMap grads;
  m.step(p, tok, lab, grads);
  const CpLevels* a = m.attention(0).attention().levels();
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->inner, 2);
  EXPECT_EQ(m.attention(2).attention().levels(), a);
  EXPECT_EQ(m.attention(1).attention().levels(), nullptr);
}

TEST(HybridErrors, EpMustDivideCp) {
  MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() < 2) GTEST_SKIP() << "needs an EP size that does not divide cp";
  const int bad = world.size() + 1;
  EXPECT_NE(test::error_of([&] {
              ExpertGroups g(world, bad);
            }).find("parallel.ep = " + std::to_string(bad) + " must divide the CP group size"),
            std::string::npos);
}

TEST(HybridErrors, BadPattern) {
  MpiCommunicator world(MPI_COMM_WORLD);
  HybridConfig c = small(cp::AttnStrategy::P2P, MambaCp::StatePassing);
  c.pattern = "M*X";
  EXPECT_NE(
      test::error_of([&] { HybridModel m(world, c, SeqLayout::bshd(1, 8 * world.size())); }).find("'X' is not a block"),
      std::string::npos);
}
