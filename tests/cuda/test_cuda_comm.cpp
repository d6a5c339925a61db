// Communicators on device buffers: the NCCL backend (one rank per GPU: run at np 1 here, where one
// GPU is lent) and the host-staged MPI backend (any number of ranks on one GPU), every op against
// the values the host computes. Skips without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/mpi_communicator.hpp"
#include "comm/nccl_communicator.hpp"
#include "cuda/gpu.hpp"
#include "kernels/cuda/runtime.hpp"
#include "unit/fd.hpp"

using namespace hcp;

namespace {

// Every op of `c` on device tensors, checked against host arithmetic.
void exercise(Communicator& c, DType dt) {
  const int n = c.size(), r = c.rank();
  const std::int64_t k = 5;
  auto val = [](int rank, std::int64_t i) { return static_cast<double>(rank * 100 + i); };
  // all_to_all: block j of rank r holds val(r, j*k + i); rank r receives block r of every rank.
  Tensor s = Tensor::empty({n * k}, dt);
  for (std::int64_t i = 0; i < n * k; ++i) s.set(i, val(r, i));
  Tensor S = s.to(Space::Cuda), R = Tensor::zeros({n * k}, dt, Space::Cuda);
  c.all_to_all(S, R);
  Tensor h = R.to(Space::Host);
  for (int j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < k; ++i) EXPECT_EQ(h.get(j * k + i), val(j, r * k + i)) << "all_to_all " << c.backend();
  // all_gather
  Tensor G = Tensor::zeros({n * k}, dt, Space::Cuda);
  c.all_gather(S.slice(0, 0, k).clone(), G);
  h = G.to(Space::Host);
  for (int j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < k; ++i) EXPECT_EQ(h.get(j * k + i), val(j, i)) << "all_gather";
  // all_reduce (sum) and reduce_scatter
  Tensor A = S.clone();
  c.all_reduce(A);
  h = A.to(Space::Host);
  for (std::int64_t i = 0; i < n * k; ++i) {
    double want = 0;
    for (int j = 0; j < n; ++j) want += val(j, i);
    EXPECT_EQ(h.get(i), want) << "all_reduce";
  }
  Tensor RS = Tensor::zeros({k}, dt, Space::Cuda);
  c.reduce_scatter(S, RS);
  h = RS.to(Space::Host);
  for (std::int64_t i = 0; i < k; ++i) {
    double want = 0;
    for (int j = 0; j < n; ++j) want += val(j, r * k + i);
    EXPECT_EQ(h.get(i), want) << "reduce_scatter";
  }
  // broadcast from the last rank
  Tensor Bc = S.clone();
  c.broadcast(Bc, n - 1);
  h = Bc.to(Space::Host);
  for (std::int64_t i = 0; i < n * k; ++i) EXPECT_EQ(h.get(i), val(n - 1, i)) << "broadcast";
  // all_to_all_v: rank r sends j+1 elements to rank j.
  std::vector<std::int64_t> sc(static_cast<std::size_t>(n)), rc(static_cast<std::size_t>(n));
  std::int64_t ns = 0, nr = 0;
  for (int j = 0; j < n; ++j) {
    sc[static_cast<std::size_t>(j)] = j + 1;
    rc[static_cast<std::size_t>(j)] = r + 1;
    ns += j + 1;
    nr += r + 1;
  }
  Tensor sv = Tensor::empty({ns}, dt);
  for (std::int64_t i = 0; i < ns; ++i) sv.set(i, val(r, i));
  Tensor SV = sv.to(Space::Cuda), RV = Tensor::zeros({nr}, dt, Space::Cuda);
  c.all_to_all_v(SV.raw(), sc, RV.raw(), rc, dt);
  h = RV.to(Space::Host);
  for (int j = 0; j < n; ++j) {
    const std::int64_t off = r * (r + 1) / 2;  // where rank j's block for rank r starts
    for (std::int64_t i = 0; i <= r; ++i) EXPECT_EQ(h.get(j * (r + 1) + i), val(j, off + i)) << "all_to_all_v";
  }
  // ring step: send to r+1, receive from r-1
  RingRequest q = c.ring_post(S.raw(), R.raw(), n * k, dt, (r + 1) % n, (r + n - 1) % n);
  c.ring_wait(q);
  h = R.to(Space::Host);
  for (std::int64_t i = 0; i < n * k; ++i) EXPECT_EQ(h.get(i), val((r + n - 1) % n, i)) << "ring step";
  // host scalars through a device backend
  EXPECT_EQ(c.all_reduce_scalar(1.0), static_cast<double>(n));
  c.barrier();
}
}  // namespace

TEST(CudaComm, HostStagedMpiEveryOp) {
  REQUIRE_GPU();
  MpiCommunicator world(MPI_COMM_WORLD);
  EXPECT_NE(world.backend().find("host-staged"), std::string::npos);
  for (DType dt : {DType::F32, DType::F64}) exercise(world, dt);
}

TEST(CudaComm, NcclEveryOp) {
  REQUIRE_GPU();
  MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() > cuda::device_count()) {
    // Several ranks on one GPU: NCCL must refuse with a clear message (host staging is the path).
    std::string msg;
    try {
      NcclCommunicator nc(world);
    } catch (const std::exception& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("one GPU per rank"), std::string::npos) << msg;
    return;
  }
  NcclCommunicator nc(world);
  EXPECT_EQ(nc.backend(), "nccl");
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) exercise(nc, dt);
  auto sub = nc.split(0, nc.rank());
  EXPECT_EQ(sub->size(), nc.size());
  exercise(*sub, DType::F32);
}
