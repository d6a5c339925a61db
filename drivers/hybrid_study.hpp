// cp_hybrid's study: the batch, the parameters and the cp=1 reference, set up once, then one step
// per attention strategy checked against it.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hybrid_common.hpp"
#include "study.hpp"

namespace hcp::drivers {

// One study of cp_hybrid: the batch, the parameters and the cp=1 reference (set up once), then one
// step per attention strategy.
class HybridStudy {
 public:
  explicit HybridStudy(Study& st) : st_(st) { st.norm_wise = st.dt == DType::BF16; }
  void setup(const std::vector<std::string>& names, const Skipped& skipped);
  bool run_case(const std::string& name, std::vector<std::string>& row);
  std::vector<std::pair<std::string, int>> columns() const {
    return {{"attention", 10}, {"loss", 16},
            {"step_ms", 10},   {"comm_MB/rank", 12},
            {"overlap", 8},    {st_.norm_wise ? "l2_rel_err" : "max_rel_err", 12},
            {"flips", 7},      {" phases (ms, median, slowest rank)", 0}};
  }

 private:
  void reference();  // the cp=1 step on rank 0, on the unpadded batch
  // /config, the reference's tensors, the inputs, the header, the placement and the parameters held.
  void records(const std::vector<std::string>& names, const Skipped& skipped);
  Study& st_;
  std::uint64_t seed_ = 0;
  model::HybridConfig c0_, c1_;  // the first case's model, and the cp=1 reference's (ep 1)
  PlacedBatch placed_;
  std::unique_ptr<ExpertGroups> groups_;
  model::ShardMap shards_;
  model::ParamMap p_;
  bool owner_ = false;                     // writes its experts' rows
  std::vector<std::int64_t> rtok_, rlab_;  // the real tokens' ids and labels, global order
  model::StepResult ref_;
  model::ParamMap rg_;
  std::vector<Tensor> ref_blocks_, ref_routing_;
  Tensor ref_dlogits_;
};

}  // namespace hcp::drivers
