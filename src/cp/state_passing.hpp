// SSM state-passing context parallelism: the index maths and communication that let every rank
// scan its own chunks of each sequence and exchange only states (no all-to-all of activations).
//   * Pieces: the runs of consecutive tokens of one sequence that a rank holds (DualChunkSwap: two
//     per sequence, chunks r and 2cp-1-r of 2cp; Contiguous: one, chunk r of cp).
//   * ConvHalo: the causal conv1d of a piece needs the w-1 tokens before it in its sequence, owned
//     by other ranks (or several, when chunks are shorter than w-1). gather() builds an extended
//     buffer [halo | piece] per piece; scatter_back() returns the halo rows' gradients to their
//     owners, added into their local rows. Never across sequence boundaries.
//   * StateScan: the exclusive scan S_in(k) = a_(k-1) S_in(k-1) + S_(k-1) along each sequence
//     (S_in(0) = 0) of every piece's zero-state final state S_k and total decay a_k, and its reverse
//     for dS_in. The pairs (a, S) are affine maps that compose associatively
//     ((a1,S1) then (a2,S2) = (a2 a1, a2 S1 + S2)), so the scan runs by recursive doubling over the
//     piece order: ceil(log2 K) rounds (K pieces a sequence) in which piece k receives the composite
//     of the pieces before it from the owner of piece k - 2^r, then one shift; per rank
//     O(log cp) states instead of the all-gather's (cp - 1) per piece. StateExchange::AllGather
//     keeps the all-gather of every (S, a) and one scan on every rank, for comparison.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/seq_layout.hpp"
#include "core/tensor.hpp"
#include "cp/layout.hpp"

namespace hcp::cp {

struct Piece {
  std::int64_t seq = 0;      // sequence (BSHD row or THD packed sequence)
  std::int64_t chunk = 0;    // index of this run among the sequence's chunks, in sequence order
  std::int64_t nchunks = 1;  // chunks per sequence (2cp for DCS, cp for Contiguous)
  int rank = 0;              // owner
  std::int64_t lrow = 0;     // first row in the owner's local tensor
  std::int64_t gstart = 0;   // first token in the global token order
  std::int64_t len = 0;      // tokens
};

// The pieces of `rank`, in local row order (equal count on every rank).
std::vector<Piece> local_pieces(const SeqLayout& global, int cp, int rank, Partition part = Partition::DCS);

class ConvHalo {
 public:
  ConvHalo() = default;
  // `halo` = conv width - 1.
  ConvHalo(const SeqLayout& global, int cp, int rank, Partition part, std::int64_t halo);
  std::int64_t halo() const { return halo_; }
  std::int64_t ext_rows() const { return static_cast<std::int64_t>(ext_seq_.size()); }
  // Piece index of every extended row (conv1d's seq_idx: pieces never mix).
  const std::vector<std::int64_t>& ext_seq() const { return ext_seq_; }
  // First extended row of piece i (its halo; the piece's own rows start `halo` later).
  std::int64_t ext_start(std::size_t i) const { return ext_start_[i]; }
  // local [Tl, C] -> extended [E, C]: per piece, `halo` rows before it (zero before the sequence
  // start) and then its own rows.
  Tensor gather(Communicator& comm, const Tensor& local) const;
  // Extended [E, C] -> local [Tl, C]: the piece rows (copy; halo rows dropped).
  Tensor own_rows(const Tensor& ext) const;
  // Local [Tl, C] -> extended [E, C] with zero halo rows (the adjoint of own_rows).
  Tensor expand(const Tensor& local) const;
  // Backward of gather(): piece rows of `dext` plus every halo row's gradient sent back to its
  // owner and added into its local row.
  Tensor scatter_back(Communicator& comm, const Tensor& dext) const;
  // Rows this rank sends to other ranks per gather() (the same come back in scatter_back()).
  std::int64_t remote_rows_sent() const;

