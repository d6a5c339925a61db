// The CP strategies of the two sequence-mixing layers, one record each: the deck name, what it is,
// and what shapes it needs. Deck choices, `all` and the drivers' --list-strategies read these lists.
//   Attention (parallel.attention; src/cp/attention_cp.hpp):
//     p2p        ring of K/V with DualChunkSwap;
//     allgather  all-gather of K/V, reduce-scatter of dK/dV;
//     a2a        Ulysses: all-to-all from sequence to head shards and back (heads % cp == 0);
//     a2a+p2p    Ulysses over the inner group (parallel.cp_inner ranks, a node), ring p2p over the
//                outer group with heads / inner per rank (heads % inner == 0).
//   Mamba (parallel.mamba_cp):
//     hidden_parallel: all-to-all to every token / heads/cp heads and back (needs heads % cp == 0 and
//                      n_groups vs cp divisibility; src/model/mamba2.hpp);
//     state_passing:   each rank scans its own chunks from a zero state; conv halos and the chunks'
//                      final states are exchanged, the true initial states follow from a scan along
//                      each sequence and correct the outputs (any heads / n_groups; state_passing.hpp).
#pragma once
#include <string>
#include <vector>

namespace hcp::cp {

enum class AttnStrategy { P2P, AllGather, A2A, A2AP2P };
enum class MambaCp { HiddenParallel, StatePassing };

struct AttnStrategyInfo {
  AttnStrategy id;
  const char* name;     // deck name
  const char* summary;  // one line for --list-strategies
};
struct MambaCpInfo {
  MambaCp id;
  const char* name;
  const char* summary;
};
const std::vector<AttnStrategyInfo>& attn_strategies();
const std::vector<MambaCpInfo>& mamba_cps();
std::vector<std::string> attn_strategy_names();  // in registry order
std::vector<std::string> mamba_cp_names();

AttnStrategy attn_strategy_from_string(const std::string& s);
std::string to_string(AttnStrategy s);
MambaCp mamba_cp_from_string(const std::string& s);
std::string to_string(MambaCp m);

}  // namespace hcp::cp
