// Attention CP (every registered strategy: p2p ring, all-gather, a2a, a2a+p2p) against cp=1 on the
// same backend, for every format, mask and GQA ratio, fp64 and fp32; DCS layout maths and the
// placements; errors on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>

#include "comm/mpi_communicator.hpp"
#include "cp/attention_cp.hpp"
#include "cp/layout.hpp"
#include "cp/placement.hpp"
#include "mpi/comm_bytes.hpp"
#include "unit/fd.hpp"

using namespace hcp;
using namespace hcp::cp;
namespace k = hcp::kernels;

TEST(DcsLayout, PartitionRoundTripAndPositions) {
  for (int cp : {1, 2, 4}) {
    for (const SeqLayout& g : {SeqLayout::bshd(2, 16), SeqLayout::thd({0, 8, 32, 40})}) {
      Tensor x = test::rand({g.total(), 3}, 7);
      std::vector<Tensor> parts;
      for (int r = 0; r < cp; ++r) parts.push_back(dcs_partition(x, g, cp, r));
      Tensor rm = Tensor::empty({g.total(), 3}, DType::F64);
      for (int r = 0; r < cp; ++r) rm.slice(0, r * (g.total() / cp), g.total() / cp).copy_from(parts[r]);
      EXPECT_EQ(dcs_undo(rm, g, cp).to_vector(), x.to_vector());
      EXPECT_EQ(dcs_redo(x, g, cp).to_vector(), rm.to_vector());
    }
  }
  // cp = 2, one sequence of 8: rank 0 keeps chunks 0 and 3, rank 1 chunks 1 and 2.
  auto g = SeqLayout::thd({0, 8});
  EXPECT_EQ(dcs_global_index(g, 2, 0), (std::vector<std::int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(dcs_global_index(g, 2, 1), (std::vector<std::int64_t>{2, 3, 4, 5}));
  auto g2 = SeqLayout::thd({0, 8, 12});
  EXPECT_EQ(dcs_positions(g2, 2, 1), (std::vector<std::int64_t>{2, 3, 4, 5, 1, 2}));
  EXPECT_EQ(local_layout(g2, 2).cu_seqlens, (std::vector<std::int64_t>{0, 4, 6}));
  EXPECT_NE(test::error_of([&] {
              dcs_global_index(SeqLayout::thd({0, 8, 14}), 2, 0);
            }).find("sequence 1 has length 6, which must be a multiple of 2*cp = 4"),
            std::string::npos);
}

TEST(DcsLayout, PackingAndSeqIdx) {
  auto b = pack_sequences({{5, 6, 7}, {8}, {1, 2, 3, 4, 5}}, 2, 0);
  EXPECT_EQ(b.layout.cu_seqlens, (std::vector<std::int64_t>{0, 4, 8, 16}));
  EXPECT_EQ(b.tokens, (std::vector<std::int64_t>{5, 6, 7, 0, 8, 0, 0, 0, 1, 2, 3, 4, 5, 0, 0, 0}));
  EXPECT_EQ(b.labels[0], 6);
  EXPECT_EQ(b.labels[2], -100);  // last real token has no target
  EXPECT_EQ(b.labels[3], -100);  // pad
  EXPECT_EQ(b.label_tokens, 2 + 0 + 4);
  // First token of each sequence belongs to that sequence (right=True).
  EXPECT_EQ(seq_idx_from_cu({0, 4, 8, 16}),
            (std::vector<std::int64_t>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2}));
}

namespace {
struct Grads {
  Tensor o, dq, dk, dv;
};
// cp = 1 reference on full tensors.
Grads reference(const Tensor& q, const Tensor& kk, const Tensor& v, const Tensor& dout, const CpAttnConfig& c) {
  k::AttnParams p;
  p.heads = c.heads;
  p.kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.mask = c.causal ? k::Mask::Causal : k::Mask::None;
  p.segments = k::segments_from_layout(c.placement.global, c.placement.global);
  Grads g{Tensor::zeros(q.shape(), q.dtype()), Tensor::zeros(q.shape(), q.dtype()),
          Tensor::zeros(kk.shape(), q.dtype()), Tensor::zeros(v.shape(), q.dtype())};
  Tensor lse = Tensor::zeros({q.size(0), c.heads}, q.dtype() == DType::F64 ? DType::F64 : DType::F32);
  k::attention_fwd(g.o, lse, q, kk, v, p);
  k::attention_bwd(g.dq, g.dk, g.dv, q, kk, v, g.o, lse, dout, p);
  return g;
}
}  // namespace

struct CpCase {
  AttnStrategy strategy;
  std::string format;  // bshd, thd1, thdpacked
  bool causal;
  std::int64_t kv_heads;
  DType dtype;
};

class CpAttentionGrid : public ::testing::TestWithParam<CpCase> {};

TEST_P(CpAttentionGrid, MatchesCp1) {
  const CpCase cc = GetParam();
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int cp = comm.size(), r = comm.rank();
  if (8 % (2 * cp)) GTEST_SKIP() << "the grid's lengths (multiples of 8) split over cp 1, 2, 4";
  CpAttnConfig c;
  c.placement.cp = cp;
  c.strategy = cc.strategy;
  c.heads = 4;
  c.kv_heads = cc.kv_heads;
  c.head_dim = 4;
  c.causal = cc.causal;
  if (attn_strategy_info(cc.strategy).two_level && cp % 2 == 0) c.cp_inner = 2;  // np 2: 2 x 1, np 4: 2 x 2
  c.placement.global = cc.format == "bshd"   ? SeqLayout::bshd(2, 16)
                       : cc.format == "thd1" ? SeqLayout::thd({0, 24})
                                             : SeqLayout::thd({0, 8, 24, 32});
  const std::int64_t T = c.placement.global.total(), H = c.heads, Hkv = c.kv_heads, D = c.head_dim;
  Tensor q = test::rand({T, H, D}, 1, -1, 1, cc.dtype), kk = test::rand({T, Hkv, D}, 2, -1, 1, cc.dtype),
         v = test::rand({T, Hkv, D}, 3, -1, 1, cc.dtype), dout = test::rand({T, H, D}, 4, -1, 1, cc.dtype);
  Grads ref = reference(q, kk, v, dout, c);
  CpAttention attn(comm, c);
  Tensor ql = dcs_partition(q, c.placement.global, cp, r), kl = dcs_partition(kk, c.placement.global, cp, r),
         vl = dcs_partition(v, c.placement.global, cp, r), dol = dcs_partition(dout, c.placement.global, cp, r);
  Tensor o = Tensor::zeros(ql.shape(), cc.dtype), dq = Tensor::zeros(ql.shape(), cc.dtype),
         dk = Tensor::zeros(kl.shape(), cc.dtype), dv = Tensor::zeros(vl.shape(), cc.dtype);
  comm.reset_counters();
  attn.forward(o, ql, kl, vl);
  attn.backward(dq, dk, dv, dol);
  // The payload this rank handed to the communicator equals the strategy's model, every strategy.
  EXPECT_EQ(test::payload_sent(comm), attn.model_fwd_bytes(cc.dtype) + attn.model_bwd_bytes(cc.dtype)) << "rank " << r;
  // fp64: 1e-10 relative; fp32: 1e-5 relative (the drivers' tolerances), with a small absolute floor.
  const double rtol = cc.dtype == DType::F64 ? 1e-10 : 1e-5, atol = cc.dtype == DType::F64 ? 1e-12 : 1e-6;
  test::expect_close(dcs_gather(comm, o, c.placement.global), ref.o, atol, rtol, "o");
  test::expect_close(dcs_gather(comm, dq, c.placement.global), ref.dq, atol, rtol, "dq");
  test::expect_close(dcs_gather(comm, dk, c.placement.global), ref.dk, atol, rtol, "dk");
  test::expect_close(dcs_gather(comm, dv, c.placement.global), ref.dv, atol, rtol, "dv");
}

static std::vector<CpCase> grid() {
  std::vector<CpCase> v;
  for (const AttnStrategyInfo& r : attn_strategies())  // every registered strategy
    for (std::string f : {"bshd", "thd1", "thdpacked"})
      for (bool causal : {true, false})
        for (std::int64_t kvh : {4, 2, 1})
          for (DType dt : {DType::F64, DType::F32}) v.push_back({r.id, f, causal, kvh, dt});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, CpAttentionGrid, ::testing::ValuesIn(grid()), [](const auto& info) {
  const CpCase& c = info.param;
  std::string name = to_string(c.strategy);
  std::replace(name.begin(), name.end(), '+', '_');
  return name + "_" + c.format + "_" + (c.causal ? "causal" : "full") + "_kv" + std::to_string(c.kv_heads) + "_" +
         hcp::to_string(c.dtype);
});

// Ulysses with any kv_heads: each rank receives exactly the K/V heads its query heads read, however
// the head blocks fall across the GQA groups (whole groups, parts of one, or spanning two).
TEST(CpAttentionA2A, AnyKvHeadsMatchesCp1AndModel) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int cp = comm.size(), r = comm.rank();
  int cases = 0;
  for (auto [H, Hkv] : {std::pair<std::int64_t, std::int64_t>{6, 3}, {12, 3}, {6, 2}, {12, 4}, {12, 12}, {12, 1}}) {
    if (H % cp) continue;
    ++cases;
    CpAttnConfig c;
    c.placement.cp = cp;
    c.strategy = AttnStrategy::A2A;
    c.heads = H;
    c.kv_heads = Hkv;
    c.head_dim = 4;
    c.placement.global = SeqLayout::thd({0, 6 * cp, 10 * cp});
    const std::int64_t T = c.placement.global.total();
    Tensor q = test::rand({T, H, 4}, 1), kk = test::rand({T, Hkv, 4}, 2), v = test::rand({T, Hkv, 4}, 3),
           dout = test::rand({T, H, 4}, 4);
    const Grads ref = reference(q, kk, v, dout, c);
    CpAttention attn(comm, c);
    Tensor ql = dcs_partition(q, c.placement.global, cp, r), kl = dcs_partition(kk, c.placement.global, cp, r),
           vl = dcs_partition(v, c.placement.global, cp, r), dol = dcs_partition(dout, c.placement.global, cp, r);
    Tensor o = Tensor::zeros(ql.shape(), DType::F64), dq = Tensor::zeros(ql.shape(), DType::F64),
           dk = Tensor::zeros(kl.shape(), DType::F64), dv = Tensor::zeros(vl.shape(), DType::F64);
    comm.reset_counters();
    attn.forward(o, ql, kl, vl);
    attn.backward(dq, dk, dv, dol);
    const std::string tag = "heads " + std::to_string(H) + " kv " + std::to_string(Hkv) + " rank " + std::to_string(r);
    EXPECT_EQ(test::payload_sent(comm), attn.model_fwd_bytes(DType::F64) + attn.model_bwd_bytes(DType::F64)) << tag;
    test::expect_close(dcs_gather(comm, o, c.placement.global), ref.o, 1e-12, 1e-10, "o " + tag);
    test::expect_close(dcs_gather(comm, dq, c.placement.global), ref.dq, 1e-12, 1e-10, "dq " + tag);
    test::expect_close(dcs_gather(comm, dk, c.placement.global), ref.dk, 1e-12, 1e-10, "dk " + tag);
    test::expect_close(dcs_gather(comm, dv, c.placement.global), ref.dv, 1e-12, 1e-10, "dv " + tag);
  }
  EXPECT_GT(cases, 0);
}

