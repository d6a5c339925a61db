// Deck keys, model configuration and synthetic data shared by cp_hybrid and train_hybrid (step_batch:
// train_hybrid's [data] keys seqs_per_step, min_len, max_len).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common.hpp"
#include "cp/layout.hpp"
#include "io/deck.hpp"
#include "io/results.hpp"
#include "layer_keys.hpp"
#include "model/hybrid.hpp"
#include "model/mamba2_strategy.hpp"

namespace hcp::drivers {

// The model sections of the built-in decks of cp_hybrid and train_hybrid (a small NemotronV3-style
// stack); each driver appends its [data] / [parallel] / [run] / [train] sections.
inline std::string builtin_model_deck(std::int64_t vocab) {
  return "[model]\npattern = \"M*EM-E\"\nvocab = " + std::to_string(vocab) +
         "\nhidden = 32\n\n[mamba]\nheads = 4\nhead_dim = 8\nn_groups = 2\nd_state = 8\nchunk = 16\n\n"
         "[attention]\nheads = 4\nkv_heads = 2\nhead_dim = 8\n\n[moe]\nexperts = 8\ntopk = 2\nffn = 16\nshared_ffn = "
         "16\n\n";
}

// [model], [mamba], [attention], [moe], [mlp] and parallel.{mamba_cp, ep} keys.
// `attention_choices` lists what parallel.attention may be (cp_hybrid adds "all").
inline void add_hybrid_model_keys(DeckSchema& s, std::vector<std::string> attention_choices,
                                  const std::string& attn_def) {
  s.add_string("model.pattern", "M*EM-E", "blocks: M Mamba2, * attention, E MoE, - MLP")
      .add_int("model.vocab", 64, "vocabulary size", 2)
      .add_int("model.hidden", 32, "model width", 1);
  add_mamba_keys(s, {.heads = 4, .head_dim = 8, .groups = 2, .d_state = 8, .conv = 4, .chunk = 16});
  add_attention_keys(s, {4, 2, 8});
  s.add_float("attention.rope_theta", 0.0, "RoPE base (0: no positional embedding, as NemotronH)", 0.0)
      .add_int("moe.experts", 8, "routed experts (divisible by the EP size)", 1)
      .add_int("moe.topk", 2, "experts per token", 1)
      .add_int("moe.ffn", 16, "expert FFN width", 1)
      .add_int("moe.shared_ffn", 16, "shared expert FFN width (0: none)", 0)
      .add_float("moe.scaling", 2.5, "routed scaling factor", 0.0)
      .add_string("moe.router", "sigmoid", "router score function", {"sigmoid", "softmax"})
      .add_int("mlp.ffn", 64, "dense MLP width", 1)
      .add_string("parallel.attention", attn_def,
                  "attention CP strategy: one for every attention layer, or a list with one per attention layer of "
                  "model.pattern",
                  std::move(attention_choices))
      .list("parallel.attention")
      .add_string("parallel.mamba_cp", "hidden_parallel", "Mamba CP strategy", model::mamba_cp_names())
      .add_int("parallel.ep", 0,
               "expert-parallel group size: groups of ep consecutive CP ranks split the routed experts, each rank "
               "holding E/ep of them (0: the CP group; 1: every rank holds all)",
               0);
  add_cp_inner_key(s);
}

// The attention strategies of `attention` (a case of parallel.attention): one name for every
// attention layer, or a comma-separated list with one name per attention layer of model.pattern.
inline void set_attention_strategies(model::HybridConfig& c, const Deck& d, const std::string& attention) {
  std::vector<cp::AttnStrategy> v;
  for (const std::string& item : list_items(attention)) {
    HCP_INPUT_CHECK(item != "all" || attention == "all", d.where("parallel.attention"),
                    "key 'parallel.attention': \"all\" runs every strategy in turn and cannot be an item of a list");
    v.push_back(cp::attn_strategy_from_string(item));
  }
  const auto n_attn = static_cast<std::size_t>(std::count(c.pattern.begin(), c.pattern.end(), '*'));
  HCP_INPUT_CHECK(v.size() == 1 || v.size() == n_attn, d.where("parallel.attention"), "key 'parallel.attention' lists ",
                  v.size(), " strategies; model.pattern \"", c.pattern, "\" has ", n_attn,
                  " attention layers (give one strategy for all, or one per attention layer)");
  c.attn.strategy = v.front();
  if (v.size() > 1) c.attn_layers = std::move(v);
}

// The strategy of every attention layer of `c`, in pattern order, comma-separated (/config's
// attention_layers).
inline std::string attention_layers(const model::HybridConfig& c) {
  const auto n = static_cast<std::size_t>(std::count(c.pattern.begin(), c.pattern.end(), '*'));
  std::string s;
  for (std::size_t j = 0; j < n; ++j) {
    if (j) s += ',';
    s += cp::to_string(c.attention_layer(j).strategy);
  }
  return s;
}

// The model of the deck with attention strategies `attention` (one case of parallel.attention) on
// a CP group of `cp` ranks.
inline model::HybridConfig hybrid_config(const Deck& d, const std::string& attention, int cp) {
  model::HybridConfig c;
  c.pattern = d.get_string("model.pattern");
  HCP_INPUT_CHECK(!c.pattern.empty(), d.where("model.pattern"),
                  "key 'model.pattern' must name at least one block (M Mamba2, * attention, E MoE, - MLP)");
  for (char ch : c.pattern)
    HCP_INPUT_CHECK(ch == 'M' || ch == '*' || ch == 'E' || ch == '-', d.where("model.pattern"),
                    "key 'model.pattern' = \"", c.pattern, "\": '", std::string(1, ch),
                    "' is not a block (M Mamba2, * attention, E MoE, - MLP)");
  c.vocab = d.get_int("model.vocab");
  c.hidden = d.get_int("model.hidden");
  c.mamba = mamba_from_deck(d, c.hidden);
  c.mamba_cp = model::mamba_cp_from_string(d.get_string("parallel.mamba_cp"));
  const AttnShape a = attention_from_deck(d);
  c.attn.heads = a.heads;
  c.attn.kv_heads = a.kv_heads;
  c.attn.head_dim = a.head_dim;
  c.attn.rope_theta = d.get_float("attention.rope_theta");
  set_attention_strategies(c, d, attention);
  c.attn.cp_inner = cp_inner_of(d, cp);
  c.moe.experts = d.get_int("moe.experts");
  c.moe.topk = d.get_int("moe.topk");
  HCP_INPUT_CHECK(c.moe.topk <= c.moe.experts, d.where("moe.topk"), "moe.topk (", c.moe.topk,
                  ") must be <= moe.experts (", c.moe.experts, ")");
  c.moe.ffn = d.get_int("moe.ffn");
  c.moe.shared_ffn = d.get_int("moe.shared_ffn");
  c.moe.scaling = d.get_float("moe.scaling");
  c.moe.sigmoid = d.get_string("moe.router") == "sigmoid";
  c.mlp.ffn = d.get_int("mlp.ffn");
  c.ep = static_cast<int>(d.get_int("parallel.ep"));
  c.finalize();
  return c;
}

// The EP size of `c` on a CP group of `cp` ranks, or one error naming parallel.ep / moe.experts.
inline int ep_size_of(const Deck& d, const model::HybridConfig& c, int cp) {
  const int ep = c.ep == 0 ? cp : c.ep;
  HCP_INPUT_CHECK(cp % ep == 0, d.where("parallel.ep"), "parallel.ep = ", ep, " must divide the CP group size (", cp,
                  ")");
  if (c.pattern.find('E') != std::string::npos)
    HCP_INPUT_CHECK(c.moe.experts % ep == 0, d.where("moe.experts"), "expert parallelism needs moe.experts (",
                    c.moe.experts, ") divisible by the EP size (", ep, ")");
  return ep;
}

// Deterministic synthetic corpus with learnable structure: every sequence follows one of a few
// affine "programs" t_(i+1) = (a t_i + b) mod V (the program and start drawn from the seed), with a
// small share of random tokens. A model that learns the programs drives the loss well below log V.
inline std::vector<std::vector<std::int64_t>> synthetic_sequences(std::int64_t vocab,
                                                                  const std::vector<std::int64_t>& lens,
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
    HCP_INPUT_CHECK(cp == 1 || L % (2 * cp) == 0, d.where("data.seqlen"), "data.seqlen = ", L,
                    " must be a multiple of 2*cp = ", 2 * cp, " (DualChunkSwap)");
    lens.assign(static_cast<std::size_t>(d.get_int("data.batch")), L);
  } else {
    lens = parse_lengths(d, "data.seq_lens");
  }
  cp::PackedBatch pb = cp::pack_sequences(synthetic_sequences(vocab, lens, seed), cp, 0);
  TokenBatch b;
  b.layout = bshd ? SeqLayout::bshd(static_cast<std::int64_t>(lens.size()), lens[0]) : pb.layout;
  b.tokens = std::move(pb.tokens);
  b.labels = std::move(pb.labels);
  b.label_tokens = pb.label_tokens;
  return b;
}

