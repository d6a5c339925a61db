// Memory per rank: one model of the tensor bytes a rank of each driver and strategy holds, from the
// deck alone. The drivers' admission check (validate phase, before anything is allocated), their
// --dry-run and the planner (hcp_plan.py, which runs --dry-run) all read it.
//
// What a rank holds is split into parts. Parts of every rank: the driver's inputs and outputs, the
// parameters and their gradients, the activations its blocks keep for the backward, the largest
// block's step-time buffers (K/V blocks in flight, gathered K/V, all-to-all buffers, accumulators)
// — all of its own tokens (global / cp). Parts of a run with run.check = "reference": the cp=1
// problem on rank 0 (the whole sequence: its step, then the results it keeps for the comparisons)
// and the global copy of one result every rank gathers to compare. The per-token counts are written
// from the tensors the layers allocate (named beside each term) and rounded up; they are checked
// against the measured tensor high-water of every driver and strategy at several rank counts
// (tests/drivers: estimate / measured in [1.0, 1.5]).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/memory_parts.hpp"
#include "cp/documents.hpp"
#include "harness.hpp"
#include "io/deck.hpp"
#include "model/hybrid.hpp"
#include "model/mamba2.hpp"

namespace hcp::drivers {

// ---- shapes ----------------------------------------------------------------------------------------
// Global tokens after padding: batch x seqlen (BSHD) or the lengths padded to 2*cp (THD); and the
// unpadded total (the cp=1 reference's tokens).
std::int64_t padded_tokens(const Deck& d, int cp, const MemoryModel& m);
std::int64_t real_tokens(const Deck& d, const MemoryModel& m);
std::int64_t dtype_bytes(const Deck& d);
// run.check: "reference" (cp=1 on rank 0), "cross" (the strategies against each other, shard by
// shard) or "off".
enum class CheckMode { Reference, Cross, Off };
CheckMode check_mode(const Deck& d);

std::int64_t mamba_param_count(const model::Mamba2Config& c);

// Terms the drivers' models share (beside acc_bytes, core/memory_parts.hpp): ceil(a / b), sequences of the deck's
// layout, bytes of a state-passing state value (fp32 for bf16), whether the host kernels widen bf16
// operands into fp32 copies (bf16 on CPU ranks). The strategies' own terms are in their records
// (cp::attention_work_bytes / attention_kernel_elements, model::MambaCpInfo).
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// What a size refusal opens with: where the first of `keys` given by a --set came from, else the
// first the deck gave (its line), else the deck's defaults; then `list`, the keys the sizes come from.
inline std::string sizes_where(const Deck& d, std::initializer_list<const char*> keys, const std::string& list) {
  for (const bool by_set : {true, false})
    for (const char* k : keys)
      if (d.has(k) && d.is_set(k) && (!by_set || d.where(k).rfind("--set ", 0) == 0)) return d.where(k) + ": " + list;
  return d.where(*keys.begin()) + ": " + list;
}
// sizes_where for a model of HybridConfig on one batch of data.seqlen/data.batch/data.seq_lens;
// `also` names further keys after those.
inline std::string hybrid_sizes_where(const Deck& d, const std::string& also) {
  return sizes_where(d, {"data.seqlen", "data.batch", "data.seq_lens", "model.hidden", "model.pattern"},
                     "data.seqlen/data.batch/data.seq_lens" + also + " and the model sizes");
}
std::int64_t sequences(const Deck& d);
// Per document: the most parameter-gradient sets a Mamba2 layer holds beside its whole documents'
// (one per block of ranks a rank's split documents run on; at least one).
std::int64_t split_gradient_sets(const cp::DocPartition& docs);
std::int64_t state_bytes(const Deck& d);
bool host_bf16(const Deck& d);

// ---- the drivers' models -----------------------------------------------------------------------------
MemoryModel attention_memory(const Deck& d, int cp, const std::string& strategy);
MemoryModel mamba_memory(const Deck& d, int cp, const std::string& strategy);
// cp_hybrid: one forward+backward step of the model at EP size ep, each attention layer by its strategy.
MemoryModel hybrid_memory(const Deck& d, const model::HybridConfig& h, int cp, int ep);
// train_hybrid: the step's tokens, master weights, AdamW moments, the replica on rank 0.
MemoryModel train_memory(const Deck& d, const model::HybridConfig& h, int cp, int ep);
// The hybrid stack's activations and step buffers per rank (shared by cp_hybrid and train_hybrid);
// each attention layer's buffers by its own strategy (HybridConfig::attention_layer).
void add_hybrid_step(MemoryModel& m, const model::HybridConfig& h, int cp, int ep, std::int64_t tl, std::int64_t es,
                     Holder holder);
// A forward alone (HybridModel::forward, cp_generate's prefill): the largest block's tensors while it
// runs, the embedding output and the logits, one Mamba2 layer's state rows; `d` for the sequences
// and the dtypes.
void add_hybrid_forward(MemoryModel& m, const Deck& d, const model::HybridConfig& h, int cp, int ep, std::int64_t tl,
                        std::int64_t es, Holder holder);

}  // namespace hcp::drivers
