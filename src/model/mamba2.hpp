// Mamba2 mixer layer, forward and backward, under context parallelism. Hidden parallel (Mamba2HP):
//   in_proj (local tokens) -> cp2hp all-to-all of x, B, C, dt (heads/cp heads per rank, B/C groups
//   split or repeated) -> causal conv1d + SiLU (sliced weights) -> SSD scan (sliced A_log, D,
//   dt_bias; seq_idx from the global padded cu_seqlens) -> hp2cp -> gated group RMSNorm with the
//   local z -> out_proj.
// The gate z never leaves its rank: y * silu(z) is applied after hp2cp inside the gated norm,
// which is the same function and saves the all-to-all of z (d_inner values per token) each way.
// State passing (Mamba2SP): no all-to-all; conv halos and per-chunk SSM states move instead.
// With cp = 1 either is the plain layer.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "core/phase_times.hpp"
#include "core/seq_layout.hpp"
#include "core/tensor.hpp"
#include "cp/documents.hpp"
#include "cp/hidden_parallel.hpp"
#include "cp/layout.hpp"
#include "cp/placement.hpp"
#include "cp/state_passing.hpp"
#include "cp/strategy.hpp"
#include "kernels/kernels.hpp"

namespace hcp::model {

struct Mamba2Config {
  std::int64_t hidden = 64, heads = 4, head_dim = 16, groups = 2, d_state = 16, conv = 4, chunk = 128;
  double eps = 1e-5;
  // State passing: how the pieces' states are scanned across ranks (cp/state_passing.hpp).
  cp::StateExchange state_exchange = cp::StateExchange::Auto;
  std::int64_t d_inner() const { return heads * head_dim; }
  std::int64_t conv_dim() const { return d_inner() + 2 * groups * d_state; }
  std::int64_t d_in_proj() const { return 2 * d_inner() + 2 * groups * d_state + heads; }
  // Hidden parallel: how many copies of each B/C group the ranks hold (cp / groups when groups < cp).
  std::int64_t group_repeat(int cp) const { return groups < cp ? cp / groups : 1; }
};

// Parameters (full size on every rank) and their gradients, by name:
// in_proj [d_in_proj, hidden], conv_w [conv_dim, conv], conv_b [conv_dim], A_log [H], D [H],
// dt_bias [H], norm_w [d_inner], out_proj [hidden, d_inner].
using ParamMap = std::map<std::string, Tensor>;
// One parameter of a layer: name, shape and the uniform range of its initial values. A layer's list
// is the one source of its parameters' names (initialisation, checkpoints, run.save's check).
struct ParamSpec {
  ParamSpec(std::string n, Shape s, double l, double h, std::uint64_t off = 0, bool rows = false)
      : name(std::move(n)), shape(std::move(s)), lo(l), hi(h), seed_offset(off), expert_rows(rows) {}
  std::string name;
  Shape shape;
  double lo = 0, hi = 0;
  std::uint64_t seed_offset = 0;  // added to the layer's seed
  bool expert_rows = false;       // dim 0 is the expert: a rank makes only its experts' rows
  std::string seed_name;          // the name its values are drawn under ("": `name`)
};
struct RowRange {  // rows [first, first + rows) of dim 0 (rows < 0: all of them)
  std::int64_t first = 0, rows = -1;
};
// The parameters of `specs` (expert_rows ones: only the rows `experts`), each as init_param makes it.
ParamMap init_params(const std::vector<ParamSpec>& specs, DType dt, std::uint64_t seed, RowRange experts = {});
std::vector<ParamSpec> mamba2_params(const Mamba2Config& c);
ParamMap mamba2_init(const Mamba2Config& c, DType dt, std::uint64_t seed);
ParamMap zeros_like(const ParamMap& p);

// How a Mamba2 layer runs under CP: cp::MambaCp (src/cp/strategy.hpp).
using cp::MambaCp;

// What a Mamba2 layer hands from a prefill to decode on one rank: for the sequences `seqs` it
// decodes, the last W-1 conv inputs before each sequence's end (its last real token; pads are not
// part of it) and the SSM state after that token, of the heads and B/C groups of `share`. Hidden
// parallel: every sequence, the heads the rank owned in the prefill; state passing: every head of
// the sequences whose last real token the rank holds. Nothing moves between ranks.
struct MambaCarry {
  std::vector<std::int64_t> seqs;  // sequence indices of the prefill's layout, ascending
  cp::HpShare share;               // heads [h0, h0 + hl), B/C groups [g0, g0 + gl)
  Tensor wx, wB, wC;               // windows [ns, W-1, hl*P] / [ns, W-1, gl*N], oldest row first
  Tensor state;                    // [ns, hl, P, N] in acc_dtype (fp32 for bf16)
  std::int64_t bytes() const;      // what the rank holds
};

// The strategy-independent parts of a Mamba2 mixer on local tokens: in_proj, the gated group
// RMSNorm and out_proj, the parameter all-reduce, and the time of each phase.
class Mamba2Layer {
 public:
  virtual ~Mamba2Layer() = default;
  // h, y local [Tl, hidden] in the partition's order.
  virtual void forward(Tensor& y, const Tensor& h, const ParamMap& p) = 0;
  // dh local; parameter gradients summed over the CP group into `grads` (overwritten).
  virtual void backward(Tensor& dh, ParamMap& grads, const Tensor& dy, const ParamMap& p) = 0;
  virtual MambaCp strategy() const = 0;
  // Drops what the forward kept for a backward (a prefill: none follows); the carry stays.
  virtual void drop_saved() { h_ = zxbcdt_ = z_ = yl_ = rstd_ = Tensor(); }
  // Milliseconds per phase (fwd/<phase>, bwd/<phase>), summed since the last reset (GPU: CUDA events).
  virtual const std::map<std::string, double>& phase_ms() const { return phases_.totals(); }
  virtual const std::map<std::string, PhaseTimes::Peak>& phase_peaks() const { return phases_.peaks(); }
  virtual void reset_phases() { phases_.reset(); }
  // With `on`, the next forward also makes the decode hand-off (carry()); the layer's layout must be
  // DualChunkSwap (a per-document placement throws). Off: drops the last one.
  void keep_carry(bool on) {
    keep_carry_ = on;
    if (!on) carry_ = MambaCarry{};
  }
  const MambaCarry& carry() const { return carry_; }