// The batch of step t: a pure function of (seed, t), so a resumed run sees the same data.
inline TokenBatch step_batch(const Deck& d, int cp, std::int64_t vocab, std::int64_t t) {
  const auto seed = static_cast<std::uint64_t>(d.get_int("data.seed"));
  const std::int64_t n = d.get_int("data.seqs_per_step"), lo = d.get_int("data.min_len"),
                     hi = d.get_int("data.max_len");
  const bool bshd = d.get_string("data.format") == "bshd";
  std::vector<std::int64_t> lens;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t h = mix64(seed * 7919 + static_cast<std::uint64_t>(t) * 104729 + static_cast<std::uint64_t>(i));
    lens.push_back(bshd ? hi : lo + static_cast<std::int64_t>(h % static_cast<std::uint64_t>(hi - lo + 1)));
  }
  cp::PackedBatch pb =
      cp::pack_sequences(synthetic_sequences(vocab, lens, seed * 1000003 + static_cast<std::uint64_t>(t)), cp, 0);
  TokenBatch b;
  b.layout = bshd ? SeqLayout::bshd(n, hi) : pb.layout;
  b.tokens = std::move(pb.tokens);
  b.labels = std::move(pb.labels);
  b.label_tokens = pb.label_tokens;
  return b;
}

// A batch as data.partition lays it out: DualChunkSwap-padded (make_token_batch), or for
// documents the unpadded batch, with the placement and this rank's token ids and labels in its
// order (pads: id 0, no label).
struct PlacedBatch {
  TokenBatch batch;
  cp::Placement placement;
  std::vector<std::int64_t> tokens, labels;  // this rank's
};
// `b`: made for cp ranks (DualChunkSwap), or for one rank when the deck places documents.
inline PlacedBatch place_batch(const Deck& d, TokenBatch made, int cp, int rank, const model::HybridConfig& h) {
  PlacedBatch pb;
  pb.batch = std::move(made);
  std::shared_ptr<const cp::DocPartition> docs;
  if (by_documents(d)) {
    std::vector<std::int64_t> lens;
    for (std::int64_t s = 0; s < pb.batch.layout.nseq(); ++s) lens.push_back(pb.batch.layout.real(s));
    docs = doc_partition(d, lens, cp, model::hybrid_doc_cost(h));
  }
  TokenBatch& b = pb.batch;
  if (docs) {  // the batch unpadded (pack_sequences pads even at cp = 1): the placement's rows index it
    std::vector<std::int64_t> tokens, labels;
    for (auto i : cp::real_rows(b.layout)) {
      tokens.push_back(b.tokens[static_cast<std::size_t>(i)]);
      labels.push_back(b.labels[static_cast<std::size_t>(i)]);
    }
    b.layout = b.layout.unpadded();
    b.tokens = std::move(tokens);
    b.labels = std::move(labels);
    pb.placement = cp::Placement::documents(b.layout, std::move(docs));
  } else {
    pb.placement = cp::Placement::dcs(b.layout, cp);
  }
  pb.tokens = pb.placement.take(b.tokens, rank, 0);
  pb.labels = pb.placement.take(b.labels, rank, h.ignore_label);
  return pb;
}
inline PlacedBatch placed_batch(const Deck& d, int cp, int rank, const model::HybridConfig& h, std::uint64_t seed) {
  return place_batch(d, make_token_batch(d, by_documents(d) ? 1 : cp, h.vocab, seed), cp, rank, h);
}

