#include "cp/strategy.hpp"

#include "core/error.hpp"

namespace hcp::cp {

AttnStrategy attn_strategy_from_string(const std::string& s) {
  if (s == "p2p") return AttnStrategy::P2P;
  if (s == "allgather") return AttnStrategy::AllGather;
  if (s == "a2a") return AttnStrategy::A2A;
  HCP_FAIL("unknown attention CP strategy '", s, "' (expected p2p, allgather or a2a)");
}
std::string to_string(AttnStrategy s) {
  switch (s) {
    case AttnStrategy::P2P: return "p2p";
    case AttnStrategy::AllGather: return "allgather";
    case AttnStrategy::A2A: return "a2a";
  }
  return "?";
}

MambaCp mamba_cp_from_string(const std::string& s) {
  if (s == "hidden_parallel") return MambaCp::HiddenParallel;
  if (s == "state_passing") return MambaCp::StatePassing;
  throw Error("mamba_cp '" + s + "' is not one of hidden_parallel, state_passing");
}
std::string to_string(MambaCp m) { return m == MambaCp::HiddenParallel ? "hidden_parallel" : "state_passing"; }

}  // namespace hcp::cp