 protected:
  Mamba2Layer(Communicator& comm, Mamba2Config cfg, SeqLayout global, cp::Partition part);
  // A layer made of others: no layout of its own (checks n_groups | heads, as every layer does).
  Mamba2Layer(Communicator& comm, Mamba2Config cfg);
  // in_proj of the local tokens into zxbcdt_ (saves h_).
  void in_proj_fwd(const Tensor& h, const ParamMap& p);
  // Keeps only z of the in_proj output (for the gated norm), once the rest has been copied on:
  // the x, B, C and dt columns are not held through the step twice.
  void keep_only_z();
  // z [Tl, d_inner]: its own tensor after keep_only_z, else columns of zxbcdt_.
  Tensor z() const;
  // Gated group RMSNorm of yl [Tl, d_inner] with the local z, then out_proj into y. The norm's
  // output is not kept: the backward computes it again from yl, z and norm_w.
  void out_fwd(Tensor& y, const Tensor& yl, const ParamMap& p);
  // Backward of out_fwd: grads of out_proj and norm_w; returns dyl, writes dz.
  Tensor out_bwd(Tensor& dz, ParamMap& grads, const Tensor& dy, const ParamMap& p);
  // Backward of in_proj from the assembled dzxbcdt; all-reduce of every parameter gradient.
  void in_proj_bwd(Tensor& dh, ParamMap& grads, const Tensor& dzxbcdt, const ParamMap& p);
  // Runs f and adds its time to phase `name` (PhaseTimes).
  template <class F>
  void timed(const std::string& name, F&& f);

