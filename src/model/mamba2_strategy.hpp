// The Mamba2 CP strategies (cp::MambaCp), one record each: the deck name, a summary, and the parts
// the layer and the drivers read — the layer it builds (its shape rules in that layer's
// constructor) and its byte model. Deck choices, `all`, --list-strategies, the drivers' BYTES lines
// and the planner read this list; make_mamba2 and mamba_cp_model_bytes dispatch through it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/mamba2.hpp"

namespace hcp::model {

struct MambaCpInfo {
  MambaCp id;
  const char* name;     // deck name (parallel.mamba_cp)
  const char* summary;  // one line for --list-strategies
  std::unique_ptr<Mamba2Layer> (*make)(Communicator& cp_comm, Mamba2Config cfg, SeqLayout global, cp::Partition part);
  // Values rank `rank` of `cp` hands to the communicator in one forward and backward, from the sizes alone.
  std::int64_t (*model_bytes)(const Mamba2Config& c, const SeqLayout& global, int cp, int rank, DType dt,
                              cp::Partition part);
};
const std::vector<MambaCpInfo>& mamba_cps();
const MambaCpInfo& mamba_cp_info(MambaCp id);
std::vector<std::string> mamba_cp_names();  // in registry order
std::vector<MambaCp> mamba_cp_ids();
MambaCp mamba_cp_from_string(const std::string& s);
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

}  // namespace hcp::model
