// MPI backend of Communicator: host memory directly; device memory (CUDA tensors, when a device
// backend is registered) staged through page-locked host buffers ("host-staged MPI").
#pragma once
#include <mpi.h>

#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/pinned_cache.hpp"

namespace hcp {

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm` (the caller keeps ownership of its own handle).
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override;
  MPI_Comm handle() const { return comm_; }

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
  PinnedCache* cache();  // the staging buffers' cache (made on first use; null without a device backend)
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<PinnedCache> pinned_;        // declared before staged_: outlives the stages that hold its buffers
  std::vector<MPI_Request> pending_;           // requests of in-flight ring steps, indexed by RingRequest handles
  std::vector<std::shared_ptr<void>> staged_;  // their staging buffers (same index)
};

}  // namespace hcp
