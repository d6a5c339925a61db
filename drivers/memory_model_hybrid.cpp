// The hybrid step's memory model (cp_hybrid, train_hybrid): each block kind's saved tensors and
// step work per token, the peak placed at the backward of the layer where it falls, the state
// passing states, the host bf16 kernels' fp32 operand copies, the cp=1 reference on rank 0.
#include <algorithm>

#include "common.hpp"
#include "cp/strategy.hpp"
#include "hybrid_common.hpp"
#include "memory_model.hpp"
#include "model/mamba2_strategy.hpp"

namespace hcp::drivers {

namespace {
// The attention layer's saved tensors per token: q, k, v (after the projections), the output
// before and after Wo, the LSE.
std::int64_t attention_saved_per_token(const model::AttnLayerConfig& a) {
  return 3 * a.heads * a.head_dim + 2 * a.kv_heads * a.head_dim + a.heads;
}

// The hybrid stack's state-passing states: each Mamba2 layer's saved rows, one layer's work rows.
// Per document (`docs`), the states of the split documents' blocks a rank joins (the whole ones run
// at cp = 1), the heaviest rank's; else of every sequence over the group.
void add_state_passing(MemoryModel& m, const Deck& d, const model::HybridConfig& h, int cp, std::int64_t seqs,
                       const cp::DocPartition* docs) {
  const model::MambaCpInfo& strat = model::mamba_cp_info(h.mamba_cp);
  const auto layers = static_cast<std::int64_t>(std::count(h.pattern.begin(), h.pattern.end(), 'M'));
  if (!strat.state_rows || layers == 0) return;
  if (!docs) {
    const model::StateRows r = strat.state_rows(h.mamba, cp, seqs);
    m.add("state passing states", {m.sum(m.mul(layers, r.saved), r.work), r.row}, state_bytes(d));
    return;
  }
  std::int64_t most = 0, row = 0;
  for (int q = 0; q < cp; ++q) {
    std::int64_t n = 0;
    for (const cp::SplitPart& p : docs->split_parts(q)) {
      if (p.layout.nseq() == 0) continue;
      const model::StateRows r = strat.state_rows(h.mamba, p.g, p.layout.nseq());
      n = m.sum(n, m.sum(m.mul(layers, r.saved), r.work));
      row = r.row;
    }
    most = std::max(most, n);
  }
  if (most > 0) m.add("state passing states", {most, row}, state_bytes(d));
}

// The largest kernel call of a hybrid step, in elements of its operands (inputs and outputs), which
// host kernels widen into fp32 copies on bf16 ranks: the grouped expert MLP's backward (the routed
// experts' weights and their gradients, the rows), a Mamba2 layer's in_proj backward and its SSD
// backward, the LM head's backward, the attention kernels of each layer's strategy; `forward_only`:
// the forward's calls of the same (a prefill).
std::int64_t hybrid_kernel_elements(const MemoryModel& m, const model::HybridConfig& h, int cp, int ep, std::int64_t tl,
                                    bool forward_only = false) {
  const std::int64_t C = h.hidden;
  const auto& mc = h.mamba;
  const auto& e = h.moe;
  // the routed experts' weights of one MoE layer on this rank
  const auto moe_layers = static_cast<std::int64_t>(std::count(h.pattern.begin(), h.pattern.end(), 'E'));
  const std::int64_t experts = moe_layers > 0 ? model::param_count(h, ep).experts / moe_layers : 0;
  // the forward's calls: the weight once (no gradient) and the rows in and out
  const std::int64_t w = forward_only ? 1 : 2, rows = forward_only ? 1 : 2;
  std::int64_t big = m.sum(m.mul(w * h.vocab, C), m.mul(tl, h.vocab + rows * C));  // lm_head
  std::size_t n_attn = 0;
  for (char k : h.pattern) {
    if (k == 'M') {
      big = std::max(big, m.sum(m.mul(w * mc.d_in_proj(), C), m.mul(tl, mc.d_in_proj() + rows * C)));
      big = std::max(big, m.mul(tl, 2 * w * (mc.d_inner() + mc.groups * mc.d_state * mc.group_repeat(cp) + mc.heads)));
    } else if (k == '*') {
      const auto& a = h.attn;
      const cp::AttnMemShape s{cp, tl, a.heads, a.kv_heads, a.head_dim, 0, a.cp_inner};
      big = std::max(big, cp::attention_kernel_elements(m, h.attention_layer(n_attn++).strategy, s));
    } else if (k == 'E') {
      // the backward: weights and their gradients, x, h, dy, dx rows; the forward: weights, x, h, y
      big = std::max(big, m.sum(m.mul(forward_only ? 1 : 2, experts),
                                m.mul(m.mul(tl, e.topk),
                                      (forward_only ? 2 : 3) * C + kernels::first_projection_rows(e.act, e.ffn))));
    }
  }
  return big;
}

}  // namespace

// Per local token (elements): what each block kind keeps for its backward (the block's input and
// output, its norm's rstd, the mixer's saved tensors), and what its step adds while it runs.
void add_hybrid_step(MemoryModel& m, const model::HybridConfig& h, int cp, int ep, std::int64_t tl, std::int64_t es,
                     Holder holder) {
  const std::int64_t C = h.hidden, block = 2 * C + 1;
  const auto& mc = h.mamba;
  const auto& a = h.attn;
  const auto& e = h.moe;
  // Mamba2: what its strategy's mixer keeps (model::MambaCpInfo).
  const model::MambaCpInfo& mstrat = model::mamba_cp_info(h.mamba_cp);
  const std::int64_t m_saved = mstrat.saved_per_token(mc);
  const std::int64_t a_saved = attention_saved_per_token(a);
  // MoE: per chosen expert the token copy and the expert's hidden activations, the shared expert,
  // router scores and probabilities, the chosen indices and weights.
  const std::int64_t e_saved = e.topk * (C + 3 * e.ffn) + 2 * e.shared_ffn + 2 * e.experts + 4 * e.topk;
  const std::int64_t f_saved = 2 * h.mlp.ffn;
  // The backward of a layer holds the mixers' saved tensors of the layers up to it (the later ones
  // are spent) beside its own work; the blocks' inputs and outputs stay (the step keeps every block's
  // output). The peak is the largest of these over the layers.
  std::int64_t blocks = 0, upto = 0, peak = -1, saved = 0, work = 0, work_bytes = 0;
  std::size_t n_attn = 0;  // each attention layer's buffers by its own strategy
  for (char k : h.pattern) {
    blocks += block;
    std::int64_t s = 0, w = 0, wb = 0;
    if (k == 'M') {
      s = m_saved;
      w = mstrat.work_per_token(mc, cp) - m_saved + 2 * C;
    } else if (k == '*') {
      s = a_saved;
      // AttentionLayer::backward: the gradient into the attention core (dout) and dq, dk, dv beside
      // the CP attention's own buffers, then the input gradient's sum and part, and the block's
      // dy and dx
      w = 2 * (a.heads + a.kv_heads) * a.head_dim + 4 * C;
      const cp::AttnMemShape as{cp, tl, a.heads, a.kv_heads, a.head_dim, es, a.cp_inner};
      wb = cp::attention_work_bytes(m, h.attention_layer(n_attn++).strategy, as);
    } else if (k == 'E') {
      s = e_saved;
      // the expert inputs' gradients; with ep > 1 the dispatched copies and their receive buffers
      w = e.topk * (C + e.ffn) + (ep > 1 ? e.topk * C : 0) + 2 * C;
    } else if (k == '-') {
      s = f_saved;
      w = h.mlp.ffn + 2 * C;
    }
    upto += s;
    const std::int64_t at = m.sum(m.mul(m.mul(upto + w, tl), es), wb);
    if (at > peak) {
      peak = at;
      saved = upto;
      work = w;
      work_bytes = wb;
    }
  }
  saved += blocks;
  const std::string act = holder == Holder::EveryRank ? "activations" : "cp=1 reference step";
  const std::string buf = holder == Holder::EveryRank ? "step buffers" : "cp=1 reference step";
  // embedding output, final norm, logits and their gradient (fp32 for bf16)
  m.add(act, {tl, 2 * C + saved}, es, holder);
  m.add(act, {tl, 2 * h.vocab}, acc_bytes(es), holder);
  m.add(buf, {tl, work}, es, holder);
  m.add(buf, {work_bytes}, 1, holder);
}

// A forward that keeps nothing for a backward (HybridModel::forward, a prefill): the embedding
// output, the logits, and the largest block while it runs -- its input, norm, mixer output and sum
// (4 C per token) and what its mixer allocates, the saved tensors included (dropped once the block
// has run); state passing: one layer's state rows.
void add_hybrid_forward(MemoryModel& m, const Deck& d, const model::HybridConfig& h, int cp, int ep, std::int64_t tl,
                        std::int64_t es, Holder holder) {
  const std::int64_t C = h.hidden;
  const auto& mc = h.mamba;
  const auto& a = h.attn;
  const auto& e = h.moe;
  const model::MambaCpInfo& mstrat = model::mamba_cp_info(h.mamba_cp);
  // The SSD kernel's work per token in the accumulation type (two elements of a bf16 layer's): the
  // chunk states and decays; the CUDA kernels also hold every chunk's C.B^T products and a bf16
  // copy of the states at once.
  const std::int64_t chunk = std::max<std::int64_t>(mc.chunk, 1), states = mc.heads * mc.head_dim * mc.d_state / chunk;
  const std::int64_t scan = d.get_string("run.device") == "host"
                                ? 2 * (states + 2 * mc.heads)
                                : 2 * (states + mc.groups * chunk + 2 * mc.heads) + states;
  std::int64_t peak = 0;
  std::size_t n_attn = 0;
  for (char k : h.pattern) {
    std::int64_t per = 4 * C, wb = 0;
    if (k == 'M') {
      per += mstrat.fwd_per_token(mc, cp, scan);
    } else if (k == '*') {
      per += attention_saved_per_token(a) + 2 * (a.heads + a.kv_heads) * a.head_dim;
      const cp::AttnMemShape as{cp, tl, a.heads, a.kv_heads, a.head_dim, es, a.cp_inner};
      wb = cp::attention_work_bytes(m, h.attention_layer(n_attn++).strategy, as);
    } else if (k == 'E') {
      // router logits and scores (fp32 for bf16), the top-k weights, the permuted copies and the
      // expert rows (x, h, y; with ep > 1 the received rows apart, as many again for the experts'
      // imbalance between ranks), the combined output, the shared expert's hidden rows and output
      const std::int64_t F1 = kernels::first_projection_rows(e.act, e.ffn);
      const std::int64_t row_sets = ep > 1 ? 2 : 1;
      per += 4 * e.experts + 4 * e.topk + row_sets * e.topk * (2 * C + F1) + 2 * e.shared_ffn + 2 * C;
    } else if (k == '-') {
      per += 3 * h.mlp.ffn;
    }
    peak = std::max(peak, m.sum(m.mul(m.mul(tl, per), es), wb));
  }
  const std::string act = holder == Holder::EveryRank ? "prefill activations" : "cp=1 reference prefill";
  m.add(act, {tl, 2 * C}, es, holder);  // the embedding output and the final norm's
  m.add(act, {tl, h.vocab}, acc_bytes(es), holder);
  m.add(act, {peak}, 1, holder);
  if (mstrat.state_rows && h.pattern.find('M') != std::string::npos) {
    const model::StateRows r = mstrat.state_rows(mc, cp, sequences(d));
    m.add(holder == Holder::EveryRank ? "state passing states" : act, {m.sum(r.saved, r.work), r.row}, state_bytes(d),
          holder);
  }
  if (host_bf16(d))
    m.add("fp32 kernel operands (host bf16)", {hybrid_kernel_elements(m, h, cp, ep, tl, true)}, 4, holder);
}

MemoryModel hybrid_memory(const Deck& d, const model::HybridConfig& h, int cp, int ep) {
  MemoryModel m(hybrid_sizes_where(d, ""));
  const std::int64_t es = dtype_bytes(d);
  std::int64_t tl = padded_tokens(d, cp, m) / cp, gathered = m.mul(tl, cp);
  const std::int64_t P = model::param_count(h, ep).total, P1 = model::param_count(h, 1).total;
  const auto docs = doc_partition(d, cp, model::hybrid_doc_cost(h));
  if (docs) {  // the rank with the most rows
    tl = docs->most_rows();
    gathered = m.mul(tl, cp);
    if (h.pattern.find('M') != std::string::npos) m.add("gradients", {split_gradient_sets(*docs), P}, es);
  }
  m.add("parameters", {P}, es);
  m.add("gradients", {P}, es);
  add_hybrid_step(m, h, cp, ep, tl, es, Holder::EveryRank);
  add_state_passing(m, d, h, cp, sequences(d), docs.get());
  if (host_bf16(d)) m.add("fp32 kernel operands (host bf16)", {hybrid_kernel_elements(m, h, cp, ep, tl)}, 4);
  if (check_mode(d) == CheckMode::Reference) {
    const std::int64_t T = real_tokens(d, m);
    m.add("cp=1 reference step", {2, P1}, es, Holder::Rank0Before);  // every expert, and the gradients
    add_hybrid_step(m, h, 1, 1, T, es, Holder::Rank0Before);
    if (host_bf16(d)) m.add("cp=1 reference step", {hybrid_kernel_elements(m, h, 1, 1, T)}, 4, Holder::Rank0Before);
    // block outputs, logits gradient, parameter gradients, routing (fp64)
    m.add("cp=1 reference results", {T, static_cast<std::int64_t>(h.pattern.size()) * h.hidden + h.vocab}, es,
          Holder::Rank0Kept);
    m.add("cp=1 reference results", {P1}, es, Holder::Rank0Kept);
    m.add("cp=1 reference results", {T, static_cast<std::int64_t>(h.pattern.size()) * h.moe.topk}, 8,
          Holder::Rank0Kept);
    // the logits gradient gathered and its real rows; the whole experts' gradients gathered
    m.add("gathered results (check)", {gathered + T, h.vocab}, es);
    m.add("gathered results (check)", {P1}, es);
  }
  if (check_mode(d) == CheckMode::Cross) {  // the first strategy's block outputs, logits gradient, gradients
    m.add("first strategy's results (cross check)",
          {tl, static_cast<std::int64_t>(h.pattern.size()) * h.hidden + h.vocab}, es);
    m.add("first strategy's results (cross check)", {P}, es);
  }
  return m.with_slack();
}

MemoryModel train_memory(const Deck& d, const model::HybridConfig& h, int cp, int ep) {
  MemoryModel m(sizes_where(d, {"data.seqs_per_step", "data.max_len", "model.hidden", "model.pattern"},
                            "data.seqs_per_step, data.max_len and the model sizes"));
  const std::int64_t es = dtype_bytes(d), ms = std::max<std::int64_t>(es, 4);
  // Per document (data.partition = documents): nothing padded but the split documents' chunks (two
  // pad rows at most per rank and document), and the heaviest rank may hold up to one document more
  // than its share (documents placed heaviest first on the least-loaded rank).
  const bool docs = by_documents(d);
  const std::int64_t n = d.get_int("data.seqs_per_step"), L = d.get_int("data.max_len");
  const std::int64_t T = m.mul(n, L + (docs ? 0 : 2 * cp)), tl = ceil_div(T, cp) + (docs ? L + 2 * n : 0);
  const std::int64_t P = model::param_count(h, ep).total, P1 = model::param_count(h, 1).total;
  // master weights, AdamW moments and the widened gradients (master dtype); the step's compute copy
  // and its gradients (run dtype)
  m.add("parameters", {P}, es);
  m.add("gradients", {P}, es);
  m.add("optimizer", {4, P}, ms);
  add_hybrid_step(m, h, cp, ep, tl, es, Holder::EveryRank);
  if (host_bf16(d)) m.add("fp32 kernel operands (host bf16)", {hybrid_kernel_elements(m, h, cp, ep, tl)}, 4);
  if (d.get_bool("train.reference")) {
    m.add("cp=1 replica", {4, P1}, ms, Holder::Rank0Kept);
    m.add("cp=1 replica", {2, P1}, es, Holder::Rank0Kept);
    add_hybrid_step(m, h, 1, 1, T, es, Holder::Rank0Kept);
  }
  return m.with_slack();
}

}  // namespace hcp::drivers
