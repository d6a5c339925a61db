// Deck keys, model configuration and synthetic data shared by cp_hybrid and train_hybrid.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common.hpp"
#include "cp/layout.hpp"
#include "io/deck.hpp"
#include "model/hybrid.hpp"

namespace hcp::drivers {

// The model sections of the built-in decks of cp_hybrid and train_hybrid (a small NemotronV3-style
// stack); each driver appends its [data] / [parallel] / [run] / [train] sections.
inline std::string builtin_model_deck(std::int64_t vocab) {
  return "[model]\npattern = \"M*EM-E\"\nvocab = " + std::to_string(vocab) +
         "\nhidden = 32\n\n[mamba]\nheads = 4\nhead_dim = 8\nn_groups = 2\nd_state = 8\nchunk = 16\n\n"
         "[attention]\nheads = 4\nkv_heads = 2\nhead_dim = 8\n\n[moe]\nexperts = 8\ntopk = 2\nffn = 16\nshared_ffn = 16\n\n";
}

// [model], [mamba], [attention], [moe], [mlp] and parallel.{mamba_cp, expert_parallel} keys.
// `attention_choices` lists what parallel.attention may be (cp_hybrid adds "all").
inline void add_hybrid_model_keys(DeckSchema& s, std::vector<std::string> attention_choices, const std::string& attn_def) {
  s.add_string("model.pattern", "M*EM-E", "blocks: M Mamba2, * attention, E MoE, - MLP")
      .add_int("model.vocab", 64, "vocabulary size", 2)
      .add_int("model.hidden", 32, "model width", 1)
      .add_int("mamba.heads", 4, "SSM heads", 1)
      .add_int("mamba.head_dim", 8, "head dimension P", 1)
      .add_int("mamba.n_groups", 2, "B/C groups (divides heads)", 1)
      .add_int("mamba.d_state", 8, "state size N", 1)
      .add_int("mamba.conv", 4, "conv1d width", 1, 16)
      .add_int("mamba.chunk", 16, "SSD chunk size", 1)
      .add_int("attention.heads", 4, "query heads", 1)
      .add_int("attention.kv_heads", 2, "key/value heads (divides heads)", 1)
      .add_int("attention.head_dim", 8, "head dimension", 1, 1024)
      .add_float("attention.rope_theta", 0.0, "RoPE base (0: no positional embedding, as NemotronH)", 0.0)
      .add_int("moe.experts", 8, "routed experts (divisible by cp with expert parallelism)", 1)
      .add_int("moe.topk", 2, "experts per token", 1)
      .add_int("moe.ffn", 16, "expert FFN width", 1)
      .add_int("moe.shared_ffn", 16, "shared expert FFN width (0: none)", 0)
      .add_float("moe.scaling", 2.5, "routed scaling factor", 0.0)
      .add_string("moe.router", "sigmoid", "router score function", {"sigmoid", "softmax"})
      .add_int("mlp.ffn", 64, "dense MLP width", 1)
      .add_string("parallel.attention", attn_def, "attention CP strategy", std::move(attention_choices))
      .add_string("parallel.mamba_cp", "hidden_parallel", "Mamba CP strategy", {"hidden_parallel", "state_passing"})
      .add_bool("parallel.expert_parallel", true, "split MoE experts over the CP group");
}

inline model::HybridConfig hybrid_config(const Deck& d, cp::AttnStrategy strategy) {
  model::HybridConfig c;
  c.pattern = d.get_string("model.pattern");
  c.vocab = d.get_int("model.vocab");
  c.hidden = d.get_int("model.hidden");
  c.mamba.heads = d.get_int("mamba.heads");
  c.mamba.head_dim = d.get_int("mamba.head_dim");
  c.mamba.groups = d.get_int("mamba.n_groups");
  c.mamba.d_state = d.get_int("mamba.d_state");
  c.mamba.conv = d.get_int("mamba.conv");
  c.mamba.chunk = d.get_int("mamba.chunk");
  c.mamba_cp = model::mamba_cp_from_string(d.get_string("parallel.mamba_cp"));
  c.attn.heads = d.get_int("attention.heads");
  c.attn.kv_heads = d.get_int("attention.kv_heads");
  c.attn.head_dim = d.get_int("attention.head_dim");
  c.attn.rope_theta = d.get_float("attention.rope_theta");
  c.attn.strategy = strategy;
  c.moe.experts = d.get_int("moe.experts");
  c.moe.topk = d.get_int("moe.topk");
  HCP_CHECK(c.moe.topk <= c.moe.experts, "moe.topk (", c.moe.topk, ") must be <= moe.experts (", c.moe.experts, ")");
  c.moe.ffn = d.get_int("moe.ffn");
  c.moe.shared_ffn = d.get_int("moe.shared_ffn");
  c.moe.scaling = d.get_float("moe.scaling");
  c.moe.sigmoid = d.get_string("moe.router") == "sigmoid";
  c.mlp.ffn = d.get_int("mlp.ffn");
  c.expert_parallel = d.get_bool("parallel.expert_parallel");
  c.finalize();
  return c;
}

// Deterministic synthetic corpus with learnable structure: every sequence follows one of a few
// affine "programs" t_(i+1) = (a t_i + b) mod V (the program and start drawn from the seed), with a
// small share of random tokens. A model that learns the programs drives the loss well below log V.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
inline std::vector<std::vector<std::int64_t>> synthetic_sequences(std::int64_t vocab, const std::vector<std::int64_t>& lens,
                                                                  std::uint64_t seed) {
  static const std::int64_t progs[4][2] = {{1, 1}, {1, 3}, {3, 1}, {5, 2}};
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t s = 0; s < lens.size(); ++s) {
    std::uint64_t st = mix64(seed * 1315423911ULL + s);
    const auto* pr = progs[st % 4];
    std::vector<std::int64_t> q;
    std::int64_t t = static_cast<std::int64_t>((st >> 8) % static_cast<std::uint64_t>(vocab));
    for (std::int64_t i = 0; i < lens[s]; ++i) {
      q.push_back(t);
      st = mix64(st);
      t = (st % 16 == 0) ? static_cast<std::int64_t>((st >> 16) % static_cast<std::uint64_t>(vocab))
                         : (pr[0] * t + pr[1]) % vocab;
    }
    out.push_back(std::move(q));
  }
  return out;
}