// A hybrid driver's Cases::make: the model of case `attention` on the deck's batch, built (its
// constructor checks every layer's shape rules on `comm`) and dropped.
inline void make_hybrid_case(const Deck& d, Communicator& comm, int cp, const std::string& attention) {
  const model::HybridConfig h = hybrid_config(d, attention, cp);
  ep_size_of(d, h, cp);
  const PlacedBatch pb = placed_batch(d, cp, comm.rank(), h, 1);
  model::HybridModel m(comm, h, pb.placement);
}

// `p` where the model is to run (parameters already there are kept, not copied).
inline model::ParamMap in_space(model::ParamMap p, Space space) {
  for (auto& [n, t] : p)
    if (t.space() != space) t = t.to(space);
  return p;
}

// The whole of every split parameter of `p` (the others as they are): each EP group gathers its
// ranks' parts. Collective over the CP group.
inline model::ParamMap gather_shards(const ExpertGroups& g, const model::ShardMap& shards, const model::ParamMap& p) {
  model::ParamMap out = p;
  for (const auto& [n, sh] : shards) {
    const Tensor& t = p.at(n);
    Shape s = t.shape();
    s[0] = sh.total;
    Tensor whole = Tensor::empty(s, t.dtype(), t.space());
    g.ep().all_gather(t, whole);
    out[n] = whole;
  }
  return out;
}

