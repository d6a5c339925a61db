#include "model/mamba2_strategy.hpp"

#include "core/error.hpp"

namespace hcp::model {

const std::vector<MambaCpInfo>& mamba_cps() {
  static const std::vector<MambaCpInfo> v = {
      {MambaCp::HiddenParallel, "hidden_parallel", "all-to-all to heads/cp heads of every token and back",
       make_hidden_parallel, hidden_parallel_model_bytes},
      {MambaCp::StatePassing, "state_passing", "local scans; conv halos and chunk states exchanged, outputs corrected",
       make_state_passing, state_passing_model_bytes},
  };
  return v;
}

const MambaCpInfo& mamba_cp_info(MambaCp id) {
  for (const auto& s : mamba_cps())
    if (s.id == id) return s;
  HCP_FAIL("Mamba CP strategy ", static_cast<int>(id), " has no record");
}

std::vector<std::string> mamba_cp_names() {
  std::vector<std::string> n;
  for (const auto& s : mamba_cps()) n.emplace_back(s.name);
  return n;
}

std::vector<MambaCp> mamba_cp_ids() {
  std::vector<MambaCp> v;
  for (const auto& s : mamba_cps()) v.push_back(s.id);
  return v;
}

MambaCp mamba_cp_from_string(const std::string& s) {
  for (const auto& r : mamba_cps())
    if (s == r.name) return r.id;
  throw Error("mamba_cp '" + s + "' is not one of " + cp::choice_list(mamba_cp_names()));
}

std::string to_string(MambaCp m) {
  for (const auto& r : mamba_cps())
    if (m == r.id) return r.name;
  return "?";
}

}  // namespace hcp::model
