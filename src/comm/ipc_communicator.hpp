// CUDA IPC backend of Communicator, for the ranks of one node when they share GPUs (NCCL refuses
// two ranks on one GPU). Each rank exports one device buffer per channel (the collectives', and
// one per ring tag) and its peers map it once, and again only when it grows. A transfer is device
// copies: the sender copies into its exported buffer, each receiver copies out of it; reductions
// read every rank's buffer in rank order, so all ranks get the same bits. Order comes from
// interprocess CUDA events and two small host messages per operation over MPI (the exporter's
// handles, then "ready"): nothing passes through host memory, and the host never waits for the
// device. The stream, the end events and the watchdog are DeviceOrder's, as in the NCCL backend.
// Host buffers (scalars, the results writer) go through MPI as they are; send/recv of device
// buffers are host-staged (no CP strategy uses them on the device).
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace hcp {

class IpcCommunicator final : public Communicator {
 public:
  // Collective over `comm` (duplicated). The current CUDA device is this rank's. Throws when a
  // rank of `comm` is on another node, or there are more than 64 ranks.
  explicit IpcCommunicator(MPI_Comm comm, double timeout_s = 300.0);
  ~IpcCommunicator() override;
  IpcCommunicator(const IpcCommunicator&) = delete;
  IpcCommunicator& operator=(const IpcCommunicator&) = delete;
  // Whether every rank of `comm` is on this node and there are at most 64 (collective over comm).
  static bool possible(MPI_Comm comm);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "cuda-ipc"; }

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
  // Bytes of device memory this rank exports (its channels' buffers, grown ones included).
  std::size_t exported_bytes() const;

  using Communicator::all_gather;
  using Communicator::all_reduce;
  using Communicator::all_to_all;
  using Communicator::broadcast;
  using Communicator::reduce_scatter;

 private:
  struct Impl;
  template <class F>
  void on_host(const std::string& op, F&& f);
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
};

}  // namespace hcp
