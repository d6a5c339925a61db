// The CP strategies of the two sequence-mixing layers, and the attention strategies' records: each
// names the deck choice, says what it is, and holds its parts (shape rule, the strategy object that
// owns its per-rank state, byte and memory models), which CpAttention dispatches to. Deck choices, `all`, the drivers'
// --list-strategies, their BYTES lines and the planner read these lists.
//   Attention (parallel.attention; src/cp/attention_cp.hpp):
//     p2p        ring of K/V with DualChunkSwap;
//     allgather  all-gather of K/V, reduce-scatter of dK/dV;
//     a2a        Ulysses: all-to-all from sequence to head shards and back (heads % cp == 0);
//     a2a+p2p    Ulysses over the inner group (parallel.cp_inner ranks, a node), ring p2p over the
//                outer group with heads / inner per rank (heads % inner == 0).
//   Mamba (parallel.mamba_cp; their records, with their parts, are model::mamba_cps(),
//   src/model/mamba2_strategy.hpp, where the layers they build live):
//     hidden_parallel: all-to-all to every token / heads/cp heads and back (needs heads % cp == 0 and
//                      n_groups vs cp divisibility; src/model/mamba2.hpp);
//     state_passing:   each rank scans its own chunks from a zero state; conv halos and the chunks'
//                      final states are exchanged, the true initial states follow from a scan along
//                      each sequence and correct the outputs (any heads / n_groups; state_passing.hpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/registry.hpp"

namespace hcp {
class Tensor;
class MemoryModel;
struct CpLevels;
}  // namespace hcp

namespace hcp::cp {
struct CpAttnConfig;
struct AttnStep;
class AttnImpl;

// The attention strategies, one per file src/cp/attention_<name>.cpp, listed in src/cp/CMakeLists.txt.
enum class AttnStrategy {
#define HCP_ATTN_STRATEGY(name, id) id,
#include "cp/attn_registry.inc"
#undef HCP_ATTN_STRATEGY
};
enum class MambaCp { HiddenParallel, StatePassing };

// The sizes an attention strategy's memory terms read: `cp` ranks (`inner` of them inside, for a
// two-level strategy), `tl` local tokens, query / K/V heads, head dim, `es` bytes per element.
struct AttnMemShape {
  int cp = 1;
  std::int64_t tl = 0, heads = 0, kv_heads = 0, head_dim = 0, es = 0;
  int inner = 1;
};

// One attention strategy's record, defined with designated initializers beside its strategy object
// (src/cp/attention_<name>.cpp); attn_strategies() lists them.
struct AttnStrategyInfo {
  AttnStrategy id;
  const char* name;     // deck name
  const char* summary;  // one line for --list-strategies
  // check: its shape rule beyond the layout's, throwing hcp::Error naming the deck keys (null: none);
  // make: its strategy object on one rank of a CP group of 2 or more ranks (its set-up is
  // collective-free; a two-level strategy runs over `levels` when given, else over groups it makes
  // at its first forward); model_bytes: the values rank `rank` of `cp` hands to the communicator in
  // one pass, from the sizes alone (attention_cp_model_bytes adds the cases every strategy shares).
  void (*check)(const CpAttnConfig& cfg, int cp);
  std::unique_ptr<AttnImpl> (*make)(AttnStep& step, std::shared_ptr<CpLevels> levels);
  std::int64_t (*model_bytes)(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward);
  // Its memory terms at cp >= 2 (attention_work_bytes / attention_kernel_elements add cp = 1):
  // work_bytes, the bytes one layer's step holds per rank beyond its inputs and outputs;
  // kernel_elements, the elements of its largest kernel call (the host kernels widen them to fp32
  // on bf16 CPU ranks). Products are checked by `m` (refused on overflow, naming its keys).
  std::int64_t (*work_bytes)(const MemoryModel& m, const AttnMemShape& s);
  std::int64_t (*kernel_elements)(const MemoryModel& m, const AttnMemShape& s);
  // Its messages, the latency terms of the planner's time model, for one layer's forward plus
  // backward on `cp` ranks (`inner` inside for a two-level strategy): exchange_messages, those of
  // its exchanges, none overlapping the attention's compute, which span `inner` ranks for a
  // two-level strategy and `cp` otherwise; ring_ranks, the ranks of the K/V ring whose steps
  // overlap the compute (1: no ring; its messages: p2p_ring_messages).
  std::int64_t (*exchange_messages)(int cp, int inner);
  int (*ring_ranks)(int cp, int inner);
  bool two_level = false;  // runs over an inner and an outer group (CpLevels, parallel.cp_inner)
};
const std::vector<AttnStrategyInfo>& attn_strategies();
const AttnStrategyInfo& attn_strategy_info(AttnStrategy id);
std::vector<std::string> attn_strategy_names();  // in registry order
// The messages of a K/V ring over n ranks in one forward plus backward: the K/V blocks of n - 1
// steps each way and the dK/dV accumulator's n - 1 moves.
inline std::int64_t p2p_ring_messages(int n) { return 3 * static_cast<std::int64_t>(n - 1); }
std::vector<AttnStrategy> attn_strategy_ids();

using hcp::choice_list;  // core/registry.hpp

// The memory terms of strategy `id` (its record's at cp >= 2; at cp = 1 every strategy runs the
// local kernels: the saved output and LSE, the gradients written in place).
std::int64_t attention_work_bytes(const MemoryModel& m, AttnStrategy id, const AttnMemShape& s);
std::int64_t attention_kernel_elements(const MemoryModel& m, AttnStrategy id, const AttnMemShape& s);

AttnStrategy attn_strategy_from_string(const std::string& s);
std::string to_string(AttnStrategy s);

}  // namespace hcp::cp