// bf16 ring p2p merges O and accumulates dQ and the travelling dK/dV in fp32, rounding once: the CP
// result stays within 2^-7 of the largest value (two bf16 steps) of the cp=1 result in bf16. Rounded
// at every ring step instead, dQ drifts past that at cp 4 (9e-3 of its largest value).
TEST(CpAttentionBf16, P2PRoundsOnceNotEveryStep) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int cp = comm.size(), r = comm.rank();
  auto self = comm.split(r, 0);
  CpAttnConfig c;
  c.placement.cp = cp;
  c.strategy = AttnStrategy::P2P;
  c.heads = 8;
  c.kv_heads = 2;
  c.head_dim = 32;
  c.placement.global = SeqLayout::thd({0, 50 * 2 * cp, 64 * 2 * cp, 70 * 2 * cp});
  const std::int64_t T = c.placement.global.total();
  const DType bf = DType::BF16;
  Tensor q = test::rand({T, 8, 32}, 1, -1, 1, bf), kk = test::rand({T, 2, 32}, 2, -1, 1, bf),
         v = test::rand({T, 2, 32}, 3, -1, 1, bf), dout = test::rand({T, 8, 32}, 4, -1, 1, bf);
  const auto run = [&](Communicator& cm) {
    const int n = cm.size(), me = cm.rank();
    CpAttnConfig cn = c;
    cn.placement = Placement::dcs(c.placement.global, n);
    CpAttention a(cm, cn);
    Tensor ql = dcs_partition(q, c.placement.global, n, me), kl = dcs_partition(kk, c.placement.global, n, me),
           vl = dcs_partition(v, c.placement.global, n, me), dol = dcs_partition(dout, c.placement.global, n, me);
    std::vector<Tensor> g = {Tensor::zeros(ql.shape(), bf), Tensor::zeros(ql.shape(), bf),
                             Tensor::zeros(kl.shape(), bf), Tensor::zeros(vl.shape(), bf)};
    a.forward(g[0], ql, kl, vl);
    a.backward(g[1], g[2], g[3], dol);
    for (auto& t : g) t = dcs_gather(cm, t, c.placement.global);
    return g;
  };
  const auto ref = run(*self), got = run(comm);
  const char* names[] = {"o", "dq", "dk", "dv"};
  for (int i = 0; i < 4; ++i) {
    const ErrorStats e = compare(got[i], ref[i]);
    EXPECT_LE(e.max_abs, 0x1p-7 * e.ref_max)
        << names[i] << " at cp " << cp << ": max abs " << e.max_abs << ", max " << e.ref_max;
  }
}

