// Hierarchical attention CP (a2a+p2p: Ulysses over inner groups of parallel.cp_inner consecutive
// ranks, ring p2p over the outer groups) against the unpadded cp=1 problem, at every inner size that
// divides the rank count (np 4: 1x4, 2x2, 4x1; np 6: 2x3 and 3x2; np 8: 2x4 and 4x2), BSHD and packed
// THD with odd real lengths, GQA with fewer K/V heads than inner ranks and head blocks that straddle
// GQA groups; the bytes every rank hands to the communicator equal the strategy's model.
#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/mpi_communicator.hpp"
#include "cp/attention_cp.hpp"
#include "cp/layout.hpp"
#include "mpi/comm_bytes.hpp"
#include "unit/fd.hpp"

using namespace hcp;
using namespace hcp::cp;
namespace k = hcp::kernels;

namespace {
struct Result {
  Tensor o, dq, dk, dv;
};

// The unpadded problem on one rank.
Result cp1(const Tensor& q, const Tensor& kk, const Tensor& v, const Tensor& dout, const CpAttnConfig& c,
           const SeqLayout& unpadded) {
  k::AttnParams p;
  p.heads = c.heads;
  p.kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.mask = c.causal ? k::Mask::Causal : k::Mask::None;
  p.segments = k::segments_from_layout(unpadded, unpadded);
  Result g{Tensor::zeros(q.shape(), q.dtype()), Tensor::zeros(q.shape(), q.dtype()),
           Tensor::zeros(kk.shape(), q.dtype()), Tensor::zeros(v.shape(), q.dtype())};
  Tensor lse = Tensor::zeros({q.size(0), c.heads}, DType::F64);
  k::attention_fwd(g.o, lse, q, kk, v, p);
  k::attention_bwd(g.dq, g.dk, g.dv, q, kk, v, g.o, lse, dout, p);
  return g;
}

// [T_real, ...] -> [T_padded, ...] with zero pad rows.
Tensor pad(const Tensor& t, const SeqLayout& g) {
  std::vector<std::int64_t> shape = t.shape();
  shape[0] = g.total();
  Tensor out = Tensor::zeros(shape, t.dtype());
  const auto rows = real_rows(g);
  std::vector<std::int64_t> src(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) src[i] = static_cast<std::int64_t>(i);
  copy_rows(out, t, rows, src);
  return out;
}

SeqLayout layout(const std::string& f, int cp) {
  if (f == "bshd") return SeqLayout::bshd(2, 4 * cp);
  // odd real lengths 7, 3cp + 1 and 1, each padded to a multiple of 2cp
  std::vector<std::int64_t> real = {7, 3 * cp + 1, 1}, cu = {0};
  for (auto n : real) cu.push_back(cu.back() + (n + 2 * cp - 1) / (2 * cp) * (2 * cp));
  SeqLayout g = SeqLayout::thd(cu);
  g.real_lens = real;
  return g;
}
}  // namespace

TEST(CpAttentionA2AP2P, EveryInnerSizeMatchesUnpaddedCp1AndModel) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int cp = comm.size(), r = comm.rank();
  int cases = 0;
  for (int inner = 1; inner <= cp; ++inner) {
    if (cp % inner) continue;
    for (auto [H, Hkv] : {std::pair<std::int64_t, std::int64_t>{12, 12}, {12, 3}, {12, 2}, {12, 1}}) {
      if (H % inner) continue;
      for (const std::string f : {"bshd", "thd"})
        for (bool causal : {true, false}) {
          ++cases;
          CpAttnConfig c;
          c.placement.cp = cp;
          c.strategy = AttnStrategy::A2A_P2P;
          c.cp_inner = inner;
          c.heads = H;
          c.kv_heads = Hkv;
          c.head_dim = 4;
          c.causal = causal;
          c.placement.global = layout(f, cp);
          const SeqLayout u = c.placement.global.unpadded();
          const std::int64_t T = u.total();
          Tensor q = test::rand({T, H, 4}, 1), kk = test::rand({T, Hkv, 4}, 2), v = test::rand({T, Hkv, 4}, 3),
                 dout = test::rand({T, H, 4}, 4);
          const Result ref = cp1(q, kk, v, dout, c, u);
          const auto local = [&](const Tensor& t) {
            return dcs_partition(pad(t, c.placement.global), c.placement.global, cp, r);
          };
          Tensor ql = local(q), kl = local(kk), vl = local(v), dol = local(dout);
          Tensor o = Tensor::zeros(ql.shape(), DType::F64), dq = Tensor::zeros(ql.shape(), DType::F64),
                 dk = Tensor::zeros(kl.shape(), DType::F64), dv = Tensor::zeros(vl.shape(), DType::F64);
          CpAttention attn(comm, c);
          comm.reset_counters();
          attn.forward(o, ql, kl, vl);
          attn.backward(dq, dk, dv, dol);
          const std::string tag = std::to_string(inner) + "x" + std::to_string(cp / inner) + " " + f +
                                  (causal ? " causal" : " full") + " heads " + std::to_string(H) + "/" +
                                  std::to_string(Hkv) + " rank " + std::to_string(r);
          EXPECT_EQ(test::payload_sent(comm), attn.model_fwd_bytes(DType::F64) + attn.model_bwd_bytes(DType::F64))
              << tag;
          const auto real = [&](const Tensor& t) {
            return take_rows(dcs_gather(comm, t, c.placement.global), real_rows(c.placement.global));
          };
          test::expect_close(real(o), ref.o, 1e-12, 1e-10, "o " + tag);
          test::expect_close(real(dq), ref.dq, 1e-12, 1e-10, "dq " + tag);
          test::expect_close(real(dk), ref.dk, 1e-12, 1e-10, "dk " + tag);
          test::expect_close(real(dv), ref.dv, 1e-12, 1e-10, "dv " + tag);
        }
    }
  }
  EXPECT_GT(cases, 0);
}

TEST(CpAttentionA2AP2P, InnerSizesThatDoNotDivideFailOnEveryRank) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int cp = comm.size();
  CpAttnConfig c;
  c.placement.cp = cp;
  c.strategy = AttnStrategy::A2A_P2P;
  c.heads = 12;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.placement.global = SeqLayout::bshd(1, 4 * cp);
  c.cp_inner = cp + 1;
  if (cp > 1) {
    EXPECT_NE(test::error_of([&] {
                CpAttention a(comm, c);
              }).find("parallel.cp_inner (" + std::to_string(cp + 1) + ") to divide the CP size"),
              std::string::npos);
  }
  c.cp_inner = cp;
  c.heads = 5 * cp + (cp > 1 ? 1 : 0);
  c.kv_heads = 1;
  if (cp > 1) {
    EXPECT_NE(test::error_of([&] { CpAttention a(comm, c); }).find("divisible by parallel.cp_inner"),
              std::string::npos);
  }
}
