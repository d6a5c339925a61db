// Bytes per rank and step (forward + backward) of every CP strategy that can run each layer kind,
// from the strategies' own models (cp::attention_cp_model_bytes, model::mamba_cp_model_bytes,
// cp::moe_ep_uniform_bytes), for any rank count without the ranks: --dry-run prints them as one
// BYTES line, which the planner (jobs/post/hcp_plan.py) reads instead of keeping models of its own.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/seq_layout.hpp"
#include "cp/attention_cp.hpp"
#include "cp/documents.hpp"
#include "io/deck.hpp"
#include "model/layers.hpp"
#include "model/mamba2.hpp"

namespace hcp::drivers {

struct LayerBytes {
  // layer kind ("*" attention, "M" Mamba2, "E" MoE) -> strategy -> bytes of each rank
  std::map<std::string, std::map<std::string, std::vector<std::int64_t>>> kinds;
  // a2a+p2p: the bytes of its ring over the outer group (across nodes), part of kinds["*"]
  std::map<std::string, std::vector<std::int64_t>> ring;
  // attention strategy -> its messages per layer (forward plus backward) by its record: those of its
  // exchanges over `group` ranks, and those of its K/V ring over `ring_ranks` (1: none), which
  // overlap the compute; the planner's latency terms
  struct Messages {
    std::int64_t exchange = 0, ring = 0;
    int group = 1, ring_ranks = 1;
    bool two_level = false;
  };
  std::map<std::string, Messages> messages;
  std::string state_scan;  // the state-passing exchange the Mamba bytes assume ("auto" resolved)
  // Mamba strategy -> its messages per layer (forward plus backward) by its record
  std::map<std::string, std::int64_t> mamba_messages;
  // Packed THD batches: how the tokens lie (data.partition; dcs is every document split), the pad
  // tokens, per rank the local rows, real tokens and work of the placement's cost model, and per
  // document the ranks it runs over (1: whole) and its block (-1: whole).
  struct Placement {
    std::string partition;
    std::int64_t pad_tokens = 0;
    std::vector<std::int64_t> rows, tokens;
    std::vector<double> work;
    std::vector<int> group, block;
  };
  std::vector<Placement> placement;  // empty or one
};

// The placement record of a packed (THD) deck's documents on `cp` ranks (data.partition, work by
// `cost`); nothing for BSHD.
void add_placement(LayerBytes& b, const Deck& d, int cp, const cp::DocCost& cost);

// Every attention strategy whose shape rules `c` (its strategy aside) meets on its placement's ranks:
// its bytes per rank in a forward and backward (`backward` false: the forward only; the message
// counts stay forward plus backward).
void add_attention_bytes(LayerBytes& b, const cp::CpAttnConfig& c, DType dt, bool backward = true);
// Every Mamba CP strategy whose shape rules `c` meets on the batch placed by `placement` (on its CP
// parts: the DualChunkSwap layout, or the split documents' blocks; every strategy 0 bytes when each
// document is whole; `backward` false: the forward only, the message counts staying forward plus
// backward).
void add_mamba_bytes(LayerBytes& b, const model::Mamba2Config& c, const cp::Placement& placement, DType dt,
                     bool backward = true);
// Expert parallelism over groups of `ep` ranks, tokens routed uniformly (an expectation).
void add_moe_bytes(LayerBytes& b, const model::MoeConfig& e, std::int64_t hidden, std::int64_t tokens_per_rank, int cp,
                   int ep, DType dt);
// {"driver": .., "cp": .., "state_scan": .., "layers": {kind: {strategy: [bytes of rank 0, 1, ..]}},
//  "ring": {"a2a+p2p": [..]}, "messages": {strategy: {..}}, "mamba_messages": {strategy: n},
//  "placement": {"partition": .., "pad_tokens": .., "rows": [..],
//  "tokens": [..], "work": [..], "group": [..], "block": [..]} (THD)}
std::string bytes_json(const std::string& driver, int cp, const LayerBytes& b);

}  // namespace hcp::drivers