// Sum modulo 2^64 over `c` (16-bit limbs summed exactly in fp64). Collective.
inline std::uint64_t sum_mod64(Communicator& c, std::uint64_t v) {
  double limbs[4];
  for (int k = 0; k < 4; ++k) limbs[k] = static_cast<double>((v >> (16 * k)) & 0xffffu);
  c.all_reduce(limbs, 4, DType::F64, ReduceOp::Sum);
  std::uint64_t s = 0;
  for (int k = 0; k < 4; ++k) s += static_cast<std::uint64_t>(limbs[k]) << (16 * k);
  return s;
}

// Writes parameters (or gradients, moments) `p` as <prefix><name>: a split one by rows, each part
// from the one rank whose copy is written (`owner`: the first replica of those experts in the first
// CP group), the others as rank 0 holds them. With `sums`, rank 0 appends "<path> <checksum>" per
// dataset. Collective over `world` (the writer's ranks).
inline void write_params(ResultsWriter& w, Communicator& world, const std::string& prefix, const model::ParamMap& p,
                         const model::ShardMap& shards, bool owner, const std::string& layout,
                         std::string* sums = nullptr) {
  for (const auto& [n, t] : p) {
    const std::string path = prefix + n;
    const auto it = shards.find(n);
    std::string sum;
    if (it == shards.end()) {
      w.tensor(path, t, layout, "1");
      if (sums && world.rank() == 0) sum = checksum(t);
    } else {
      const model::Shard& sh = it->second;
      std::vector<std::int64_t> rows(static_cast<std::size_t>(sh.rows), -1);
      for (std::int64_t i = 0; owner && i < sh.rows; ++i) rows[static_cast<std::size_t>(i)] = sh.first + i;
      w.rows(path, t, rows, sh.total, layout, "1");
      if (sums) {
        const std::int64_t per_row = sh.rows > 0 ? t.numel() / sh.rows : 0;
        sum = checksum_hex(sum_mod64(world, owner ? checksum_part(t, sh.first * per_row) : 0));
      }
    }
    if (sums && world.rank() == 0) *sums += path + " " + sum + "\n";
  }
}

// Fraction of (real token, MoE block) pairs whose chosen expert set (`mine`: this rank's [Tl, K] per
// MoE block, in the order of `placement`) differs from `ref` (the cp=1 model's [T, K] per block, real
// tokens in global order); computed on `root`, 0 elsewhere. Collective over `comm`.
inline double routing_flips(Communicator& comm, Space space, const std::vector<Tensor>& mine,
                            const std::vector<Tensor>& ref, const cp::Placement& placement, bool root) {
  std::int64_t flipped = 0, total = 0;
  for (std::size_t b = 0; b < mine.size(); ++b) {
    const Tensor gathered = placement.gather_real(comm, mine[b].to(space));
    const Tensor got = gathered.space() == Space::Host ? gathered : gathered.to(Space::Host);
    if (!root) continue;
    const std::int64_t T = got.size(0), K = got.size(1);
    for (std::int64_t t = 0; t < T; ++t) {
      std::vector<double> a(static_cast<std::size_t>(K)), r(static_cast<std::size_t>(K));
      for (std::int64_t j = 0; j < K; ++j) {
        a[static_cast<std::size_t>(j)] = got.get(t * K + j);
        r[static_cast<std::size_t>(j)] = ref[b].get(t * K + j);
      }
      std::sort(a.begin(), a.end());
      std::sort(r.begin(), r.end());
      flipped += a != r ? 1 : 0;
    }
    total += T;
  }
  return total > 0 ? static_cast<double>(flipped) / static_cast<double>(total) : 0.0;
}

}  // namespace hcp::drivers