 private:
  std::int64_t halo_ = 0, tl_ = 0;
  int cp_ = 1, rank_ = 0;
  std::vector<Piece> pieces_;
  std::vector<std::int64_t> ext_seq_, ext_start_;
  std::vector<std::vector<std::int64_t>> send_rows_;  // per destination: my local rows, in its order
  std::vector<std::vector<std::int64_t>> recv_rows_;  // per source: my extended rows, in that order
  std::vector<std::int64_t> own_ext_, own_local_;     // piece rows: extended row <-> local row
};

// Total rows moved between different ranks by one ConvHalo::gather() over the whole CP group,
// counted chunk by chunk (the cost model the measured bytes are checked against).
std::int64_t model_halo_rows(const SeqLayout& global, int cp, Partition part, std::int64_t halo);
// Rows rank `rank` sends per forward and backward: its own rows to the ranks whose chunks need them
// (gather), plus the gradients of the halo rows it received, back to their owners (scatter_back).
// Summed over ranks this is 2 * model_halo_rows. `forward_only`: the gather's rows alone.
std::int64_t model_halo_rows_sent(const SeqLayout& global, int cp, Partition part, std::int64_t halo, int rank,
                                  bool forward_only = false);

// Precision of the state scan for a layer of dtype `layer`: fp32 for bf16 (states are widened for the
// exchange and the scan, and rounded once after), else the layer's own.
inline DType state_scan_dtype(DType layer) { return acc_dtype(layer); }

// Auto: the one that sends fewer bytes per rank (max over ranks) on this layout: the all-gather at
// small cp (doubling sends about 4 (log2(2cp) + 1) states per sequence and rank, the all-gather
// 4 (cp - 1)), doubling from cp of about 6 up.
enum class StateExchange { Auto, Doubling, AllGather };
StateExchange state_exchange_from_string(const std::string& s);  // "auto" | "doubling" | "allgather"
std::string to_string(StateExchange e);
// Auto resolved for states of `pn` values a head (the two counts' ratio depends on it slightly).
StateExchange resolve_state_exchange(const SeqLayout& global, int cp, Partition part, StateExchange e, std::int64_t pn);

// Elements (of the scan's dtype) rank `rank` sends per forward + backward step for states of
// `heads` x `pn` values per piece: all-gather (cp-1) np (2 pn + 1) heads; doubling, for every round
// and shift, the pieces whose partner piece lives on another rank (pn + 1, or pn for the shifts).
// `forward_only`: the forward scan alone (all-gather: states and decays, pn + 1 per piece; doubling:
// the rounds towards later chunks and the forward shift).
std::int64_t model_state_elements_sent(const SeqLayout& global, int cp, int rank, Partition part, StateExchange e,
                                       std::int64_t heads, std::int64_t pn, bool forward_only = false);

class StateScan {
 public:
  StateScan() = default;
  // `pn`: values of a state per head, for resolving StateExchange::Auto.
  StateScan(const SeqLayout& global, int cp, int rank, Partition part, StateExchange how = StateExchange::Auto,
            std::int64_t pn = 64);
  // S_local [np, H, P, N] zero-state final states of this rank's pieces, a_local [np, H] their
  // decays -> S_in [np, H, P, N], the true state entering each piece. Saves what backward needs.
  Tensor forward(Communicator& comm, const Tensor& S_local, const Tensor& a_local);
  // dS_in [np, H, P, N] -> dS_local (gradient of each piece's final state) and da_local [np, H].
  void backward(Communicator& comm, Tensor& dS_local, Tensor& da_local, const Tensor& dS_in) const;
  // Drops what forward keeps for backward (a forward that no backward follows).
  void release() { a_ = Sin_ = S_all_ = a_all_ = Sin_all_ = Tensor(); }

 private:
  // One exchange of the doubling scan: piece i of a rank sends its row to the piece `delta` places
  // later in its sequence (earlier for delta < 0); rows grouped by peer rank in ascending order,
  // within a peer by (sequence, position), the same order on both sides; same-rank pairs are copied.
  struct Route {
    std::vector<std::int64_t> send_rows, recv_rows, self_src, self_dst;
    std::vector<std::int64_t> send_counts, recv_counts;  // pieces per peer rank
  };
  Route route(std::int64_t delta) const;
  // Rows of `src` [np, ...] moved along `r`: row i of the result holds what piece i received, and
  // `init`'s row (zeros when null) where it receives nothing.
  Tensor exchange(Communicator& comm, const Route& r, const Tensor& src, const Tensor* init) const;
  // The doubling rounds on the maps (A, B), in place.
  void compose_rounds(Communicator& comm, const std::vector<Route>& rounds, Tensor& A, Tensor& B) const;
  Tensor doubling_forward(Communicator& comm, const Tensor& S_local, const Tensor& a_local);
  void doubling_backward(Communicator& comm, Tensor& dS_local, Tensor& da_local, const Tensor& dS_in) const;

  StateExchange how_ = StateExchange::Doubling;
  std::vector<std::int64_t> pos_, seq_;  // this rank's pieces: position in the sequence, sequence
  std::int64_t K_ = 1;                   // pieces per sequence
  std::vector<Route> fwd_rounds_, bwd_rounds_;
  Route fwd_shift_, bwd_shift_;
  Tensor a_, Sin_;  // this rank's decays and incoming states (doubling), for backward
  int cp_ = 1, rank_ = 0;
  std::int64_t np_ = 0;
  // Gathered slot (rank * np + i) of chunk k of sequence s: slot_[s][k].
  std::vector<std::vector<std::int64_t>> slot_;
  std::vector<std::int64_t> order_, off_;  // slot_ flattened: the scan kernels' run order and offsets
  Tensor S_all_, a_all_, Sin_all_;         // [cp*np, H, P, N], [cp*np, H], [cp*np, H, P, N]
};

}  // namespace hcp::cp
