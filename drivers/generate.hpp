// cp_generate's parts: the [generate] keys, one generation (prefill, hand-off, decode steps, token
// choice), the cp = 1 teacher-forcing reference, and the memory and byte models of a generation.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "byte_model.hpp"
#include "comm/communicator.hpp"
#include "core/phase_times.hpp"
#include "hybrid_common.hpp"
#include "memory_model.hpp"
#include "model/decode.hpp"
#include "model/hybrid.hpp"

namespace hcp::drivers {

struct GenerateConfig {
  std::int64_t new_tokens = 8;
  std::string sampling = "greedy";  // greedy | sample
  double temperature = 1.0;
  std::uint64_t seed = 1;
};
void add_generate_keys(DeckSchema& s);
GenerateConfig generate_config(const Deck& d);

// The next token of each sequence from its logits [nseq, V] (host): the largest (the first of
// equal ones), or drawn from softmax(logits / temperature) with a uniform that is a pure function of
// (seed, sequence, step), so every rank and the cp = 1 reference draw alike.
std::vector<std::int64_t> choose_tokens(const Tensor& logits, const GenerateConfig& g, std::int64_t step);

struct Generated {
  std::vector<std::vector<std::int64_t>> ids;               // [nseq][new_tokens]
  std::vector<Tensor> logits;                               // per generated token, [nseq, V] host
  std::int64_t prefill_bytes = 0, decode_bytes = 0;         // this rank's, all decode steps together
  std::int64_t decode_collective_bytes = 0;                 // of decode_bytes, the all-reduces and all-gathers
  std::map<char, std::int64_t> prefill_kind_bytes;          // of prefill_bytes, by block kind (M, *, E, -)
  std::int64_t mamba_bytes = 0, kv_bytes = 0, kv_rows = 0;  // the hand-off this rank holds
  std::vector<std::int64_t> flat_ids() const;
  // The decode steps run: every generated token but the first, which the prefill's logits give.
  std::int64_t decode_steps() const { return std::max<std::int64_t>(static_cast<std::int64_t>(logits.size()) - 1, 0); }
};
// Prefill of `tokens` (this rank's rows of the model's placement) with the hand-off kept, then
// g.new_tokens tokens per sequence: the first from the prefill's last logits, each further one from
// a decode step. `laps` (when given) gets prefill, handoff and decode. `labels`: the rows' labels
// (only the prefill's loss reads them; empty: none).
Generated generate(Communicator& comm, model::HybridModel& m, const model::ParamMap& p,
                   const std::vector<std::int64_t>& tokens, const GenerateConfig& g, PhaseTimes* laps,
                   const std::vector<std::int64_t>& labels = {});

// The prompts' real tokens per sequence, from a padded batch; all of them in one list; the THD
// layout of `seqs` unpadded.
std::vector<std::vector<std::int64_t>> prompts_of(const TokenBatch& b);
std::vector<std::int64_t> concat(const std::vector<std::vector<std::int64_t>>& seqs);
SeqLayout unpadded_thd(const std::vector<std::vector<std::int64_t>>& seqs);

// cp = 1 (on `self`) over each prompt followed by its generated tokens but the last: the logits
// that predict each generated token, [new_tokens, nseq, V] host.
Tensor teacher_forced_logits(Communicator& self, const model::HybridConfig& c1, const model::ParamMap& p1,
                             const std::vector<std::vector<std::int64_t>>& prompts, const Generated& got);

// What a rank sends per decode step in its all-reduces and all-gathers (the byte model of the
// decode's own exchanges; the MoE layers' expert-parallel dispatch depends on the routing and is not
// part of it), counted as the communicator counts them: per Mamba2 layer the all-reduce of the
// per-head outputs [nseq, d_inner], per MoE layer that of the outputs [nseq, hidden], per attention
// layer the all-gathers of the partial outputs [nseq, H, D] and their log-sum-exps [nseq, H].
std::int64_t decode_model_bytes(const model::HybridConfig& h, int cp, std::int64_t nseq, DType dt);
// What this rank (`rank` of the model's placement) sends in a forward by block kind, from the
// strategies' forward models: '*' the attention layers', 'M' the Mamba2 layers'. The MoE layers'
// dispatch depends on the routing and has no entry.
std::map<char, std::int64_t> prefill_model_bytes(const model::HybridModel& m, int rank, DType dt);
// Whether this rank's generation `got` sent what the models say: the decode's all-reduces and
// all-gathers (decode_model_bytes per step) and the prefill's blocks of each kind in `prefill`
// (prefill_model_bytes). Each mismatch is printed as a '#' line naming `name` and the rank.
bool bytes_match_models(const std::string& name, const Generated& got, const model::HybridModel& m, int rank, int cp,
                        DType dt, const std::map<char, std::int64_t>& prefill);

// Whether every rank of `comm` holds the same ids. Collective.
bool ranks_agree(Communicator& comm, const std::vector<std::int64_t>& ids);

// The largest of each figure over the CP group, and this rank's decode bytes per token.
struct GenerateBytes {
  double prefill_max = 0, decode_max = 0, handoff_max = 0, decode_per_token = 0;
};
GenerateBytes generate_bytes_sent(Communicator& comm, const Generated& got);
// /generate/<name>/: ids, with a check the logits errors `errs` (rank 0's), and per rank the bytes
// (the prefill's by block kind and `model`, prefill_model_bytes), the hand-off and the cached
// tokens. Collective.
void write_generation(ResultsWriter& w, const std::string& name, const Generated& got, const GenerateBytes& b,
                      bool check, const std::vector<double>& errs, const std::map<char, std::int64_t>& model);

// The hand-off one rank holds: the attention KV shards at their allocated size (this rank's prompt
// rows and, per sequence, its share of the new tokens by the append rule), and the Mamba2 windows
// and states of the strategy (hidden parallel: its heads of every sequence; state passing: every
// head of the sequences ending on it, at most all of them). Bytes of the rank that holds the most.
std::int64_t handoff_bytes(const Deck& d, const model::HybridConfig& h, int cp);
// The prefill (a forward of the model: bounded by the training step's model) and the hand-off.
MemoryModel generate_memory(const Deck& d, const model::HybridConfig& h, int cp, int ep);
// The prefill's attention and Mamba2 bytes per rank (forward only), by strategy, for --dry-run.
LayerBytes generate_bytes(const Deck& d, const model::HybridConfig& h, int cp);

}  // namespace hcp::drivers