  Communicator& comm_;
  Mamba2Config c_;
  SeqLayout global_;
  cp::Partition part_ = cp::Partition::DCS;
  int cp_ = 1, rank_ = 0;
  std::int64_t tl_ = 0;
  Tensor h_, zxbcdt_, z_, yl_, rstd_;  // saved by forward
  PhaseTimes phases_;
  bool keep_carry_ = false;
  MambaCarry carry_;
};

class Mamba2HP : public Mamba2Layer {
 public:
  // Checks heads % cp, groups vs cp (n_groups % cp == 0, or cp % n_groups == 0 to repeat groups)
  // and the DCS divisibility of `global` (BSHD rows or THD packed sequences).
  // `part`: how the tokens arrive (DCS between layers; Contiguous as a plain all-gather attention
  // layer would leave them).
  Mamba2HP(Communicator& cp_comm, Mamba2Config cfg, SeqLayout global, cp::Partition part = cp::Partition::DCS);
  void forward(Tensor& y, const Tensor& h, const ParamMap& p) override;
  void backward(Tensor& dh, ParamMap& grads, const Tensor& dy, const ParamMap& p) override;
  MambaCp strategy() const override { return MambaCp::HiddenParallel; }
  void drop_saved() override {
    Mamba2Layer::drop_saved();
    xpre_ = Bpre_ = Cpre_ = dt_ = xc_ = Bc_ = Cc_ = yh_ = Tensor();
  }

 private:
  void ssd_setup(kernels::SsdParams& sp, kernels::SsdInputs& in);  // this rank's SSD problem
  void make_carry();                                               // after the forward's SSD
  cp::HpShare share_;                                              // this rank's heads and groups
  std::vector<cp::HpSlice> slices_;                                // its parameter slices
  std::int64_t batch_ = 1, seqlen_ = 1;
  std::vector<std::int64_t> seq_idx_;  // empty for BSHD
  // saved by forward
  Tensor xpre_, Bpre_, Cpre_, dt_, xc_, Bc_, Cc_, yh_;
  Tensor final_;  // a prefill's final states from the forward's scan (unpadded BSHD), until make_carry
  ParamMap sl_;   // this rank's parameter slices
};

// State-passing CP (see MambaCp). Works for any heads and n_groups; the tokens keep the
// partition's layout throughout (no all-to-all).
class Mamba2SP : public Mamba2Layer {
 public:
  Mamba2SP(Communicator& cp_comm, Mamba2Config cfg, SeqLayout global, cp::Partition part = cp::Partition::DCS);
  void forward(Tensor& y, const Tensor& h, const ParamMap& p) override;
  void backward(Tensor& dh, ParamMap& grads, const Tensor& dy, const ParamMap& p) override;
  MambaCp strategy() const override { return MambaCp::StatePassing; }
  void drop_saved() override {
    Mamba2Layer::drop_saved();
    ext_ = xl_ = Bl_ = Cl_ = dtl_ = S_in_ = Tensor();
    scan_.release();
  }

