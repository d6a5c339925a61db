#include "byte_model.hpp"
#include "model/mamba2_strategy.hpp"

#include <iomanip>
#include <sstream>

#include "common.hpp"
#include "core/error.hpp"
#include "cp/attention_cp.hpp"
#include "cp/hidden_parallel.hpp"
#include "cp/moe_ep.hpp"
#include "cp/state_passing.hpp"
#include "cp/strategy.hpp"

namespace hcp::drivers {
namespace {
void per_rank_json(std::ostringstream& os, const std::map<std::string, std::vector<std::int64_t>>& m) {
  os << '{';
  bool first = true;
  for (const auto& [name, per_rank] : m) {
    os << (first ? "" : ",") << '"' << name << "\":[";
    first = false;
    for (std::size_t r = 0; r < per_rank.size(); ++r) os << (r ? "," : "") << per_rank[r];
    os << ']';
  }
  os << '}';
}
}  // namespace

void add_attention_bytes(LayerBytes& b, const cp::CpAttnConfig& c, DType dt, bool backward) {
  const int cp = c.placement.cp;
  for (const cp::AttnStrategyInfo& s : cp::attn_strategies()) {
    cp::CpAttnConfig a = c;
    a.strategy = s.id;
    try {
      cp::check_attention_cp_shape(a, cp);
    } catch (const Error&) {
      continue;  // this strategy cannot run the shape
    }
    std::vector<std::int64_t>& v = b.kinds["*"][s.name];
    for (int r = 0; r < cp; ++r)
      v.push_back(cp::attention_cp_model_bytes(a, cp, r, dt, false) +
                  (backward ? cp::attention_cp_model_bytes(a, cp, r, dt, true) : 0));
    const int inner = s.two_level ? c.cp_inner : cp, ring = cp > 1 ? s.ring_ranks(cp, inner) : 1;
    b.messages[s.name] = {cp > 1 ? s.exchange_messages(cp, inner) : 0, cp::p2p_ring_messages(ring), inner, ring,
                          s.two_level};
    if (s.two_level && cp > 1)
      for (int r = 0; r < cp; ++r)
        b.ring[s.name].push_back(cp::a2a_p2p_ring_bytes(a, cp, r, dt, false) +
                                 (backward ? cp::a2a_p2p_ring_bytes(a, cp, r, dt, true) : 0));
  }
}

void add_mamba_bytes(LayerBytes& b, const model::Mamba2Config& c, const cp::Placement& placement, DType dt,
                     bool backward) {
  const int cp = placement.cp;
  for (const model::MambaCpInfo& s : model::mamba_cps()) {
    if (s.id == cp::MambaCp::HiddenParallel && cp > 1) {
      try {
        cp::HpShare::of(c.heads, c.groups, cp, 0);
      } catch (const Error&) {
        continue;
      }
    }
    std::vector<std::int64_t>& v = b.kinds["M"][s.name];
    for (int r = 0; r < cp; ++r) v.push_back(model::mamba_cp_model_bytes(s.id, c, placement, r, dt, !backward));
    b.mamba_messages[s.name] = model::mamba_messages_of(s, c, placement);
  }
  b.state_scan = model::state_scan_of(c, placement);
}

void add_moe_bytes(LayerBytes& b, const model::MoeConfig& e, std::int64_t hidden, std::int64_t tokens_per_rank, int cp,
                   int ep, DType dt) {
  b.kinds["E"]["ep"] = std::vector<std::int64_t>(static_cast<std::size_t>(cp),
                                                 cp::moe_ep_uniform_bytes(tokens_per_rank, e.topk, hidden, ep, dt));
}

void add_placement(LayerBytes& b, const Deck& d, int cp, const cp::DocCost& cost) {
  const auto p = thd_placement(d, cp, cost);
  if (!p) return;
  LayerBytes::Placement out{d.get_string("data.partition"), p->pad_tokens(), {}, {}, p->work, p->group, p->block};
  for (int r = 0; r < cp; ++r) {
    out.rows.push_back(p->local_rows(r));
    out.tokens.push_back(p->real_tokens(r));
  }
  b.placement.push_back(std::move(out));
}

std::string bytes_json(const std::string& driver, int cp, const LayerBytes& b) {
  std::ostringstream os;
  os << "{\"driver\":\"" << driver << "\",\"cp\":" << cp << ",\"state_scan\":\"" << b.state_scan << "\",\"layers\":{";
  bool first = true;
  for (const auto& [kind, strategies] : b.kinds) {
    os << (first ? "" : ",") << '"' << kind << "\":";
    first = false;
    per_rank_json(os, strategies);
  }
  os << "},\"ring\":";
  per_rank_json(os, b.ring);
  os << ",\"messages\":{";
  first = true;
  for (const auto& [name, m] : b.messages) {
    os << (first ? "" : ",") << '"' << name << "\":{\"exchange\":" << m.exchange << ",\"group\":" << m.group
       << ",\"ring\":" << m.ring << ",\"ring_ranks\":" << m.ring_ranks
       << ",\"two_level\":" << (m.two_level ? "true" : "false") << '}';
    first = false;
  }
  os << "},\"mamba_messages\":{";
  first = true;
  for (const auto& [name, n] : b.mamba_messages) {
    os << (first ? "" : ",") << '"' << name << "\":" << n;
    first = false;
  }
  os << '}';
  for (const LayerBytes::Placement& p : b.placement) {
    const auto list = [&](const char* key, const auto& v) {
      os << ",\"" << key << "\":[";
      for (std::size_t r = 0; r < v.size(); ++r) os << (r ? "," : "") << v[r];
      os << ']';
    };
    os << ",\"placement\":{\"partition\":\"" << p.partition << "\",\"pad_tokens\":" << p.pad_tokens;
    list("rows", p.rows);
    list("tokens", p.tokens);
    os << std::setprecision(17);  // the planner compares the work with the run's
    list("work", p.work);
    list("group", p.group);
    list("block", p.block);
    os << '}';
  }
  os << '}';
  return os.str();
}

}  // namespace hcp::drivers
