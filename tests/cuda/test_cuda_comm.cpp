// Communicators on device buffers: the NCCL backend (one rank per GPU: run at np 1 here, where one
// GPU is lent), the CUDA IPC backend and the host-staged MPI backend (any number of ranks on one
// GPU), every op against the values the host computes; for IPC also chains of operations that the
// host never waits for, across buffer growth, and two ring steps in flight. Skips without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <thread>

#include "comm/device_order.hpp"
#include "comm/ipc_communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "comm/nccl_communicator.hpp"
#include "cuda/gpu.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/kernels.hpp"
#include "unit/fd.hpp"

using namespace hcp;

namespace {

// Every op of `c` on device tensors, checked against host arithmetic.
void exercise(Communicator& c, DType dt) {
  const int n = c.size(), r = c.rank();
  const std::int64_t k = 5;
  // Values as stored in dt (bf16 keeps 8 significant bits: 301 is held as 300); a reduction is
  // expected rounded once, as the IPC and NCCL backends give for these few ranks.
  auto rt = [dt](double v) {
    Tensor t = Tensor::empty({1}, dt);
    t.set(0, v);
    return t.get(0);
  };
  auto val = [rt](int rank, std::int64_t i) { return rt(static_cast<double>(rank * 100 + i)); };
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
    EXPECT_EQ(h.get(i), rt(want)) << "all_reduce";
  }
  Tensor RS = Tensor::zeros({k}, dt, Space::Cuda);
  c.reduce_scatter(S, RS);
  h = RS.to(Space::Host);
  for (std::int64_t i = 0; i < k; ++i) {
    double want = 0;
    for (int j = 0; j < n; ++j) want += val(j, r * k + i);
    EXPECT_EQ(h.get(i), rt(want)) << "reduce_scatter";
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

TEST(CudaComm, IpcEveryOp) {
  REQUIRE_GPU();
  MpiCommunicator world(MPI_COMM_WORLD);
  IpcCommunicator ipc(world.handle());
  EXPECT_EQ(ipc.backend(), "cuda-ipc");
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) exercise(ipc, dt);
  auto sub = ipc.split(world.rank() % 2, world.rank());
  exercise(*sub, DType::F32);
}

// Operations whose inputs are the outputs of the previous ones, with device compute between them
// and no host synchronisation: a missing order (a copy before the data, a buffer overwritten while
// a peer reads it) shows as a wrong value. Messages grow as the chain goes, so the exported buffers
// are replaced under way.
TEST(CudaComm, IpcChainsWithoutHostWaits) {
  REQUIRE_GPU();
  MpiCommunicator world(MPI_COMM_WORLD);
  IpcCommunicator c(world.handle());
  const int n = c.size(), r = c.rank();
  const DType dt = DType::F64;
  std::int64_t k = 1000;
  Tensor one = Tensor::zeros({n * k * 64}, dt);
  one.fill(1.0);
  Tensor ONE = one.to(Space::Cuda);
  // all_reduce chain: x <- sum over ranks of (x + 1), starting from the rank; then an all_to_all.
  double S = 0, v = 0;
  for (int j = 0; j < n; ++j) S += j;
  Tensor x = Tensor::zeros({n * k}, dt);
  x.fill(static_cast<double>(r));
  Tensor X = x.to(Space::Cuda);
  for (int it = 0; it < 6; ++it) {
    if (it == 3) {  // grow: four times the elements
      k *= 4;
      Tensor bigger = Tensor::zeros({n * k}, dt);
      bigger.fill(v);
      X = bigger.to(Space::Cuda);
    }
    Tensor O = ONE.slice(0, 0, n * k).clone();
    kernels::axpy(X, 1.0, O);  // device compute between the operations
    c.all_reduce(X);
    v = it == 0 ? S + n : n * (v + 1);
    Tensor Y = Tensor::zeros({n * k}, dt, Space::Cuda);
    c.all_to_all(X, Y);
    X = Y;
  }
  Tensor h = X.to(Space::Host);
  for (std::int64_t i = 0; i < n * k; i += 997) ASSERT_EQ(h.get(i), v) << "element " << i;
  // Two ring tags in flight (as the p2p backward does): a token goes around the ring on tag 7 while
  // a counter, incremented on the device at every hop, follows on tag 9.
  Tensor a = Tensor::zeros({4096}, dt), b = Tensor::zeros({4096}, dt);
  a.fill(static_cast<double>(r));
  Tensor A = a.to(Space::Cuda), An = Tensor::zeros({4096}, dt, Space::Cuda);
  Tensor B = b.to(Space::Cuda), Bn = Tensor::zeros({4096}, dt, Space::Cuda);
  for (int hop = 0; hop < 3 * n; ++hop) {
    RingRequest qa = c.ring_post(A.raw(), An.raw(), A.numel(), dt, (r + 1) % n, (r + n - 1) % n, 7);
    kernels::axpy(B, 1.0, ONE.slice(0, 0, 4096).clone());
    RingRequest qb = c.ring_post(B.raw(), Bn.raw(), B.numel(), dt, (r + 1) % n, (r + n - 1) % n, 9);
    c.ring_wait(qb);
    c.ring_wait(qa);
    std::swap(A, An);
    std::swap(B, Bn);
  }
  Tensor ha = A.to(Space::Host), hb = B.to(Space::Host);
  for (std::int64_t i = 0; i < 4096; i += 511) {
    ASSERT_EQ(ha.get(i), static_cast<double>(r)) << "token after 3 rounds";
    ASSERT_EQ(hb.get(i), static_cast<double>(3 * n)) << "counter after " << 3 * n << " hops";
  }
  EXPECT_GT(c.exported_bytes(), 0u);
}

// The watchdog: an operation that does not complete within the timeout (here the stream is held
// by a host function for 2 s against a 0.3 s timeout) calls the backend's abort once with the
// operation's name, and the next call throws that message instead of queueing more work.
TEST(CudaComm, DeviceOrderWatchdogFires) {
  REQUIRE_GPU();
  std::string aborted;
  int calls = 0;
  {
    DeviceOrder order(0.3, {}, [&](const std::string& why) {
      aborted = why;
      ++calls;
    });
    HCP_CHECK(cudaLaunchHostFunc(
                  order.stream(), [](void*) { std::this_thread::sleep_for(std::chrono::seconds(2)); }, nullptr) ==
                  cudaSuccess,
              "cudaLaunchHostFunc");
    order.end("held op");
    std::string thrown;
    for (int i = 0; i < 200 && thrown.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      try {
        order.begin();
      } catch (const std::exception& e) {
        thrown = e.what();
      }
    }
    EXPECT_NE(thrown.find("held op did not complete within"), std::string::npos) << thrown;
    cudaStreamSynchronize(order.stream());
  }
  EXPECT_EQ(calls, 1);
  EXPECT_NE(aborted.find("held op"), std::string::npos) << aborted;
}
