// The ops bench_kernels times: the anchor shapes (GPU only; benchmarks/PERFORMANCE.md) and the
// small suite (every kernel on small, documented shapes; host or GPU).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "kernels/kernels.hpp"

namespace hcp::drivers {

struct Op {
  std::string name, shape;
  double flops = 0, bytes = 0;  // per call, for the throughput column
  std::function<void()> fn;
};

// make(shape, seed, lo, hi): a tensor of uniform values in [lo, hi) where the ops run, kept alive by
// the caller; seed 0 with lo == hi == 0 gives zeros.
using Maker = std::function<std::shared_ptr<Tensor>(const Shape&, std::uint64_t, double, double)>;

// Inputs are made only for the ops whose name contains `only` (filling them all on the host takes minutes).
// `bwd_forms`: the attention backward's kernel forms to time, each as its own op (Auto as
// attention_bwd_<shape>, the others as attention_bwd_<shape>.<form>).
void anchor_ops(std::vector<Op>& ops, const Maker& make, DType dt, const std::string& only,
                const std::vector<kernels::AttnBwdKernel>& bwd_forms);
void small_ops(std::vector<Op>& ops, const Maker& make, DType dt, std::int64_t scale);
// State passing's per-run terms on the SSD op's shape and inputs (ssd_run_decay,
// ssd_init_state_fwd and its backward with dy and the decay's gradient), timed beside ssd_fwd and
// ssd_bwd. `grads` names dC, ddt, dA_log and ddt_bias (added into); the initial state, its gradient,
// dy and the decays are made here.
void state_passing_ops(std::vector<Op>& ops, const Maker& make, const kernels::SsdInputs& in,
                       const kernels::SsdParams& p, const kernels::SsdStateGrads& grads, const std::string& shape);
Tensor bench_tensor(const Shape& s, DType dt, std::uint64_t seed, double lo, double hi, Space sp);

}  // namespace hcp::drivers
