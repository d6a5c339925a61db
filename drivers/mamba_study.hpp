// cp_mamba's study: one Mamba2 mixer problem and its cp=1 reference, set up once, then each CP
// strategy checked against it, with its bytes against the strategy's cost model.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cp/layout.hpp"
#include "model/mamba2.hpp"
#include "model/mamba2_strategy.hpp"
#include "study.hpp"

namespace hcp::drivers {

// One problem of cp_mamba at `cp` ranks: the placement, the layer sizes and the dtype.
struct MambaSetup {
  int cp = 1;
  cp::Placement placement;  // DualChunkSwap, or data.partition = documents
  model::Mamba2Config cfg;
  DType dt = DType::F64;
  const SeqLayout& global() const { return placement.global; }
  std::unique_ptr<model::Mamba2Layer> make(cp::MambaCp strat, Communicator& c) const {
    return model::make_mamba2(strat, c, cfg, placement);
  }
};
MambaSetup mamba_setup(const Deck& d, int cp);

// One study of cp_mamba: the problem and its cp=1 reference (set up once), then each strategy.
class MambaStudy {
 public:
  explicit MambaStudy(Study& st) : st_(st), s_(mamba_setup(st.deck, st.cp)) {}
  void setup(const std::vector<std::string>& names, const Skipped& skipped);
  bool run_case(const std::string& name, std::vector<std::string>& row);
  void notes() const;

 private:
  // This rank's bytes per step and its model, checked on every rank (and the halos over all ranks
  // against their chunk-by-chunk total); the halo line into notes_.
  Study::BytesCheck check_bytes(const std::string& name, cp::MambaCp strat);
  Study& st_;
  const MambaSetup s_;
  std::vector<std::string> names_;
  model::ParamMap p_, pd_;  // parameters: host, and in the run's space
  Tensor hl_, dyl_;         // this rank's input and output gradient
  Tensor ry_, rdh_;         // the cp=1 reference's output and input gradient (rank 0)
  model::ParamMap rg_;      // and its parameter gradients
  std::vector<std::string> notes_;
  std::map<std::string, std::string> halo_note_;  // state passing: the halo bytes line
  std::vector<std::int64_t> moved_;               // bytes per rank of each case
};

}  // namespace hcp::drivers
