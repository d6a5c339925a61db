// The memory model of memory_model.hpp: per-token counts of the tensors each layer and strategy
// allocates (the tensors are named beside each term). The limit, admission and --dry-run report
// are in memory_admission.cpp.
#include "memory_model.hpp"

#include <algorithm>

#include "common.hpp"
#include "core/dtype.hpp"
#include "cp/head_exchange.hpp"
#include "cp/layout.hpp"
#include "cp/state_passing.hpp"
#include "layer_keys.hpp"

namespace hcp::drivers {

std::int64_t padded_tokens(const Deck& d, int cp, const MemoryModel& m) {
  if (d.get_string("data.format") == "bshd") return m.mul(d.get_int("data.batch"), d.get_int("data.seqlen"));
  std::int64_t T = 0;
  for (std::int64_t n : parse_lengths(d, "data.seq_lens")) T = m.sum(T, m.mul(cp::dcs_chunk_len(n, cp), 2 * cp));
  return T;
}

std::int64_t real_tokens(const Deck& d, const MemoryModel& m) {
  if (d.get_string("data.format") == "bshd") return m.mul(d.get_int("data.batch"), d.get_int("data.seqlen"));
  std::int64_t T = 0;
  for (std::int64_t n : parse_lengths(d, "data.seq_lens")) T = m.sum(T, n);
  return T;
}

std::int64_t dtype_bytes(const Deck& d) {
  return static_cast<std::int64_t>(dtype_size(dtype_from_string(d.get_string("data.dtype"))));
}

CheckMode check_mode(const Deck& d) {
  const std::string& v = d.get_string("run.check");
  return v == "reference" ? CheckMode::Reference : v == "cross" ? CheckMode::Cross : CheckMode::Off;
}

namespace {
constexpr std::int64_t acc_bytes(std::int64_t es) { return es == 2 ? 4 : es; }  // bf16 sums in fp32
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
}  // namespace

// a2a+p2p: the most K/V heads a rank carries around the outer ring (its query heads' K/V heads, or
// one per query head where its block does not follow the GQA groups).
static std::int64_t ring_kv_heads(std::int64_t H, std::int64_t Hkv, int inner) {
  const std::int64_t hl = std::max<std::int64_t>(H / inner, 1);
  std::int64_t kvr = 1;
  for (int j = 0; j < inner; ++j) {
    const cp::KvHeadRanges r = cp::kv_head_ranges(H, Hkv, inner, j);
    kvr = std::max(kvr, r.map.empty() ? r.n[static_cast<std::size_t>(j)] : hl);
  }
  return kvr;
}

// Q = tl H D, KV = tl Hkv D elements; "a" sizes in the accumulation dtype.
std::int64_t attention_work_bytes(const MemoryModel& m, const std::string& strategy, int cp, std::int64_t tl,
                                  std::int64_t H, std::int64_t Hkv, std::int64_t D, std::int64_t es, int inner) {
  const std::int64_t acc = acc_bytes(es);
  const std::int64_t Q = m.mul(m.mul(tl, H * D), es), KV = m.mul(m.mul(tl, Hkv * D), es);
  const std::int64_t Qa = Q / es * acc, KVa = KV / es * acc, lse = m.mul(tl, H * acc);
  if (cp == 1) return Q + lse;  // the saved output and LSE; the gradients are written in place
  if (strategy == "a2a+p2p") {
    // the inner exchange: q, o, dout, dq in head layout (each the size of Q) with the all-to-all
    // buffers of the largest, the K/V heads of the ring and their gradients (inner x tl tokens),
    // the exchanges' results back in token layout; then the ring's own buffers on those tensors
    inner = std::max(inner, 1);
    const std::int64_t hl = std::max<std::int64_t>(H / inner, 1), kvr = ring_kv_heads(H, Hkv, inner);
    const std::int64_t KH = m.mul(m.mul(m.mul(tl, inner), kvr * D), es);
    const std::int64_t own = m.sum(m.sum(m.mul(8, Q), m.mul(4, KH)), 2 * KV);
    return m.sum(own, attention_work_bytes(m, "p2p", cp / inner, m.mul(tl, inner), hl, kvr, D, es));
  }
  if (strategy == "p2p")
    // saved o and LSE, the fp32 output merge (op, oacc) / the dQ accumulator and partial, K/V double
    // buffers (cur, nxt) with the partial dK/dV, and the travelling dK/dV accumulator pair
    return m.sum(m.sum(2 * Q + Qa, m.mul(6, KV)), m.sum(m.mul(4, KVa), 2 * lse));
  if (strategy == "allgather")
    // saved o and LSE, dQ; the global K/V, their gradients and the rank-major copies for the
    // reduce-scatter (each cp * KV), this rank's dK/dV
    return m.sum(m.sum(2 * Q, m.mul(6 * cp, KV)), 2 * KV + lse);
  // a2a: Q, O, dO, dQ in head layout (each the size of Q) with the all-to-all send/receive buffers
  // of the largest of them, and the K/V heads this rank reads (and their gradients) over the whole
  // sequence: n heads of cp * tl tokens.
  const std::int64_t hl = std::max<std::int64_t>(H / cp, 1),
                     g = std::max<std::int64_t>(H / std::max<std::int64_t>(Hkv, 1), 1);
  std::int64_t n = 1;
  for (std::int64_t r = 0; r < cp; ++r) n = std::max(n, ((r + 1) * hl - 1) / g + 1 - r * hl / g);
  const std::int64_t KH = m.mul(m.mul(m.mul(tl, cp), n * D), es);
  return m.sum(m.sum(m.mul(8, Q), m.mul(4, KH)), lse);
}

// Elements per local token of one Mamba2 mixer's step beyond its input and output: zxbcdt's
// gradient and, in state passing, zxbcdt itself (hidden parallel keeps z alone past its all-to-all),
// the pre- and post-conv x/B/C and their gradients (conv_dim), the SSD output, gate and norm terms
// (d_inner, the norm's output computed again in the backward) and dt/dA (heads); hidden parallel at
// cp > 1 adds the all-to-all buffers (x, B, C, dt there and back, B/C repeated when n_groups < cp).
std::int64_t mamba_work_per_token(const model::Mamba2Config& c, const std::string& strategy, int cp) {
  const std::int64_t di = c.d_inner(), GN = c.groups * c.d_state, H = c.heads;
  if (strategy == "state_passing") return 16 * di + 20 * GN + 4 * H + 64;
  if (cp == 1) return 10 * di + 10 * GN + 3 * H + 64;
  const std::int64_t rep = c.groups < cp ? cp / c.groups : 1;
  return 16 * di + (12 * rep - 2) * GN + 3 * H + 64;
}

// State passing's per-sequence state tensors, beside the per-token terms (rows of H (P N + 1)
// values in the scan dtype; np = 2 pieces per sequence on every rank): per layer the saved incoming
// states, and for the all-gather exchange every rank's gathered final and incoming states (2 cp np);
// while a layer runs, its pieces' final states and their gradients, and the exchange's buffers
// (2 cp np more for the all-gather, a few rows per piece for the doubling scan).
StateRows state_passing_rows(const model::Mamba2Config& c, int cp, std::int64_t sequences) {
  // The exchange choice depends on how the pieces lie, not on their lengths: 2 cp tokens a sequence.
  std::vector<std::int64_t> cu{0};
  for (std::int64_t s = 0; s < sequences; ++s) cu.push_back(cu.back() + 2 * cp);
  const bool gather = cp::resolve_state_exchange(SeqLayout::thd(cu), cp, cp::Partition::DCS, c.state_exchange,
                                                 c.head_dim * c.d_state) == cp::StateExchange::AllGather;
  const std::int64_t np = 2 * sequences;
  return {gather ? (2 * cp + 1) * np : 2 * np, gather ? (2 * cp + 3) * np : 9 * np,
          c.heads * (c.head_dim * c.d_state + 1)};
}

namespace {
std::int64_t sequences(const Deck& d) {
  if (d.get_string("data.format") == "bshd") return d.get_int("data.batch");
  return static_cast<std::int64_t>(parse_lengths(d, "data.seq_lens").size());
}
std::int64_t state_bytes(const Deck& d) { return d.get_string("data.dtype") == "bf16" ? 4 : dtype_bytes(d); }
// The hybrid stack's state-passing states: each Mamba2 layer's saved rows, one layer's work rows.
void add_state_passing(MemoryModel& m, const Deck& d, const model::HybridConfig& h, int cp, std::int64_t seqs) {
  if (h.mamba_cp != model::MambaCp::StatePassing) return;
  const auto layers = static_cast<std::int64_t>(std::count(h.pattern.begin(), h.pattern.end(), 'M'));
  if (layers == 0) return;
  const StateRows r = state_passing_rows(h.mamba, cp, seqs);
  m.add("state passing states", {m.sum(m.mul(layers, r.saved), r.work), r.row}, state_bytes(d));
}
}  // namespace

std::int64_t mamba_param_count(const model::Mamba2Config& c) {
  // in_proj, conv weight and bias, A_log / D / dt_bias, norm weight, out_proj
  return c.d_in_proj() * c.hidden + c.conv_dim() * (c.conv + 1) + 3 * c.heads + c.d_inner() + c.hidden * c.d_inner();
}

namespace {
// Host kernels compute bf16 in fp32: each kernel widens its operands into fp32 copies for the call.
bool host_bf16(const Deck& d) { return d.get_string("run.device") == "host" && d.get_string("data.dtype") == "bf16"; }

// The attention backward kernel's operands (q, o, dout, dq and the K/V it reads with their
// gradients), in elements: the largest call of a step, widened on host bf16 ranks.
std::int64_t attention_kernel_elements(const MemoryModel& m, const std::string& strategy, int cp, std::int64_t tl,
                                       std::int64_t H, std::int64_t Hkv, std::int64_t D, int inner = 1) {
  const std::int64_t q = m.mul(m.mul(4, tl), H * D);
  std::int64_t kv_tokens = tl;
  if (cp > 1 && strategy == "allgather") kv_tokens = m.mul(tl, cp);
  if (cp > 1 && strategy == "a2a")
    return m.sum(q, m.mul(m.mul(4, m.mul(tl, cp)), D * std::max<std::int64_t>(1, Hkv / cp + 1)));
  // a2a+p2p: the ring's kernels on inner x tl tokens, heads / inner query heads and their K/V heads
  if (cp > 1 && strategy == "a2a+p2p")
    return m.sum(q, m.mul(m.mul(4, m.mul(tl, inner)), ring_kv_heads(H, Hkv, inner) * D));
  return m.sum(q, m.mul(m.mul(4, kv_tokens), Hkv * D));
}
}  // namespace

MemoryModel attention_memory(const Deck& d, int cp, const std::string& strategy) {
  MemoryModel m("data.seqlen/data.batch/data.seq_lens, attention.heads, attention.kv_heads, attention.head_dim");
  const std::int64_t H = d.get_int("attention.heads"), Hkv = d.get_int("attention.kv_heads"),
                     D = d.get_int("attention.head_dim");
  const std::int64_t es = dtype_bytes(d), tl = padded_tokens(d, cp, m) / cp;
  // q, dout, o, dq and k, v, dk, dv of this rank's tokens
  m.add("inputs and outputs", {tl, 4 * (H + Hkv) * D}, es);
  m.add("step buffers", {attention_work_bytes(m, strategy, cp, tl, H, Hkv, D, es, cp_inner_of(d, cp))});
  if (host_bf16(d))
    m.add("fp32 kernel operands (host bf16)",
          {attention_kernel_elements(m, strategy, cp, tl, H, Hkv, D, cp_inner_of(d, cp))}, 4);
  if (check_mode(d) == CheckMode::Reference) {
    const std::int64_t T = real_tokens(d, m), Tp = padded_tokens(d, cp, m);
    if (host_bf16(d))
      m.add("cp=1 reference step", {attention_kernel_elements(m, strategy, 1, T, H, Hkv, D)}, 4, Holder::Rank0Before);
    // the unpadded inputs (q, k, v, dout), the results, its saved output and LSE
    m.add("cp=1 reference step", {T, 4 * (H + Hkv) * D}, es, Holder::Rank0Before);
    m.add("cp=1 reference step", {attention_work_bytes(m, strategy, 1, T, H, Hkv, D, es)}, 1, Holder::Rank0Before);
    m.add("cp=1 reference results", {T, 2 * (H + Hkv) * D}, es, Holder::Rank0Kept);
    // one result gathered in global order and its real rows, on every rank
    m.add("gathered results (check)", {Tp + T, H * D}, es);
  }
  // run.check = cross: the first strategy's o, dq, dk, dv shards, kept while the others run
  if (check_mode(d) == CheckMode::Cross) m.add("first strategy's results (cross check)", {tl, 2 * (H + Hkv) * D}, es);
  return m.with_slack();
}

MemoryModel mamba_memory(const Deck& d, int cp, const std::string& strategy) {
  MemoryModel m(
      "data.seqlen/data.batch/data.seq_lens, mamba.hidden, mamba.heads, mamba.head_dim, mamba.n_groups, mamba.d_state");
  const model::Mamba2Config c = mamba_from_deck(d, d.get_int("mamba.hidden"));
  const std::int64_t es = dtype_bytes(d), tl = padded_tokens(d, cp, m) / cp, P = mamba_param_count(c);
  m.add("inputs and outputs", {tl, 4 * c.hidden}, es);  // x, dy, y, dx
  m.add("parameters", {P}, es);
  m.add("gradients", {P}, es);
  m.add("step buffers", {tl, mamba_work_per_token(c, strategy, cp)}, es);
  if (strategy == "state_passing") {
    const StateRows r = state_passing_rows(c, cp, sequences(d));
    m.add("state passing states", {r.saved + r.work, r.row}, state_bytes(d));
  }
  if (check_mode(d) == CheckMode::Reference) {
    const std::int64_t T = real_tokens(d, m), Tp = padded_tokens(d, cp, m);
    m.add("cp=1 reference step", {T, 4 * c.hidden + mamba_work_per_token(c, "hidden_parallel", 1)}, es,
          Holder::Rank0Before);
    m.add("cp=1 reference step", {3, P}, es, Holder::Rank0Before);
    m.add("cp=1 reference results", {T, 2 * c.hidden}, es, Holder::Rank0Kept);
    m.add("cp=1 reference results", {P}, es, Holder::Rank0Kept);
    m.add("gathered results (check)", {Tp + T, c.hidden}, es);
  }
  if (check_mode(d) == CheckMode::Cross) {  // the first strategy's y, dh shards and gradients
    m.add("first strategy's results (cross check)", {tl, 2 * c.hidden}, es);
    m.add("first strategy's results (cross check)", {P}, es);
  }
  return m.with_slack();
}

namespace {
// The largest kernel call of a hybrid step, in elements of its operands (inputs and outputs), which
// host kernels widen into fp32 copies on bf16 ranks: the grouped expert MLP's backward (the routed
// experts' weights and their gradients, the rows), a Mamba2 layer's in_proj backward and its SSD
// backward, the LM head's backward, the attention kernels of each layer's strategy.
std::int64_t hybrid_kernel_elements(const MemoryModel& m, const model::HybridConfig& h, int cp, int ep,
                                    std::int64_t tl) {
  const std::int64_t C = h.hidden;
  const auto& mc = h.mamba;
  const auto& e = h.moe;
  std::int64_t big = m.sum(m.mul(2 * h.vocab, C), m.mul(tl, h.vocab + 2 * C));  // lm_head
  std::size_t n_attn = 0;
  for (char k : h.pattern) {
    if (k == 'M') {
      big = std::max(big, m.sum(m.mul(2 * mc.d_in_proj(), C), m.mul(tl, mc.d_in_proj() + 2 * C)));
      big = std::max(
          big, m.mul(tl, 4 * mc.d_inner() + 4 * mc.groups * mc.d_state * std::max<std::int64_t>(1, cp / mc.groups) +
                             4 * mc.heads));
    } else if (k == '*') {
      const auto& a = h.attn;
      const std::string strategy = cp::to_string(h.attention_layer(n_attn++).strategy);
      big = std::max(big, attention_kernel_elements(m, strategy, cp, tl, a.heads, a.kv_heads, a.head_dim, a.cp_inner));
    } else if (k == 'E') {
      const std::int64_t F1 = e.act == kernels::Activation::SwiGLU ? 2 * e.ffn : e.ffn;
      const auto layers = static_cast<std::int64_t>(std::count(h.pattern.begin(), h.pattern.end(), 'E'));
      big = std::max(big,
                     m.sum(m.mul(2, model::param_count(h, ep).experts / layers), m.mul(m.mul(tl, e.topk), 3 * C + F1)));
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
  const std::string mstrat = h.mamba_cp == model::MambaCp::StatePassing ? "state_passing" : "hidden_parallel";
  // Mamba2, hidden parallel: z, the conv input and output (x, B, C), y and dt; state passing:
  // zxbcdt (its halo and dt are read from it), the conv input and output, y, and the gate and norm
  // terms (the norm's output, computed again in the backward, counted as kept).
  const std::int64_t m_saved = h.mamba_cp == model::MambaCp::StatePassing
                                   ? mc.d_in_proj() + mc.conv_dim() + 4 * mc.d_inner() + 8
                                   : 2 * mc.d_inner() + 2 * mc.conv_dim() + mc.heads + 8;
  // Attention: q, k, v (after the projections), the output before and after Wo, the LSE.
  const std::int64_t a_saved = 3 * a.heads * a.head_dim + 2 * a.kv_heads * a.head_dim + a.heads;
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
      w = mamba_work_per_token(mc, mstrat, cp) - m_saved + 2 * C;
    } else if (k == '*') {
      s = a_saved;
      // the projections' gradients beside the CP attention's own buffers
      w = (a.heads + 2 * a.kv_heads) * a.head_dim + 2 * C;
      const std::string strategy = cp::to_string(h.attention_layer(n_attn++).strategy);
      wb = attention_work_bytes(m, strategy, cp, tl, a.heads, a.kv_heads, a.head_dim, es, a.cp_inner);
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

MemoryModel hybrid_memory(const Deck& d, const model::HybridConfig& h, int cp, int ep) {
  MemoryModel m("data.seqlen/data.batch/data.seq_lens and the model sizes");
  const std::int64_t es = dtype_bytes(d), tl = padded_tokens(d, cp, m) / cp;
  const std::int64_t P = model::param_count(h, ep).total, P1 = model::param_count(h, 1).total;
  m.add("parameters", {P}, es);
  m.add("gradients", {P}, es);
  add_hybrid_step(m, h, cp, ep, tl, es, Holder::EveryRank);
  add_state_passing(m, d, h, cp, sequences(d));
  if (host_bf16(d)) m.add("fp32 kernel operands (host bf16)", {hybrid_kernel_elements(m, h, cp, ep, tl)}, 4);
  if (check_mode(d) == CheckMode::Reference) {
    const std::int64_t T = real_tokens(d, m), Tp = padded_tokens(d, cp, m);
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
    m.add("gathered results (check)", {Tp + T, h.vocab}, es);
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
  MemoryModel m("data.seqs_per_step, data.max_len and the model sizes");
  const std::int64_t es = dtype_bytes(d), ms = std::max<std::int64_t>(es, 4);
  const std::int64_t T = m.mul(d.get_int("data.seqs_per_step"), d.get_int("data.max_len") + 2 * cp),
                     tl = ceil_div(T, cp);
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
