// cp_generate's study: the prompts, the parameters and the cp = 1 generation, set up once, then one
// CP generation per attention strategy checked against it.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "generate.hpp"
#include "study.hpp"

namespace hcp::drivers {

// One study of cp_generate: the prompts, the parameters and the cp = 1 generation (set up once),
// then one generation per attention strategy.
class GenerateStudy {
 public:
  explicit GenerateStudy(Study& st) : st_(st) { st.norm_wise = st.dt == DType::BF16; }
  void setup(const std::vector<std::string>& names, const Skipped& skipped);
  bool run_case(const std::string& name, std::vector<std::string>& row);
  std::vector<std::pair<std::string, int>> columns() const {
    return {{"attention", 10},
            {"prefill_ms", 11},
            {"handoff_ms", 11},
            {"decode_ms/tok", 14},
            {"prefill_MB/rank", 16},
            {"decode_KB/tok", 14},
            {"handoff_MB/rank", 16},
            {"ids", 9},
            {st_.norm_wise ? "l2_rel_err" : "max_rel_err", 12}};
  }

 private:
  Study& st_;
  std::uint64_t seed_ = 0;
  GenerateConfig g_;
  model::HybridConfig c0_, c1_;
  PlacedBatch placed_;
  std::unique_ptr<ExpertGroups> groups_;
  model::ParamMap p_, p1_;
  std::vector<std::vector<std::int64_t>> prompts_;  // real tokens of each sequence
  Generated ref_;                                   // cp = 1 on rank 0
};

}  // namespace hcp::drivers