 private:
  // Consecutive pieces of one length on consecutive local rows: one batched SSD problem (a batch row
  // a piece). BSHD pieces all have one length, so a rank's pieces make one run.
  struct PieceRun {
    std::size_t first = 0, count = 0;  // pieces first .. first + count - 1
    std::int64_t row = 0, len = 0;     // first local row, tokens per piece
    std::int64_t rows() const { return static_cast<std::int64_t>(count) * len; }
  };
  // The SSD problem of a run over the local tensors (views of its rows).
  struct PieceIO {
    kernels::SsdParams sp;
    Tensor x, dt, B, C;
  };
  PieceIO piece_io(const PieceRun& r, const Tensor& x, const Tensor& dt, const Tensor& B, const Tensor& C) const;
  kernels::SsdInputs inputs(const PieceIO& io, const ParamMap& p, const Tensor* init) const;
  void make_carry(const ParamMap& p);  // after the forward's state correction
  std::vector<cp::Piece> pieces_;
  std::vector<PieceRun> runs_;       // every piece
  std::vector<PieceRun> cont_runs_;  // the pieces that continue a sequence (an incoming state)
  cp::ConvHalo halo_;
  cp::StateScan scan_;
  // saved by forward
  Tensor ext_, xl_, Bl_, Cl_, dtl_, S_in_;
};

// Packed documents placed by document (cp/documents.hpp): this rank's whole documents run as a
// cp = 1 problem of their own (no exchange; seq_idx and conv resets at their boundaries), the split
// documents by `strategy` over the CP group on the placement's split layout. The parameter
// gradients of the whole documents are summed over the group and added to the split part's.
class Mamba2Docs : public Mamba2Layer {
 public:
  Mamba2Docs(MambaCp strategy, Communicator& cp_comm, Mamba2Config cfg, cp::Placement placement);
  void forward(Tensor& y, const Tensor& h, const ParamMap& p) override;
  void backward(Tensor& dh, ParamMap& grads, const Tensor& dy, const ParamMap& p) override;
  MambaCp strategy() const override { return strategy_; }
  void drop_saved() override;
  // The parts' phases together (times summed, high-waters the larger).
  const std::map<std::string, double>& phase_ms() const override;
  const std::map<std::string, PhaseTimes::Peak>& phase_peaks() const override;
  void reset_phases() override;

 private:
  MambaCp strategy_;
  cp::Placement placement_;  // per document
  std::unique_ptr<Mamba2Layer> whole_;
  struct Part {
    cp::CpPart at;
    std::unique_ptr<Mamba2Layer> layer;  // over the part's block of ranks; null: no document there
  };
  std::vector<Part> parts_;  // the split documents, one part per group size (Placement::cp_parts)
  std::int64_t whole_rows_ = 0;
  std::vector<const Mamba2Layer*> layers() const;  // whole_ and the parts' layers that exist
  mutable std::map<std::string, double> ms_;
  mutable std::map<std::string, PhaseTimes::Peak> peaks_;
};

// Bytes a strategy sends per rank and step (forward + backward), from the sizes alone:
//   hidden_parallel: the all-to-alls of x, B, C (G*N each, times the repeat factor), dt in, y out:
//                    (cp-1)/cp of the local tensors, forward and backward alike;
//   state_passing:   the all-gather of the pieces' states and decays (forward) and of the state
//                    gradients (backward): (cp-1) x pieces x H (2 P N + 1) values in the scan dtype,
//                    plus the conv halos this rank sends (cp::model_halo_rows_sent x conv channels).
// Logical payload handed to the communicator (what it counts), not wire bytes.
// `forward_only`: the forward's part alone (hidden parallel: half; state passing: the gathered halo
// rows and the forward state scan).
std::int64_t mamba_cp_model_bytes(MambaCp strategy, const Mamba2Config& c, const SeqLayout& global, int cp, int rank,
                                  DType dt, cp::Partition part = cp::Partition::DCS, bool forward_only = false);

std::unique_ptr<Mamba2Layer> make_mamba2(MambaCp strategy, Communicator& cp_comm, Mamba2Config cfg, SeqLayout global,
                                         cp::Partition part = cp::Partition::DCS);
// The layer on the batch placed by `placement`: DualChunkSwap of its layout, or per document
// (Mamba2Docs: the whole documents as local problems, the split ones over their blocks of ranks).
std::unique_ptr<Mamba2Layer> make_mamba2(MambaCp strategy, Communicator& cp_comm, Mamba2Config cfg,
                                         const cp::Placement& placement);
// The same on a batch placed by `placement`: its CP layout's bytes (none at cp = 1, or when every
// document is whole).
std::int64_t mamba_cp_model_bytes(MambaCp strategy, const Mamba2Config& c, const cp::Placement& placement, int rank,
                                  DType dt, bool forward_only = false);

}  // namespace hcp::model
