// The CP strategies of the two sequence-mixing layers and their deck names.
//   AttnStrategy (parallel.attention / parallel.strategy): p2p ring with DualChunkSwap, all-gather of
//     K/V, Ulysses all-to-all (src/cp/attention_cp.hpp).
//   MambaCp (parallel.mamba_cp):
//     hidden_parallel: all-to-all to every token / heads/cp heads and back (needs heads % cp == 0 and
//                      n_groups vs cp divisibility; src/model/mamba2.hpp);
//     state_passing:   each rank scans its own chunks from a zero state; conv halos and the chunks'
//                      final states are exchanged, the true initial states follow from a scan along
//                      each sequence and correct the outputs (any heads / n_groups; state_passing.hpp).
#pragma once
#include <string>

namespace hcp::cp {

enum class AttnStrategy { P2P, AllGather, A2A };
AttnStrategy attn_strategy_from_string(const std::string& s);  // "p2p" | "allgather" | "a2a"
std::string to_string(AttnStrategy s);

enum class MambaCp { HiddenParallel, StatePassing };
MambaCp mamba_cp_from_string(const std::string& s);  // "hidden_parallel" | "state_passing"
std::string to_string(MambaCp m);

}  // namespace hcp::cp
