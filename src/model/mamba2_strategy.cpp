#include "model/mamba2_strategy.hpp"

#include <algorithm>
#include <vector>

#include "core/error.hpp"
#include "core/registry.hpp"
#include "cp/state_passing.hpp"

namespace hcp::model {

const std::vector<MambaCpInfo>& mamba_cps() {
  static const std::vector<MambaCpInfo> v = {
      {MambaCp::HiddenParallel, "hidden_parallel", "all-to-all to heads/cp heads of every token and back",
       make_hidden_parallel, hidden_parallel_model_bytes, hidden_parallel_model_fwd_bytes,
       hidden_parallel_saved_per_token, hidden_parallel_work_per_token, hidden_parallel_fwd_per_token, nullptr,
       hidden_parallel_messages},
      {MambaCp::StatePassing, "state_passing", "local scans; conv halos and chunk states exchanged, outputs corrected",
       make_state_passing, state_passing_model_bytes, state_passing_model_fwd_bytes, state_passing_saved_per_token,
       state_passing_work_per_token, state_passing_fwd_per_token, state_passing_rows, state_passing_messages},
  };
  return v;
}

// Hidden parallel: the all-to-alls of x/B/C and dt in and y out, forward and backward, cp - 1
// messages each.
std::int64_t hidden_parallel_messages(int cp, cp::StateExchange) { return 4 * static_cast<std::int64_t>(cp - 1); }

// State passing: the state scan (all-gather: 3 (cp - 1); doubling: 4 (ceil(log2(2 cp)) + 1)
// exchanges of two messages over the forward and backward) plus the conv halos (4).
std::int64_t state_passing_messages(int cp, cp::StateExchange scan) {
  std::int64_t rounds = 0;
  while ((std::int64_t{1} << rounds) < 2 * static_cast<std::int64_t>(cp)) ++rounds;
  const std::int64_t scan_msgs =
      scan == cp::StateExchange::AllGather ? 3 * static_cast<std::int64_t>(cp - 1) : 2 * (2 * rounds + 2) * 2;
  return scan_msgs + 4;
}

const MambaCpInfo& mamba_cp_info(MambaCp id) { return record_by_id(mamba_cps(), id, "Mamba CP strategy"); }
std::vector<std::string> mamba_cp_names() { return record_names(mamba_cps()); }
std::vector<MambaCp> mamba_cp_ids() { return record_ids(mamba_cps()); }
MambaCp mamba_cp_from_string(const std::string& s) { return record_by_name(mamba_cps(), s, "Mamba CP strategy").id; }

// ---- memory terms (elements per local token; the tensors the layers allocate) ----------------------
// The step beyond input and output: zxbcdt's gradient, the pre- and post-conv x/B/C and their
// gradients (conv_dim), the SSD output, gate and norm terms (d_inner, the norm's output computed
// again in the backward) and dt/dA (heads).
std::int64_t mamba_local_work_per_token(const Mamba2Config& c) {
  return 10 * c.d_inner() + 10 * c.groups * c.d_state + 3 * c.heads + 64;
}

// Kept for the backward: z, the conv input and output (x, B, C), y and dt.
std::int64_t hidden_parallel_saved_per_token(const Mamba2Config& c) {
  return 2 * c.d_inner() + 2 * c.conv_dim() + c.heads + 8;
}

// At cp > 1 the all-to-all buffers (x, B, C, dt there and back; B/C repeated when n_groups < cp)
// beside the local terms (z alone is kept past the all-to-all).
std::int64_t hidden_parallel_work_per_token(const Mamba2Config& c, int cp) {
  if (cp == 1) return mamba_local_work_per_token(c);
  return 16 * c.d_inner() + (12 * c.group_repeat(cp) - 2) * c.groups * c.d_state + 3 * c.heads + 64;
}

// The forward, at the larger of its two high points: the gated norm (what it saves, the norm's
// output and at cp > 1 the heads' y beside its all-to-all copy), and the SSD (z, the x/B/C/dt copies
// and the conv outputs, the heads' y, and `scan`, the SSD kernel's own work per token).
std::int64_t hidden_parallel_fwd_per_token(const Mamba2Config& c, int cp, std::int64_t scan) {
  const std::int64_t norm = hidden_parallel_saved_per_token(c) + (cp > 1 ? 2 : 1) * c.d_inner();
  const std::int64_t xbc = c.d_inner() + 2 * c.groups * c.group_repeat(cp) * c.d_state;
  const std::int64_t ssd = 2 * c.d_inner() + 2 * xbc + c.heads + scan;
  return std::max(norm, ssd) + 64;
}

// Kept for the backward: zxbcdt (its halo and dt are read from it), the conv input and output, y,
// and the gate and norm terms (the norm's output, computed again in the backward, counted as kept).
std::int64_t state_passing_saved_per_token(const Mamba2Config& c) {
  return c.d_in_proj() + c.conv_dim() + 4 * c.d_inner() + 8;
}

// The forward, at the larger of its high points: the gated norm (what it saves and the norm's
// output), and the SSD (zxbcdt, the halo-extended conv input and output, the own rows' copy, y and
// `scan`).
std::int64_t state_passing_fwd_per_token(const Mamba2Config& c, int /*cp*/, std::int64_t scan) {
  const std::int64_t norm = state_passing_saved_per_token(c) + c.d_inner();
  const std::int64_t ssd = c.d_in_proj() + 3 * c.conv_dim() + c.d_inner() + scan;
  return std::max(norm, ssd) + 64;
}

// The local terms with zxbcdt itself, the halo-extended conv rows and the corrections' terms.
std::int64_t state_passing_work_per_token(const Mamba2Config& c, int /*cp*/) {
  return 16 * c.d_inner() + 20 * c.groups * c.d_state + 4 * c.heads + 64;
}

// Rows of H (P N + 1) values in the scan dtype, np = 2 pieces per sequence on every rank: per layer
// the saved incoming states, and for the all-gather exchange every rank's gathered final and
// incoming states (2 cp np); while a layer runs, its pieces' final states and their gradients, and
// the exchange's buffers (2 cp np more for the all-gather, a few rows per piece for the doubling scan).
StateRows state_passing_rows(const Mamba2Config& c, int cp, std::int64_t sequences) {
  // The exchange choice depends on how the pieces lie, not on their lengths: 2 cp tokens a sequence.
  std::vector<std::int64_t> cu{0};
  for (std::int64_t s = 0; s < sequences; ++s) cu.push_back(cu.back() + 2 * cp);
  const bool gather = cp::resolve_state_exchange(SeqLayout::thd(cu), cp, cp::Partition::DCS, c.state_exchange,
                                                 c.head_dim * c.d_state) == cp::StateExchange::AllGather;
  const std::int64_t np = 2 * sequences;
  return {gather ? (2 * cp + 1) * np : 2 * np, gather ? (2 * cp + 3) * np : 9 * np,
          c.heads * (c.head_dim * c.d_state + 1)};
}

std::string to_string(MambaCp m) { return mamba_cp_info(m).name; }

namespace {
cp::StateExchange part_scan(const Mamba2Config& c, const cp::CpPart& p) {
  return cp::resolve_state_exchange(p.placement.global, p.placement.cp, cp::Partition::DCS, c.state_exchange,
                                    c.head_dim * c.d_state);
}
}  // namespace

std::string state_scan_of(const Mamba2Config& c, const cp::Placement& placement) {
  std::vector<std::string> names;
  for (const cp::CpPart& p : placement.all_parts()) {
    if (p.empty()) continue;
    const std::string n = cp::to_string(part_scan(c, p));
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : "+") + n;
  return out.empty() ? "none" : out;
}

std::int64_t mamba_messages_of(const MambaCpInfo& s, const Mamba2Config& c, const cp::Placement& placement) {
  std::vector<std::int64_t> per_rank(static_cast<std::size_t>(placement.cp), 0);
  for (const cp::CpPart& p : placement.all_parts()) {
    const int g = p.placement.cp;
    if (p.empty() || g == 1) continue;
    const std::int64_t n = s.messages(g, part_scan(c, p));
    for (int r = p.block * g; r < (p.block + 1) * g; ++r) per_rank[static_cast<std::size_t>(r)] += n;
  }
  return *std::max_element(per_rank.begin(), per_rank.end());
}

}  // namespace hcp::model
