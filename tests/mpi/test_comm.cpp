// Every communicator op against a serial computation of the expected result, at np 1, 2, 4.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

#include "comm/mpi_communicator.hpp"
#include "comm/pinned_cache.hpp"
#include "comm/process_grid.hpp"
#include "harness.hpp"

using namespace hcp;

namespace {
// The value rank r contributes at element i (exact in bf16 as well for np <= 4).
double val(int r, std::int64_t i) { return 64.0 * r + static_cast<double>(i); }  // < 256: exact in bf16
}  // namespace

class Comm : public ::testing::TestWithParam<DType> {};

TEST_P(Comm, AllToAllEqualSplits) {
  MpiCommunicator c(MPI_COMM_WORLD);
  const int p = c.size(), r = c.rank();
  const std::int64_t blk = 5;
  Tensor s = Tensor::empty({p * blk}, GetParam()), d = Tensor::zeros({p * blk}, GetParam());
  for (std::int64_t i = 0; i < p * blk; ++i) s.set(i, val(r, i));
  c.all_to_all(s, d);
  for (int k = 0; k < p; ++k)
    for (std::int64_t j = 0; j < blk; ++j) EXPECT_EQ(d.get(k * blk + j), val(k, r * blk + j));
  EXPECT_EQ(c.counters().at("all_to_all").bytes_sent,
            blk * (p - 1) * static_cast<std::int64_t>(dtype_size(GetParam())));
}

TEST_P(Comm, AllToAllV) {
  MpiCommunicator c(MPI_COMM_WORLD);
  const int p = c.size(), r = c.rank();
  // Rank r sends (r + k) % 3 elements to rank k, some zero.
  std::vector<std::int64_t> sc(p), rc(p);
  std::int64_t ns = 0, nr = 0;
  for (int k = 0; k < p; ++k) {
    sc[k] = (r + k) % 3;
    rc[k] = (k + r) % 3;
    ns += sc[k];
    nr += rc[k];
  }
  Tensor s = Tensor::empty({std::max<std::int64_t>(ns, 1)}, GetParam());
  Tensor d = Tensor::zeros({std::max<std::int64_t>(nr, 1)}, GetParam());
  std::int64_t o = 0;
  for (int k = 0; k < p; ++k)
    for (std::int64_t j = 0; j < sc[k]; ++j) s.set(o++, val(r, 10 * k + j));
  c.all_to_all_v(s.raw(), sc, d.raw(), rc, GetParam());
  o = 0;
  for (int k = 0; k < p; ++k)
    for (std::int64_t j = 0; j < rc[k]; ++j) EXPECT_EQ(d.get(o++), val(k, 10 * r + j));
}

TEST_P(Comm, AllGatherReduceScatterAllReduceBroadcast) {
  MpiCommunicator c(MPI_COMM_WORLD);
  const int p = c.size(), r = c.rank();
  const DType dt = GetParam();
  Tensor s = Tensor::empty({3}, dt), g = Tensor::zeros({p * 3}, dt);
  for (int i = 0; i < 3; ++i) s.set(i, val(r, i));
  c.all_gather(s, g);
  for (int k = 0; k < p; ++k)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(g.get(k * 3 + i), val(k, i));
  // Reductions (bf16 too: combined in fp32, rounded once per combine); small integers keep every
  // partial sum exact in all three types.
  auto sm = [](int k, int i) { return static_cast<double>(k + 2 * i); };
  Tensor rs = Tensor::empty({p * 2}, dt), out = Tensor::zeros({2}, dt);
  for (int i = 0; i < p * 2; ++i) rs.set(i, sm(r, i));
  c.reduce_scatter(rs, out);
  for (int i = 0; i < 2; ++i) {
    double e = 0;
    for (int k = 0; k < p; ++k) e += sm(k, r * 2 + i);
    EXPECT_EQ(out.get(i), e);
  }
  Tensor ar = Tensor::empty({4}, dt);
  for (int i = 0; i < 4; ++i) ar.set(i, sm(r, i));
  c.all_reduce(ar);
  for (int i = 0; i < 4; ++i) {
    double e = 0;
    for (int k = 0; k < p; ++k) e += sm(k, i);
    EXPECT_EQ(ar.get(i), e);
  }
  Tensor mx = Tensor::from({static_cast<double>(r)}, {1}, dt);
  c.all_reduce(mx, ReduceOp::Max);
  EXPECT_EQ(mx.get(0), p - 1);
  if (dt == DType::BF16 && p == 2) {  // 256 + 1 is not a bf16: the fp32 sum rounds to even, 256
    Tensor x = Tensor::from({r == 0 ? 256.0 : 1.0}, {1}, dt);
    c.all_reduce(x);
    EXPECT_EQ(x.get(0), 256.0);
  }
  Tensor b = Tensor::empty({2}, dt);
  b.set(0, val(r, 0));
  b.set(1, val(r, 1));
  c.broadcast(b, p - 1);
  EXPECT_EQ(b.get(0), val(p - 1, 0));
  EXPECT_EQ(b.get(1), val(p - 1, 1));
}

