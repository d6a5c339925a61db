// MoE expert parallelism over an EP group (which may be the CP group): rank q owns experts
// [q E/ep, (q+1) E/ep). Token copies, already permuted by expert (kernels::moe_permute), go to the
// ranks owning their experts by a variable all-to-all whose counts are exchanged first; the owner
// regroups them expert-major (all sources' rows of one expert together, one row copy by a map built
// with the counts) for one grouped-MLP call. combine() is the exact reverse. Backward: the gradient
// of dispatch is combine and vice versa. With one EP rank both return their input: nothing moves.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "core/tensor.hpp"

namespace hcp::cp {

// The experts EP rank `rank` of `ep` holds: [first, first + count). Throws unless experts % ep == 0.
struct ExpertRange {
  std::int64_t first = 0, count = 0;
};
ExpertRange ep_experts(std::int64_t experts, int ep, int rank);

// Bytes a rank sends per step (dispatch and combine, forward and backward) when its `tokens` local
// tokens route uniformly, each to `topk` experts: the (ep-1)/ep of its token copies that leave it,
// four times. An expectation for planning: a run's traffic follows where its tokens route.
std::int64_t moe_ep_uniform_bytes(std::int64_t tokens, std::int64_t topk, std::int64_t hidden, int ep, DType dt);

class EpDispatcher {
 public:
  // `counts` [E]: this rank's token copies per (global) expert, as moe_permute returns them.
  // Collective (exchanges the counts). Throws unless experts % ep == 0.
  EpDispatcher(Communicator& ep_comm, std::int64_t experts, const std::vector<std::int64_t>& counts);
  std::int64_t local_experts() const { return el_; }
  std::int64_t first_expert() const { return e0_; }
  // Rows per local expert after dispatch (all sources together).
  const std::vector<std::int64_t>& local_counts() const { return local_counts_; }
  std::int64_t local_rows() const { return local_rows_; }
  // xp [T*k, C] permuted by expert -> [local_rows, C] expert-major for this rank's experts.
  Tensor dispatch(const Tensor& xp) const;
  // [local_rows, C] expert-major -> [T*k, C] back in this rank's permuted order.
  Tensor combine(const Tensor& yl) const;

 private:
  // Row where source s's rows for local expert e start in the received (source-major) buffer.
  std::int64_t source_major_offset(int s, std::int64_t e) const;
  std::int64_t rows_from(int s) const;  // rows received from source s
  Communicator& comm_;
  int ep_ = 1, rank_ = 0;
  std::int64_t E_ = 1, el_ = 1, e0_ = 0, rows_ = 0, local_rows_ = 0;
  std::vector<std::int64_t> send_rows_;    // per destination rank
  std::vector<std::int64_t> recv_counts_;  // [ep * el]: rows from source s for local expert e
  std::vector<std::int64_t> recv_off_;     // [ep * el + 1] prefix sums of recv_counts_
  std::vector<std::int64_t> local_counts_;
  std::vector<std::int64_t> regroup_, ordered_;  // expert-major row ordered_[i] = source-major row regroup_[i]
};

}  // namespace hcp::cp
