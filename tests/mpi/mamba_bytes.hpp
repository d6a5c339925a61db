// Payload checks shared by the Mamba2 CP tests, on this rank: the CP exchange (hidden parallel:
// all-to-all; state passing: state all-gather and conv-halo all-to-all-v) against the strategy's
// model, and the parameter-gradient all-reduce against the gradients' sizes.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>

#include "comm/communicator.hpp"
#include "model/mamba2.hpp"

namespace hcp::test {

inline void expect_mamba_bytes(const Communicator& comm, cp::MambaCp strategy, const model::Mamba2Config& c,
                               const SeqLayout& g, cp::Partition part, DType dt, const model::ParamMap& grads) {
  const int cp = comm.size(), r = comm.rank();
  std::int64_t exchange = 0, allreduce = 0, want_allreduce = 0;
  for (const auto& [op, cnt] : comm.counters()) {
    if (op == "all_reduce") allreduce += cnt.bytes_sent;
    else if (op != "barrier") exchange += cnt.bytes_sent;
  }
  // The communicator counts an all-reduce as a ring's 2 (n-1)/n of the buffer per rank.
  for (const auto& [n, t] : grads)
    want_allreduce += cp > 1 ? 2 * t.numel() * (cp - 1) / cp * static_cast<std::int64_t>(dtype_size(t.dtype())) : 0;
  EXPECT_EQ(exchange, model::mamba_cp_model_bytes(strategy, c, g, cp, r, dt, part))
      << cp::to_string(strategy) << " exchange, rank " << r << " of " << cp;
  EXPECT_EQ(allreduce, want_allreduce) << cp::to_string(strategy) << " parameter all-reduce, rank " << r;
}

}  // namespace hcp::test
