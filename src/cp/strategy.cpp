#include "cp/strategy.hpp"

#include "core/error.hpp"
#include "core/memory_parts.hpp"
#include "core/registry.hpp"
#include "cp/attention_bodies.hpp"

namespace hcp::cp {

const std::vector<AttnStrategyInfo>& attn_strategies() {
  static const std::vector<AttnStrategyInfo> v = {
#define HCP_ATTN_STRATEGY(name, id) name##_strategy(),
#include "cp/attn_registry.inc"
#undef HCP_ATTN_STRATEGY
  };
  return v;
}

const AttnStrategyInfo& attn_strategy_info(AttnStrategy id) {
  return record_by_id(attn_strategies(), id, "attention CP strategy");
}
std::vector<std::string> attn_strategy_names() { return record_names(attn_strategies()); }
std::vector<AttnStrategy> attn_strategy_ids() { return record_ids(attn_strategies()); }

std::int64_t attention_work_bytes(const MemoryModel& m, AttnStrategy id, const AttnMemShape& s) {
  if (s.cp > 1) return attn_strategy_info(id).work_bytes(m, s);
  const std::int64_t lse = m.mul(s.tl, s.heads * acc_bytes(s.es));
  return m.sum(m.mul(m.mul(s.tl, s.heads * s.head_dim), s.es), lse);  // the saved output and LSE
}

std::int64_t attention_kernel_elements(const MemoryModel& m, AttnStrategy id, const AttnMemShape& s) {
  if (s.cp > 1) return attn_strategy_info(id).kernel_elements(m, s);
  return p2p_strategy().kernel_elements(m, s);  // the local kernels read the local K/V, as one p2p step does
}

AttnStrategy attn_strategy_from_string(const std::string& s) {
  return record_by_name(attn_strategies(), s, "attention CP strategy").id;
}
std::string to_string(AttnStrategy s) { return attn_strategy_info(s).name; }

}  // namespace hcp::cp
