// Communicator: the collective and point-to-point operations the CP strategies use, on raw
// buffers or tensors, with per-op byte and time counters. Backends: MPI (host memory, and
// host-staged device memory later), NCCL (kernels/cuda, behind the same interface).
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace hcp {

enum class ReduceOp { Sum, Max };

// What one kind of operation cost on this rank.
struct CommCounter {
  std::int64_t calls = 0;
  std::int64_t bytes_sent = 0;  // bytes this rank sent (to other ranks)
  double seconds = 0;           // wall time inside the call (for ring steps: time spent waiting)
};

// An in-flight ring exchange step (send to one peer, receive from another).
struct RingRequest {
  std::vector<std::int64_t> handles;  // backend-specific request ids
  double posted_at = 0;
  bool active = false;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // ---- raw-buffer interface (counts in elements of `dt`) ------------------------------------
  // Equal splits: block k (count elements) of `send` goes to rank k; `recv` gets block k from rank k.
  virtual void all_to_all(const void* send, void* recv, std::int64_t count, DType dt) = 0;
  // Variable splits, counts and displacements implied by consecutive blocks.
  virtual void all_to_all_v(const void* send, const std::vector<std::int64_t>& send_counts, void* recv,
                            const std::vector<std::int64_t>& recv_counts, DType dt) = 0;
  // recv = concat over ranks of every rank's `count` elements.
  virtual void all_gather(const void* send, void* recv, std::int64_t count, DType dt) = 0;
  // recv (count) = reduction over ranks of block `rank` of every rank's send (size*count).
  virtual void reduce_scatter(const void* send, void* recv, std::int64_t count, DType dt, ReduceOp op) = 0;
  virtual void all_reduce(void* buf, std::int64_t count, DType dt, ReduceOp op) = 0;  // in place
  virtual void broadcast(void* buf, std::int64_t count, DType dt, int root) = 0;
  virtual void send(const void* buf, std::int64_t count, DType dt, int dst, int tag) = 0;
  virtual void recv(void* buf, std::int64_t count, DType dt, int src, int tag) = 0;
  // Non-blocking exchange: send `send` to dst and receive `recv` from src. Post, compute, wait.
  virtual RingRequest ring_post(const void* send, void* recv, std::int64_t count, DType dt, int dst, int src,
                                int tag = 7) = 0;
  virtual void ring_wait(RingRequest& req) = 0;
  virtual void barrier() = 0;
  // A sub-communicator of the ranks with the same colour, ordered by key.
  virtual std::unique_ptr<Communicator> split(int color, int key) const = 0;
  // The groups the process grid makes: consecutive ranks, `block` to a group (block 1: this rank
  // alone; block size(): every rank), and the ranks `stride` apart (those with the same rank %
  // stride), each in rank order. Collective, like split.
  virtual std::unique_ptr<Communicator> split_blocks(int block) const { return split(rank() / block, rank()); }
  virtual std::unique_ptr<Communicator> split_strided(int stride) const { return split(rank() % stride, rank()); }
  // The group of `block` consecutive ranks this rank is in (split_blocks), made at the first call for
  // that size (collective then: every rank asks for the same sizes in the same order) and kept, so
  // layers that run over sub-groups share one communicator per size. Its operations count into this
  // communicator's counters as well. block == size(): this communicator.
  Communicator& block_of(int block);
  // The same for split_strided: the ranks `stride` apart, made once per stride (stride 1: this one).
  Communicator& strided_of(int stride);

  // ---- tensor conveniences (contiguous host tensors; shapes checked) --------------------------
  void all_to_all(const Tensor& send, Tensor& recv);
  void all_gather(const Tensor& send, Tensor& recv);
  void reduce_scatter(const Tensor& send, Tensor& recv, ReduceOp op = ReduceOp::Sum);
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
  void broadcast(Tensor& t, int root);
  double all_reduce_scalar(double v, ReduceOp op = ReduceOp::Sum);
  std::vector<double> gather_to_root(double v);  // every rank's value on rank 0 (all ranks call)

  // ---- counters ------------------------------------------------------------------------------
  const std::map<std::string, CommCounter>& counters() const { return counters_; }
  // Bytes sent since the last reset by the operations named in `ops` (empty: every operation).
  std::int64_t bytes_sent(const std::vector<std::string>& ops = {}) const {
    std::int64_t b = 0;
    for (const auto& [op, k] : counters_)
      if (ops.empty() || std::find(ops.begin(), ops.end(), op) != ops.end()) b += k.bytes_sent;
    return b;
  }
  void reset_counters() { counters_.clear(); }
  // Counts this communicator's operations into `parent` as well: a strategy that works over
  // sub-groups of its CP group (a2a+p2p) keeps the group's counters whole. `parent` outlives this.
  void count_into(Communicator* parent) { parent_ = parent; }

 protected:
  void record(const std::string& op, std::int64_t bytes, double seconds) {
    auto& c = counters_[op];
    c.calls += 1;
    c.bytes_sent += bytes;
    c.seconds += seconds;
    if (parent_) parent_->record(op, bytes, seconds);
  }
  std::map<std::string, CommCounter> counters_;
  Communicator* parent_ = nullptr;
  std::map<int, std::unique_ptr<Communicator>> blocks_, strided_;  // block_of's and strided_of's groups
};

}  // namespace hcp
