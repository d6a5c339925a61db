// cp_generate's models from the deck alone: the decode's bytes per step, the hand-off a rank holds,
// the memory model of a generation and the prefill's attention bytes (--dry-run).
#include <algorithm>
#include <cstdio>

#include "generate.hpp"

namespace hcp::drivers {

std::int64_t decode_model_bytes(const model::HybridConfig& h, int cp, std::int64_t nseq, DType dt) {
  if (cp == 1) return 0;
  const auto es = static_cast<std::int64_t>(dtype_size(dt)), as = static_cast<std::int64_t>(dtype_size(acc_dtype(dt)));
  const auto all_reduce = [&](std::int64_t count) { return 2 * count * (cp - 1) / cp * es; };
  std::int64_t b = 0;
  for (char k : h.pattern) {
    if (k == 'M') b += all_reduce(nseq * h.mamba.d_inner());
    if (k == 'E') b += all_reduce(nseq * h.hidden);
    if (k == '*') b += nseq * h.attn.heads * (cp - 1) * (h.attn.head_dim * es + as);
  }
  return b;
}

std::map<char, std::int64_t> prefill_model_bytes(const model::HybridModel& m, int rank, DType dt) {
  std::map<char, std::int64_t> b;
  const model::HybridConfig& h = m.config();
  const auto count = [&](char k) {
    return static_cast<std::size_t>(std::count(h.pattern.begin(), h.pattern.end(), k));
  };
  for (std::size_t j = 0; j < count('*'); ++j) b['*'] += m.attention(j).attention().model_fwd_bytes(dt);
  if (count('M') > 0)
    b['M'] = static_cast<std::int64_t>(count('M')) *
             model::mamba_cp_model_bytes(h.mamba_cp, h.mamba, m.placement(), rank, dt, /*forward_only=*/true);
  return b;
}

bool bytes_match_models(const std::string& name, const Generated& got, const model::HybridModel& m, int rank, int cp,
                        DType dt, const std::map<char, std::int64_t>& prefill) {
  bool ok = true;
  const auto mismatch = [&](const std::string& what, std::int64_t sent, std::int64_t want) {
    if (sent == want) return;
    ok = false;
    std::printf("# %s: %s %lld bytes on rank %d, the model says %lld\n", name.c_str(), what.c_str(),
                static_cast<long long>(sent), rank, static_cast<long long>(want));
  };
  mismatch("decode all-reduces and all-gathers", got.decode_collective_bytes,
           got.decode_steps() * decode_model_bytes(m.config(), cp, m.placement().global.nseq(), dt));
  for (const auto& [kind, want] : prefill) {
    const auto it = got.prefill_kind_bytes.find(kind);
    mismatch(std::string("prefill '") + kind + "' blocks", it == got.prefill_kind_bytes.end() ? 0 : it->second, want);
  }
  return ok;
}

std::int64_t handoff_bytes(const Deck& d, const model::HybridConfig& h, int cp) {
  MemoryModel m("data.seq_lens/data.batch/data.seqlen, generate.new_tokens and the model sizes");
  const std::int64_t es = dtype_bytes(d), ss = state_bytes(d), nseq = sequences(d);
  const std::int64_t steps = d.get_int("generate.new_tokens") - 1;
  const std::int64_t tl = padded_tokens(d, cp, m) / cp;
  const auto count = [&](char k) {
    return static_cast<std::int64_t>(std::count(h.pattern.begin(), h.pattern.end(), k));
  };
  // A rank's rows of a sequence are its chunks (pads included, at most), plus its share of the new
  // tokens: the append rule gives the rank with the fewest, so at most ceil(steps / cp) more.
  const std::int64_t kv_rows = m.sum(tl, m.mul(nseq, ceil_div(steps, cp)));
  std::int64_t b = m.mul(m.mul(count('*'), m.mul(kv_rows, 2 * h.attn.kv_heads * h.attn.head_dim)), es);
  const model::Mamba2Config& c = h.mamba;
  const bool hp = h.mamba_cp == model::MambaCp::HiddenParallel && cp > 1;
  const std::int64_t hl = hp ? c.heads / cp : c.heads, gl = hp ? std::max<std::int64_t>(c.groups / cp, 1) : c.groups;
  const std::int64_t per_seq =
      (c.conv - 1) * (hl * c.head_dim + 2 * gl * c.d_state) * es + hl * c.head_dim * c.d_state * ss;
  return m.sum(b, m.mul(count('M'), m.mul(nseq, per_seq)));
}

MemoryModel generate_memory(const Deck& d, const model::HybridConfig& h, int cp, int ep) {
  MemoryModel m(hybrid_sizes_where(d, ", generate.new_tokens"));
  const std::int64_t es = dtype_bytes(d), tl = padded_tokens(d, cp, m) / cp;
  const std::int64_t P1 = model::param_count(h, 1).total;
  m.add("parameters", {model::param_count(h, ep).total}, es);
  add_hybrid_forward(m, d, h, cp, ep, tl, es, Holder::EveryRank);
  // The hand-off, and while the decoder takes it one attention layer's K/V shard twice (the layer's
  // prompt rows beside the decoder's copy with room for the new tokens).
  const std::int64_t kv_layer = h.pattern.find('*') == std::string::npos ? 0 : 2 * h.attn.kv_heads * h.attn.head_dim;
  m.add("decode hand-off (KV shards, Mamba2 states)", {handoff_bytes(d, h, cp)});
  m.add("decode hand-off (KV shards, Mamba2 states)", {tl, kv_layer}, es);
  if (check_mode(d) == CheckMode::Reference) {
    // The cp=1 generation before the cases (its parameters kept for the teacher forcing after each),
    // and the teacher-forcing forward over every prompt on rank 0 after each case.
    const std::int64_t T = real_tokens(d, m);
    m.add("cp=1 reference parameters", {P1}, es, Holder::Rank0Kept);
    m.add("cp=1 reference generation", {P1}, es, Holder::Rank0Before);
    add_hybrid_forward(m, d, h, 1, 1, T, es, Holder::Rank0Before);
    m.add("cp=1 reference generation", {handoff_bytes(d, h, 1)}, 1, Holder::Rank0Before);
    add_hybrid_forward(m, d, h, 1, 1, m.sum(T, m.mul(sequences(d), d.get_int("generate.new_tokens"))), es,
                       Holder::Rank0Kept);
  }
  return m.with_slack();
}

LayerBytes generate_bytes(const Deck& d, const model::HybridConfig& h, int cp) {
  LayerBytes b;
  const cp::Placement p = placement_of(d, cp, model::hybrid_doc_cost(h));
  const DType dt = dtype_from_string(d.get_string("data.dtype"));
  if (h.pattern.find('*') != std::string::npos) add_attention_bytes(b, model::cp_attn_config(h.attn, p), dt, false);
  if (h.pattern.find('M') != std::string::npos) add_mamba_bytes(b, h.mamba, p, dt, false);
  return b;
}

}  // namespace hcp::drivers
