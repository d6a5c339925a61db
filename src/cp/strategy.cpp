#include "cp/strategy.hpp"

#include "core/error.hpp"
#include "core/memory_model.hpp"
#include "cp/attention_bodies.hpp"

namespace hcp::cp {

const std::vector<AttnStrategyInfo>& attn_strategies() {
  static const std::vector<AttnStrategyInfo> v = {p2p_strategy(), allgather_strategy(), a2a_strategy(),
                                                  a2a_p2p_strategy()};
  return v;
}

const AttnStrategyInfo& attn_strategy_info(AttnStrategy id) {
  for (const auto& s : attn_strategies())
    if (s.id == id) return s;
  HCP_FAIL("attention CP strategy ", static_cast<int>(id), " has no record");
}

std::vector<std::string> attn_strategy_names() {
  std::vector<std::string> n;
  for (const auto& s : attn_strategies()) n.emplace_back(s.name);
  return n;
}

std::vector<AttnStrategy> attn_strategy_ids() {
  std::vector<AttnStrategy> v;
  for (const auto& s : attn_strategies()) v.push_back(s.id);
  return v;
}

std::int64_t attention_work_bytes(const MemoryModel& m, AttnStrategy id, const AttnMemShape& s) {
  if (s.cp > 1) return attn_strategy_info(id).work_bytes(m, s);
  const std::int64_t lse = m.mul(s.tl, s.heads * acc_bytes(s.es));
  return m.sum(m.mul(m.mul(s.tl, s.heads * s.head_dim), s.es), lse);  // the saved output and LSE
}

std::int64_t attention_kernel_elements(const MemoryModel& m, AttnStrategy id, const AttnMemShape& s) {
  if (s.cp > 1) return attn_strategy_info(id).kernel_elements(m, s);
  return p2p_strategy().kernel_elements(m, s);  // the local kernels read the local K/V, as one p2p step does
}

std::string choice_list(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? (i + 1 == v.size() ? " or " : ", ") : "") + v[i];
  return s;
}

AttnStrategy attn_strategy_from_string(const std::string& s) {
  for (const auto& r : attn_strategies())
    if (s == r.name) return r.id;
  HCP_FAIL("unknown attention CP strategy '", s, "' (expected ", choice_list(attn_strategy_names()), ")");
}
std::string to_string(AttnStrategy s) {
  for (const auto& r : attn_strategies())
    if (s == r.id) return r.name;
  return "?";
}

}  // namespace hcp::cp
