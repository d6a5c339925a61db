// Payload checks shared by the CP tests, on this rank: the bytes handed to the communicator since its
// counters were reset, and for Mamba2 the CP exchange (hidden parallel: all-to-all; state passing:
// state all-gather and conv-halo all-to-all-v) against the strategy's model and the parameter-gradient
// all-reduce against the gradients' sizes.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>

#include "comm/communicator.hpp"
#include "model/mamba2.hpp"
#include "model/mamba2_strategy.hpp"

namespace hcp::test {

// Bytes this rank sent by every op but barrier (and all_reduce unless `with_allreduce`).
inline std::int64_t payload_sent(const Communicator& comm, bool with_allreduce = true) {
  std::int64_t sent = 0;
  for (const auto& [op, cnt] : comm.counters())
    if (op != "barrier" && (with_allreduce || op != "all_reduce")) sent += cnt.bytes_sent;
  return sent;
}

// After a forward alone (counters reset before it): the CP exchange against the forward's model.
inline void expect_mamba_fwd_bytes(const Communicator& comm, cp::MambaCp strategy, const model::Mamba2Config& c,
                                   const SeqLayout& g, cp::Partition part, DType dt) {
  const int cp = comm.size(), r = comm.rank();
  EXPECT_EQ(payload_sent(comm, false), model::mamba_cp_model_bytes(strategy, c, g, cp, r, dt, part, true))
      << model::to_string(strategy) << " forward exchange, rank " << r << " of " << cp;
}

inline void expect_mamba_bytes(const Communicator& comm, cp::MambaCp strategy, const model::Mamba2Config& c,
                               const SeqLayout& g, cp::Partition part, DType dt, const model::ParamMap& grads) {
  const int cp = comm.size(), r = comm.rank();
  const std::int64_t exchange = payload_sent(comm, false), allreduce = payload_sent(comm) - exchange;
  std::int64_t want_allreduce = 0;
  // The communicator counts an all-reduce as a ring's 2 (n-1)/n of the buffer per rank; bf16
  // gradients are summed in fp32 (model::reduce_grad).
  for (const auto& [n, t] : grads) {
    const auto es = static_cast<std::int64_t>(dtype_size(t.dtype() == DType::BF16 ? DType::F32 : t.dtype()));
    want_allreduce += cp > 1 ? 2 * t.numel() * (cp - 1) / cp * es : 0;
  }
  EXPECT_EQ(exchange, model::mamba_cp_model_bytes(strategy, c, g, cp, r, dt, part))
      << model::to_string(strategy) << " exchange, rank " << r << " of " << cp;
  EXPECT_EQ(allreduce, want_allreduce) << model::to_string(strategy) << " parameter all-reduce, rank " << r;
}

}  // namespace hcp::test
