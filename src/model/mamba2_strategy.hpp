// The Mamba2 CP strategies (cp::MambaCp), one record each: the deck name, a summary, and the parts
// the layer and the drivers read — the layer it builds (its shape rules in that layer's
// constructor), its byte model and its memory terms. Deck choices, `all`, --list-strategies, the drivers' BYTES lines
// and the planner read this list; make_mamba2 and mamba_cp_model_bytes dispatch through it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/mamba2.hpp"

namespace hcp::model {

// State passing's per-sequence state rows (H (P N + 1) values each, in the scan dtype) per rank:
// saved per Mamba2 layer, and held while one layer runs.
struct StateRows {
  std::int64_t saved = 0, work = 0, row = 0;
};

struct MambaCpInfo {
  MambaCp id;
  const char* name;     // deck name (parallel.mamba_cp)
  const char* summary;  // one line for --list-strategies
  std::unique_ptr<Mamba2Layer> (*make)(Communicator& cp_comm, Mamba2Config cfg, SeqLayout global, cp::Partition part);
  // Values rank `rank` of `cp` hands to the communicator in one forward and backward, from the sizes alone.
  std::int64_t (*model_bytes)(const Mamba2Config& c, const SeqLayout& global, int cp, int rank, DType dt,
                              cp::Partition part);
  // ... of them in the forward alone (a prefill).
  std::int64_t (*model_fwd_bytes)(const Mamba2Config& c, const SeqLayout& global, int cp, int rank, DType dt,
                                  cp::Partition part);
  // Its memory terms, in elements of the layer's dtype per local token: what the mixer keeps for its
  // backward (saved_per_token) and what its step adds beyond its input and output at `cp` ranks
  // (work_per_token); and its per-sequence state rows for `sequences` sequences (null: none).
  std::int64_t (*saved_per_token)(const Mamba2Config& c);
  std::int64_t (*work_per_token)(const Mamba2Config& c, int cp);
  // ... and a forward alone (a prefill, which drops the saved tensors after the layer): what the
  // forward allocates beyond its input and output while it runs, the saved tensors included, with
  // `scan` the SSD kernel's own work per token (it depends on the backend).
  std::int64_t (*fwd_per_token)(const Mamba2Config& c, int cp, std::int64_t scan);
  StateRows (*state_rows)(const Mamba2Config& c, int cp, std::int64_t sequences);
  // Its messages per rank in one forward plus backward on `cp` >= 2 ranks, `scan` the state
  // exchange state passing runs (resolved): the latency terms of the planner's time model.
  std::int64_t (*messages)(int cp, cp::StateExchange scan);
};
const std::vector<MambaCpInfo>& mamba_cps();
const MambaCpInfo& mamba_cp_info(MambaCp id);
std::vector<std::string> mamba_cp_names();  // in registry order
std::vector<MambaCp> mamba_cp_ids();
// The state scan state passing runs on each CP part of `placement` (mamba.state_scan, auto resolved
// on the part's layout and block size): the distinct choices joined by "+", "none" when no part
// crosses ranks.
std::string state_scan_of(const Mamba2Config& c, const cp::Placement& placement);
// Strategy `s`'s messages per layer on the rank that sends the most: its record's count on each CP
// part that rank joins, summed.
std::int64_t mamba_messages_of(const MambaCpInfo& s, const Mamba2Config& c, const cp::Placement& placement);
MambaCp mamba_cp_from_string(const std::string& s);
// The unsharded mixer's step elements per token beyond its input and output (the cp = 1 reference).
std::int64_t mamba_local_work_per_token(const Mamba2Config& c);
std::string to_string(MambaCp m);

// The strategies' parts the records name (src/model/mamba2.cpp).
std::unique_ptr<Mamba2Layer> make_hidden_parallel(Communicator& cp_comm, Mamba2Config cfg, SeqLayout global,
                                                  cp::Partition part);
std::unique_ptr<Mamba2Layer> make_state_passing(Communicator& cp_comm, Mamba2Config cfg, SeqLayout global,
                                                cp::Partition part);
std::int64_t hidden_parallel_model_bytes(const Mamba2Config& c, const SeqLayout& global, int cp, int rank, DType dt,
                                         cp::Partition part);
std::int64_t state_passing_model_bytes(const Mamba2Config& c, const SeqLayout& global, int cp, int rank, DType dt,
                                       cp::Partition part);
std::int64_t hidden_parallel_model_fwd_bytes(const Mamba2Config& c, const SeqLayout& global, int cp, int rank, DType dt,
                                             cp::Partition part);
std::int64_t state_passing_model_fwd_bytes(const Mamba2Config& c, const SeqLayout& global, int cp, int rank, DType dt,
                                           cp::Partition part);
// ... and their memory terms (src/model/mamba2_strategy.cpp).
std::int64_t hidden_parallel_saved_per_token(const Mamba2Config& c);
std::int64_t hidden_parallel_work_per_token(const Mamba2Config& c, int cp);
std::int64_t hidden_parallel_fwd_per_token(const Mamba2Config& c, int cp, std::int64_t scan);
std::int64_t state_passing_saved_per_token(const Mamba2Config& c);
std::int64_t state_passing_work_per_token(const Mamba2Config& c, int cp);
std::int64_t state_passing_fwd_per_token(const Mamba2Config& c, int cp, std::int64_t scan);
StateRows state_passing_rows(const Mamba2Config& c, int cp, std::int64_t sequences);
std::int64_t hidden_parallel_messages(int cp, cp::StateExchange scan);
std::int64_t state_passing_messages(int cp, cp::StateExchange scan);

}  // namespace hcp::model