TEST_P(Comm, RingStepAndSendRecv) {
  MpiCommunicator c(MPI_COMM_WORLD);
  const int p = c.size(), r = c.rank();
  Tensor s = Tensor::empty({4}, GetParam()), d = Tensor::zeros({4}, GetParam());
  for (int i = 0; i < 4; ++i) s.set(i, val(r, i));
  // Full ring: after p steps every block is back home.
  Tensor cur = s.clone();
  for (int step = 0; step < p; ++step) {
    RingRequest req = c.ring_post(cur.raw(), d.raw(), 4, GetParam(), (r + 1) % p, (r - 1 + p) % p);
    c.ring_wait(req);
    const int owner = ((r - step - 1) % p + p) % p;
    for (int i = 0; i < 4; ++i) EXPECT_EQ(d.get(i), val(owner, i));
    std::swap(cur, d);
  }
  EXPECT_EQ(cur.to_vector(), s.to_vector());
  if (p > 1) {
    if (r == 0) c.send(s.raw(), 4, GetParam(), 1, 3);
    if (r == 1) {
      c.recv(d.raw(), 4, GetParam(), 0, 3);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(d.get(i), val(0, i));
    }
  }
  c.barrier();
  EXPECT_EQ(c.counters().at("ring_post").calls, p);
}

INSTANTIATE_TEST_SUITE_P(DTypes, Comm, ::testing::Values(DType::F32, DType::F64, DType::BF16),
                         [](const auto& info) { return to_string(info.param); });

namespace {
int g_allocs = 0, g_frees = 0;  // calls of the test's allocator
void* counted_alloc(std::size_t n) {
  ++g_allocs;
  return std::malloc(n);
}
void counted_free(void* p) {
  ++g_frees;
  std::free(p);
}
}  // namespace

// The host-staged path's buffer cache: an idle buffer of the size class is reused without a new
// allocation, taken buffers are never handed out twice, everything is freed once.
TEST(PinnedCache, ReusesIdleBuffersAndFreesOnce) {
  g_allocs = g_frees = 0;
  {
    PinnedCache c(counted_alloc, counted_free);
    void* a = c.take(100000);  // a 128 KiB buffer
    void* b = c.take(100000);  // a is taken: a second one
    EXPECT_NE(a, b);
    c.give(a);
    EXPECT_EQ(c.take(120000), a);  // same size class, idle: reused
    EXPECT_EQ(g_allocs, 2);
    void* big = c.take(std::size_t{1} << 20);
    c.give(big);
    c.give(b);
    EXPECT_EQ(c.take(1000), b);  // the smallest idle buffer that holds it, not the 1 MiB one
    EXPECT_EQ(c.take(std::size_t{1} << 20), big);
    EXPECT_EQ(g_allocs, 3);
    EXPECT_EQ(c.held_bytes(), 2 * (std::size_t{128} << 10) + (std::size_t{1} << 20));
    c.give(big);
    const auto error_of = [](auto&& f) {
      try {
        f();
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    EXPECT_NE(error_of([&] { c.give(big); }).find("was not taken"), std::string::npos);
    int local = 0;
    EXPECT_NE(error_of([&] { c.give(&local); }).find("not from this cache"), std::string::npos);
  }
  EXPECT_EQ(g_frees, 3);
}

TEST(ProcessGrid, SplitsAndErrors) {
  MpiCommunicator w(MPI_COMM_WORLD);
  const int p = w.size(), r = w.rank();
  for (int cp = 1; cp <= p; cp *= 2) {
    if (p % cp) continue;
    auto g = ProcessGrid::make(w, cp);
    EXPECT_EQ(g.cp->size(), cp);
    EXPECT_EQ(g.cp_rank, r % cp);
    EXPECT_EQ(g.dp->size(), p / cp);
    EXPECT_EQ(g.dp_rank, r / cp);
    // The CP group really is consecutive ranks: gather world ranks inside it.
    std::vector<double> ranks = g.cp->gather_to_root(r);
    for (int k = 0; k < cp; ++k) EXPECT_EQ(ranks[k], (r / cp) * cp + k);
    // self is this rank alone: a sum over it is this rank's own value.
    EXPECT_EQ(g.self->size(), 1);
    EXPECT_EQ(g.self->rank(), 0);
    EXPECT_EQ(g.self->gather_to_root(r + 1.0)[0], r + 1.0);
  }
  if (p > 1) {
    try {
      ProcessGrid::make(w, p + 1);
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("parallel.cp_size"), std::string::npos);
    }
  }
  EXPECT_THROW(ProcessGrid::make(w, 0), Error);
}

TEST(Harness, AgreeOnErrorsPicksLowestFailingRank) {
  MpiCommunicator w(MPI_COMM_WORLD);
  std::string msg;
  EXPECT_TRUE(agree_on_errors(
      w, [] {}, &msg, false));
  const int bad = w.size() - 1;
  bool ok = agree_on_errors(
      w,
      [&] {
        if (w.rank() >= bad) throw Error("bad rank " + std::to_string(w.rank()));
      },
      &msg, false);
  EXPECT_FALSE(ok);
  EXPECT_EQ(msg, "bad rank " + std::to_string(bad));
}
