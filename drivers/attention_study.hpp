// cp_attention's study: one attention problem and its cp=1 reference on the host oracle, set up
// once, then each CP strategy checked against it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cp/attention_cp.hpp"
#include "study.hpp"

namespace hcp::drivers {

// The layer of parallel.attention = `strategy` at `cp` ranks, from the deck's sizes and placement.
cp::CpAttnConfig attention_config(const Deck& d, int cp, const std::string& strategy);

// One study of cp_attention: the problem and its cp=1 reference (set up once), then each strategy.
class AttentionStudy {
 public:
  explicit AttentionStudy(Study& st) : st_(st) {}
  void setup(const std::vector<std::string>& names, const Skipped& skipped);
  bool run_case(const std::string& name, std::vector<std::string>& row);

 private:
  // Rows of q (i = 0), k (1), v (2) or dout (3) of this rank, in the run's space.
  Tensor local(const std::vector<std::int64_t>& rows, int i) const {
    return rows_uniform(rows, i == 1 || i == 2 ? ks_ : qs_, st_.dt, seeds_[i]).to(st_.space);
  }
  Study& st_;
  cp::CpAttnConfig base_;
  Shape qs_, ks_;
  std::uint64_t seeds_[4] = {};  // q, k, v, dout
  Tensor ref_[4];                // the cp=1 reference's out, dq, dk, dv (rank 0, run.check = reference)
};

}  // namespace hcp::drivers
