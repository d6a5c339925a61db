// Deck keys of the layers and the optimiser, one definition each for every driver that reads them; a driver passes
// its defaults (those of its built-in deck).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "comm/process_grid.hpp"
#include "cp/strategy.hpp"
#include "io/deck.hpp"
#include "model/mamba2.hpp"
#include "model/optim.hpp"

namespace hcp::drivers {

// [mamba] heads, head_dim, n_groups, d_state, conv, chunk (the model width is the driver's key).
inline void add_mamba_keys(DeckSchema& s, const model::Mamba2Config& def) {
  s.add_int("mamba.heads", def.heads, "SSM heads (hidden_parallel: divisible by cp)", 1)
      .add_int("mamba.head_dim", def.head_dim, "head dimension P", 1)
      .add_int("mamba.n_groups", def.groups, "B/C groups (hidden_parallel: n_groups % cp == 0 or cp % n_groups == 0)",
               1)
      .add_int("mamba.d_state", def.d_state, "state size N", 1)
      .add_int("mamba.conv", def.conv, "conv1d width", 1, 16)
      .add_int("mamba.chunk", def.chunk, "SSD chunk size", 1)
      .add_string("mamba.state_scan", "auto",
                  "state passing's scan across ranks: doubling (O(log cp) rounds and states per rank), allgather "
                  "(every piece's state to every rank), auto (fewer bytes per rank on the layout)",
                  {"auto", "doubling", "allgather"});
}
inline model::Mamba2Config mamba_from_deck(const Deck& d, std::int64_t hidden) {
  model::Mamba2Config c;
  c.hidden = hidden;
  c.heads = d.get_int("mamba.heads");
  c.head_dim = d.get_int("mamba.head_dim");
  c.groups = d.get_int("mamba.n_groups");
  c.d_state = d.get_int("mamba.d_state");
  c.conv = d.get_int("mamba.conv");
  c.chunk = d.get_int("mamba.chunk");
  c.state_exchange = cp::state_exchange_from_string(d.get_string("mamba.state_scan"));
  return c;
}

// [attention] heads, kv_heads, head_dim.
struct AttnShape {
  std::int64_t heads, kv_heads, head_dim;
};
inline void add_attention_keys(DeckSchema& s, const AttnShape& def) {
  s.add_int("attention.heads", def.heads, "query heads", 1)
      .add_int("attention.kv_heads", def.kv_heads, "key/value heads (divides heads)", 1)
      .add_int("attention.head_dim", def.head_dim, "head dimension", 1, 1024);
}
inline AttnShape attention_from_deck(const Deck& d) {
  AttnShape a{d.get_int("attention.heads"), d.get_int("attention.kv_heads"), d.get_int("attention.head_dim")};
  HCP_INPUT_CHECK(a.heads % a.kv_heads == 0, d.where("attention.kv_heads"), "attention.kv_heads = ", a.kv_heads,
                  " must divide attention.heads = ", a.heads);
  return a;
}

// The attention CP strategies of the registry (cp/strategy.hpp), with "all" when a driver runs
// every one; and parallel.cp_inner, the inner (Ulysses) group of a2a+p2p.
inline std::vector<std::string> attention_choices(bool with_all) {
  std::vector<std::string> v = cp::attn_strategy_names();
  if (with_all) v.emplace_back("all");
  return v;
}
inline void add_cp_inner_key(DeckSchema& s) {
  s.add_int("parallel.cp_inner", 0,
            "a2a+p2p: ranks of the inner (Ulysses) group, consecutive ranks, dividing the CP size (0: the CP "
            "ranks of one node, the largest common divisor of the ranks per node and the CP size)",
            0);
}
// A dry run's ranks per node (--ranks with --ranks-per-node), set by the harness; 0: the job's own.
inline int& dry_run_ranks_per_node() {
  static int n = 0;
  return n;
}
// Ranks of this job per node (MPI shared-memory split of the world), the fewest on any node, so
// every rank derives the same from it: collective on the first call, which the driver harness makes
// on every rank at start-up. A dry run of --ranks N answers for those N ranks instead.
inline int ranks_per_node() {
  if (dry_run_ranks_per_node() > 0) return dry_run_ranks_per_node();
  static const int n = [] {
    int local = 1, fewest = 1;
    node_local_rank(&local);
    MPI_Allreduce(&local, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return fewest;
  }();
  return n;
}
// parallel.cp_inner resolved for a CP group of `cp` ranks (1 at cp = 1: the unsharded problem).
inline int cp_inner_of(const Deck& d, int cp) {
  if (cp == 1) return 1;
  const auto v = d.get_int("parallel.cp_inner");
  return v > 0 ? static_cast<int>(v) : std::gcd(ranks_per_node(), cp);
}

// [train] optimiser and schedule: steps, lr, min_lr, warmup, beta1, beta2, weight_decay, clip.
inline void add_adamw_keys(DeckSchema& s) {
  s.add_int("train.steps", 30, "optimizer steps in total", 1)
      .add_float("train.lr", 1e-2, "peak learning rate", 0.0)
      .add_float("train.min_lr", 1e-3, "final learning rate of the cosine", 0.0)
      .add_int("train.warmup", 5, "linear warm-up steps", 0)
      .add_float("train.beta1", 0.9, "Adam beta1", 0.0, 1.0)
      .add_float("train.beta2", 0.95, "Adam beta2", 0.0, 1.0)
      .add_float("train.weight_decay", 0.01, "decoupled weight decay (matrices only)", 0.0)
      .add_float("train.clip", 1.0, "global gradient-norm clip (0: off)", 0.0);
}
inline model::AdamWConfig adamw_from_deck(const Deck& d) {
  model::AdamWConfig o;
  o.lr = d.get_float("train.lr");
  o.min_lr = d.get_float("train.min_lr");
  o.beta1 = d.get_float("train.beta1");
  o.beta2 = d.get_float("train.beta2");
  o.weight_decay = d.get_float("train.weight_decay");
  o.clip = d.get_float("train.clip");
  o.warmup = d.get_int("train.warmup");
  o.total = d.get_int("train.steps");
  return o;
}

}  // namespace hcp::drivers
