// The memory model of memory_model.hpp: per-token counts of the tensors each layer and strategy
// allocates (the tensors are named beside each term). The attention and Mamba drivers' models are
// in memory_model_layers.cpp, the hybrid step's in memory_model_hybrid.cpp; the limit, admission
// and --dry-run report in memory_admission.cpp.
#include "memory_model.hpp"

#include <algorithm>

#include "common.hpp"
#include "core/dtype.hpp"
#include "cp/head_exchange.hpp"
#include "cp/layout.hpp"
#include "cp/state_passing.hpp"

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

// a2a+p2p: the most K/V heads a rank carries around the outer ring (its query heads' K/V heads, or
// one per query head where its block does not follow the GQA groups).
std::int64_t ring_kv_heads(std::int64_t H, std::int64_t Hkv, int inner) {
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
std::int64_t hp_group_repeat(const model::Mamba2Config& c, int cp) { return c.groups < cp ? cp / c.groups : 1; }

std::int64_t mamba_work_per_token(const model::Mamba2Config& c, const std::string& strategy, int cp) {
  const std::int64_t di = c.d_inner(), GN = c.groups * c.d_state, H = c.heads;
  if (strategy == "state_passing") return 16 * di + 20 * GN + 4 * H + 64;
  if (cp == 1) return 10 * di + 10 * GN + 3 * H + 64;
  return 16 * di + (12 * hp_group_repeat(c, cp) - 2) * GN + 3 * H + 64;
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

std::int64_t sequences(const Deck& d) {
  if (d.get_string("data.format") == "bshd") return d.get_int("data.batch");
  return static_cast<std::int64_t>(parse_lengths(d, "data.seq_lens").size());
}
std::int64_t state_bytes(const Deck& d) { return d.get_string("data.dtype") == "bf16" ? 4 : dtype_bytes(d); }

std::int64_t mamba_param_count(const model::Mamba2Config& c) {
  // in_proj, conv weight and bias, A_log / D / dt_bias, norm weight, out_proj
  return c.d_in_proj() * c.hidden + c.conv_dim() * (c.conv + 1) + 3 * c.heads + c.d_inner() + c.hidden * c.d_inner();
}

bool host_bf16(const Deck& d) { return d.get_string("run.device") == "host" && d.get_string("data.dtype") == "bf16"; }

std::int64_t attention_kernel_elements(const MemoryModel& m, const std::string& strategy, int cp, std::int64_t tl,
                                       std::int64_t H, std::int64_t Hkv, std::int64_t D, int inner) {
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

}  // namespace hcp::drivers