TEST(CpAttentionErrors, ShapesThatDoNotDivideFailOnEveryRank) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int cp = comm.size();
  CpAttnConfig c;
  c.placement.cp = cp;
  c.heads = 4;
  c.kv_heads = 4;
  c.head_dim = 4;
  c.placement.global = SeqLayout::thd({0, 2 * cp + 1});
  if (cp > 1)
    EXPECT_NE(test::error_of([&] { CpAttention a(comm, c); }).find("must be a multiple of 2*cp"), std::string::npos);
  else  // one rank runs any length (the unpadded reference)
    EXPECT_EQ(test::error_of([&] { CpAttention a(comm, c); }), "(no error)");
  c.placement.global = SeqLayout::bshd(1, 8 * cp);
  c.heads = cp + 1;
  c.kv_heads = cp + 1;
  c.strategy = AttnStrategy::A2A;
  if (cp > 1) {
    EXPECT_NE(test::error_of([&] { CpAttention a(comm, c); }).find("divisible by cp"), std::string::npos);
  }
  c.heads = 4;
  c.kv_heads = 3;
  EXPECT_NE(test::error_of([&] { CpAttention a(comm, c); }).find("positive multiple of attention.kv_heads"),
            std::string::npos);
}

// cp::Placement, DualChunkSwap and per document alike on the same documents: every real row of the
// unpadded problem is held by exactly one rank, a rank's rows gathered back come out in the
// unpadded order, and take() hands each rank the values its rows index (pads: the pad value).
TEST(Placement, BothPlacementsHoldEveryRealRowOnceAndGatherInOrder) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int cp = comm.size(), r = comm.rank();
  const std::vector<std::int64_t> lens = {7, 30, 1, 12, 5};
  std::vector<std::vector<std::int64_t>> seqs;
  std::int64_t next = 0, T = 0;
  for (const std::int64_t n : lens) {  // token ids 1.. in global order, so the id names the real row
    seqs.emplace_back();
    for (std::int64_t j = 0; j < n; ++j) seqs.back().push_back(++next);
    T += n;
  }
  const PackedBatch pb = pack_sequences(seqs, cp, 0);
  const SeqLayout u = pb.layout.unpadded();
  std::vector<std::int64_t> real_ids;
  for (std::int64_t i = 1; i <= T; ++i) real_ids.push_back(i);
  const auto docs = std::make_shared<const DocPartition>(partition_documents(lens, cp, 0, DocCost{}));
  for (const Placement& p : {Placement::dcs(pb.layout, cp), Placement::documents(u, docs)}) {
    const std::string tag = p.by_documents() ? "documents" : "dcs";
    // the token ids this rank holds: from the padded batch (dcs) or the unpadded one (documents)
    const std::vector<std::int64_t> ids = p.take(p.by_documents() ? real_ids : pb.tokens, r, 0);
    const std::vector<std::int64_t> real = p.real_index(r);
    ASSERT_EQ(static_cast<std::int64_t>(ids.size()), p.local_rows(r)) << tag;
    ASSERT_EQ(real.size(), ids.size()) << tag;
    std::vector<double> mine(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(ids[i], real[i] + 1) << tag << " row " << i;  // a pad: id 0, real index -1
      mine[i] = static_cast<double>(ids[i]);
    }
    // every real row exactly once over the group
    std::vector<double> count(static_cast<std::size_t>(T), 0.0);
    for (const std::int64_t i : real)
      if (i >= 0) count[static_cast<std::size_t>(i)] += 1;
    comm.all_reduce(count.data(), T, DType::F64, ReduceOp::Sum);
    for (std::int64_t i = 0; i < T; ++i) EXPECT_EQ(count[static_cast<std::size_t>(i)], 1.0) << tag << " row " << i;
    const Tensor local = Tensor::from(mine, {static_cast<std::int64_t>(mine.size()), 1}, DType::F64);
    const Tensor all = p.gather_real(comm, local);
    ASSERT_EQ(all.size(0), T) << tag;
    for (std::int64_t i = 0; i < T; ++i) EXPECT_EQ(all.get(i), static_cast<double>(i + 1)) << tag << " row " << i;
  }
}
