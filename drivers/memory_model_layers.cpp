// The memory models of the cp_attention and cp_mamba drivers (memory_model.hpp), from the shared
// per-token terms of memory_model.cpp.
#include <algorithm>
#include <numeric>

#include "common.hpp"
#include "cp/strategy.hpp"
#include "layer_keys.hpp"
#include "memory_model.hpp"
#include "model/mamba2_strategy.hpp"

namespace hcp::drivers {

MemoryModel attention_memory(const Deck& d, int cp, const std::string& strategy) {
  MemoryModel m(sizes_where(
      d, {"data.seqlen", "data.batch", "data.seq_lens", "attention.heads", "attention.kv_heads", "attention.head_dim"},
      "data.seqlen/data.batch/data.seq_lens, attention.heads, attention.kv_heads, attention.head_dim"));
  const cp::AttnStrategy id = cp::attn_strategy_from_string(strategy);
  const std::int64_t H = d.get_int("attention.heads"), Hkv = d.get_int("attention.kv_heads"),
                     D = d.get_int("attention.head_dim");
  const std::int64_t es = dtype_bytes(d);
  // the strategy's terms at `ranks` ranks on `tl` local tokens
  auto shape = [&](int ranks, std::int64_t tl) {
    return cp::AttnMemShape{ranks, tl, H, Hkv, D, es, ranks > 1 ? std::gcd(cp_inner_of(d, cp), ranks) : 1};
  };
  std::int64_t tl = padded_tokens(d, cp, m) / cp, gathered = m.mul(tl, cp);
  std::int64_t work = cp::attention_work_bytes(m, id, shape(cp, tl));
  if (const auto docs = doc_partition(d, cp, attention_doc_cost(d.get_bool("attention.causal")))) {
    // the rank with the most: its saved output and LSE and the backward's dQ/dK/dV over all its
    // rows, and the split documents' own strategy on its chunks of them, block by block
    tl = docs->most_rows();
    work = 0;
    for (int r = 0; r < cp; ++r) {
      const std::int64_t n = docs->local_rows(r);
      std::int64_t own = m.sum(cp::attention_work_bytes(m, id, shape(1, n)), m.mul(m.mul(n, (H + 2 * Hkv) * D), es));
      for (const cp::SplitPart& p : docs->split_parts(r))
        if (p.layout.nseq() > 0) own = m.sum(own, cp::attention_work_bytes(m, id, shape(p.g, p.local_rows())));
      work = std::max(work, own);
    }
    gathered = m.mul(tl, cp);
  }
  // q, dout, o, dq and k, v, dk, dv of this rank's tokens
  m.add("inputs and outputs", {tl, 4 * (H + Hkv) * D}, es);
  m.add("step buffers", {work});
  if (host_bf16(d)) m.add("fp32 kernel operands (host bf16)", {cp::attention_kernel_elements(m, id, shape(cp, tl))}, 4);
  if (check_mode(d) == CheckMode::Reference) {
    const std::int64_t T = real_tokens(d, m);
    if (host_bf16(d))
      m.add("cp=1 reference step", {cp::attention_kernel_elements(m, id, shape(1, T))}, 4, Holder::Rank0Before);
    // the unpadded inputs (q, k, v, dout), the results, its saved output and LSE
    m.add("cp=1 reference step", {T, 4 * (H + Hkv) * D}, es, Holder::Rank0Before);
    m.add("cp=1 reference step", {cp::attention_work_bytes(m, id, shape(1, T))}, 1, Holder::Rank0Before);
    m.add("cp=1 reference results", {T, 2 * (H + Hkv) * D}, es, Holder::Rank0Kept);
    // one result gathered in global order and its real rows, on every rank
    m.add("gathered results (check)", {gathered + T, H * D}, es);
  }
  // run.check = cross: the first strategy's o, dq, dk, dv shards, kept while the others run
  if (check_mode(d) == CheckMode::Cross) m.add("first strategy's results (cross check)", {tl, 2 * (H + Hkv) * D}, es);
  return m.with_slack();
}

MemoryModel mamba_memory(const Deck& d, int cp, const std::string& strategy) {
  MemoryModel m(sizes_where(d,
                            {"data.seqlen", "data.batch", "data.seq_lens", "mamba.hidden", "mamba.heads",
                             "mamba.head_dim", "mamba.n_groups", "mamba.d_state"},
                            "data.seqlen/data.batch/data.seq_lens, mamba.hidden, mamba.heads, mamba.head_dim, "
                            "mamba.n_groups, mamba.d_state"));
  const model::Mamba2Config c = mamba_from_deck(d, d.get_int("mamba.hidden"));
  const model::MambaCpInfo& strat = model::mamba_cp_info(model::mamba_cp_from_string(strategy));
  const std::int64_t es = dtype_bytes(d), P = mamba_param_count(c);
  std::int64_t tl = padded_tokens(d, cp, m) / cp;
  const auto docs = doc_partition(d, cp, token_doc_cost());
  if (docs) {  // the rank with the most rows; the two parts' parameter gradients
    tl = docs->most_rows();
    m.add("gradients", {split_gradient_sets(*docs), P}, es);
  }
  m.add("inputs and outputs", {tl, 4 * c.hidden}, es);  // x, dy, y, dx
  m.add("parameters", {P}, es);
  m.add("gradients", {P}, es);
  if (docs) {  // the whole documents as a cp = 1 layer beside the split ones' strategy on each block
    std::int64_t most = 0, states = 0, row = 0;
    for (int r = 0; r < cp; ++r) {
      std::int64_t n = m.mul(docs->whole_rows(r), strat.work_per_token(c, 1)), st = 0;
      for (const cp::SplitPart& p : docs->split_parts(r)) {
        if (p.layout.nseq() == 0) continue;
        n = m.sum(n, m.mul(p.local_rows(), strat.work_per_token(c, p.g)));
        if (!strat.state_rows) continue;
        const model::StateRows sr = strat.state_rows(c, p.g, p.layout.nseq());
        st += sr.saved + sr.work;
        row = sr.row;
      }
      most = std::max(most, n);
      states = std::max(states, st);
    }
    m.add("step buffers", {most}, es);
    if (states > 0) m.add("state passing states", {states, row}, state_bytes(d));
  } else {
    m.add("step buffers", {tl, strat.work_per_token(c, cp)}, es);
    if (strat.state_rows) {
      const model::StateRows r = strat.state_rows(c, cp, sequences(d));
      m.add("state passing states", {r.saved + r.work, r.row}, state_bytes(d));
    }
  }
  if (check_mode(d) == CheckMode::Reference) {
    const std::int64_t T = real_tokens(d, m), Tp = padded_tokens(d, cp, m);
    m.add("cp=1 reference step", {T, 4 * c.hidden + model::mamba_local_work_per_token(c)}, es, Holder::Rank0Before);
    m.add("cp=1 reference step", {3, P}, es, Holder::Rank0Before);
    m.add("cp=1 reference results", {T, 2 * c.hidden}, es, Holder::Rank0Kept);
    m.add("cp=1 reference results", {P}, es, Holder::Rank0Kept);
    m.add("gathered results (check)", {docs ? m.mul(tl, cp) + T : Tp + T, c.hidden}, es);
  }
  if (check_mode(d) == CheckMode::Cross) {  // the first strategy's y, dh shards and gradients
    m.add("first strategy's results (cross check)", {tl, 2 * c.hidden}, es);
    m.add("first strategy's results (cross check)", {P}, es);
  }
  return m.with_slack();
}

}  // namespace hcp::drivers
