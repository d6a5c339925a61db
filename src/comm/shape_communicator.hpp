// ShapeCommunicator: a group of `size` ranks seen from one of them, with no other rank behind it.
// A dry run builds a run's cases over it to apply their shape rules (heads % cp, inner groups,
// token layouts) for a rank count it was not launched with: the group answers rank() and size(),
// splits into the consecutive and strided groups the process grid makes, and behaves as if every
// rank held what this one holds (a reduction by Max or a broadcast leaves the data as it is, an
// all-gather repeats it). Moving data between ranks is refused: building a case must not need it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace hcp {

class ShapeCommunicator final : public Communicator {
 public:
  ShapeCommunicator(int size, int rank);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "shape"; }

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
  void barrier() override {}
  // Only the grid's splits (split_blocks, split_strided) have a shape without the other ranks.
  std::unique_ptr<Communicator> split(int color, int key) const override;
  std::unique_ptr<Communicator> split_blocks(int block) const override;
  std::unique_ptr<Communicator> split_strided(int stride) const override;

  using Communicator::all_gather;
  using Communicator::all_reduce;
  using Communicator::all_to_all;
  using Communicator::broadcast;
  using Communicator::reduce_scatter;

 private:
  [[noreturn]] void moves(const char* op) const;
  int size_ = 1, rank_ = 0;
};

}  // namespace hcp