// A batch on the global padded layout: THD packs the sequences (each padded to 2*cp, pads and last
// tokens carry the ignore label); BSHD uses `batch` rows of `seqlen` tokens.
struct TokenBatch {
  SeqLayout layout;
  std::vector<std::int64_t> tokens, labels;
  std::int64_t label_tokens = 0;
};
inline TokenBatch make_token_batch(const Deck& d, int cp, std::int64_t vocab, std::uint64_t seed) {
  std::vector<std::int64_t> lens;
  const bool bshd = d.get_string("data.format") == "bshd";
  if (bshd) {
    const std::int64_t L = d.get_int("data.seqlen");
    HCP_CHECK(L % (2 * cp) == 0, "data.seqlen = ", L, " must be a multiple of 2*cp = ", 2 * cp, " (DualChunkSwap)");
    lens.assign(static_cast<std::size_t>(d.get_int("data.batch")), L);
  } else {
    lens = parse_lengths(d.get_string("data.seq_lens"), "data.seq_lens");
  }
  cp::PackedBatch pb = cp::pack_sequences(synthetic_sequences(vocab, lens, seed), 2 * cp, 0);
  TokenBatch b;
  b.layout = bshd ? SeqLayout::bshd(static_cast<std::int64_t>(lens.size()), lens[0]) : pb.layout;
  b.tokens = std::move(pb.tokens);
  b.labels = std::move(pb.labels);
  b.label_tokens = pb.label_tokens;
  return b;
}

inline std::vector<std::int64_t> local_ids(const std::vector<std::int64_t>& v, const SeqLayout& g, int cp, int r) {
  std::vector<std::int64_t> out;
  for (auto i : cp::dcs_global_index(g, cp, r)) out.push_back(v[static_cast<std::size_t>(i)]);
  return out;
}

}  // namespace hcp::drivers
