// NCCL backend of Communicator for device buffers, one GPU per rank. Bootstrapped over MPI: rank 0
// of the given communicator creates the ncclUniqueId, which is broadcast over it. Operations are
// queued on a communication stream after the compute queued so far, and the default stream waits
// for their end (DeviceOrder): the host does not block on a transfer (ring_post queues the step,
// ring_wait orders the compute after it). The host waits only for results in host buffers
// (scalars, staged through device memory). A watchdog thread checks NCCL's asynchronous errors and
// a timeout: a dead or hung peer ends in ncclCommAbort, and the next call throws an hcp::Error
// naming the operation, never a silent hang.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace hcp {

std::string nccl_version();  // "NCCL 2.28.3"

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap` (same ranks, same order). The current CUDA device is used
  // (hcp::cuda::init selects it from the local rank). Throws if two ranks share a GPU.
  explicit NcclCommunicator(Communicator& bootstrap, double timeout_s = 300.0);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  void all_to_all(const void* send, void* recv, std::int64_t count, DType dt) override;
  void all_to_all_v(const void* send, const std::vector<std::int64_t>& send_counts, void* recv,
                    const std::vector<std::int64_t>& recv_counts, DType dt) override;
  void all_gather(const void* send, void* recv, std::int64_t count, DType dt) override;
  void reduce_scatter(const void* send, void* recv, std::int64_t count, DType dt, ReduceOp op) override;
  void all_reduce(void* buf, std::int64_t count, DType dt, ReduceOp op) override;
  void broadcast(void* buf, std::int64_t count, DType dt, int root) override;
  void send(const void* buf, std::int64_t count, DType dt, int dst, int tag) override;
  void recv(void* buf, std::int64_t count, DType dt, int src, int tag) override;
  RingRequest ring_post(const void* send, void* recv, std::int64_t count, DType dt, int dst, int src,
                        int tag = 7) override;
  void ring_wait(RingRequest& req) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) const override;

  using Communicator::all_gather;
  using Communicator::all_reduce;
  using Communicator::all_to_all;
  using Communicator::broadcast;
  using Communicator::reduce_scatter;

 private:
  struct Impl;
  NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int size, double timeout_s);
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 300.0;
};

}  // namespace hcp
