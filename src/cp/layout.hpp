// CP layout maths shared by every strategy: DualChunkSwap (DCS) partitioning of BSHD rows or THD
// packed sequences, its exact inverse, global positions, sequence packing and seq_idx.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/seq_layout.hpp"
#include "core/tensor.hpp"

namespace hcp::cp {

// How a CP group splits every sequence: DualChunkSwap (rank r keeps chunks r and 2cp-1-r of 2cp;
// the load-balanced layout every strategy uses between layers), or Contiguous (rank r keeps the
// r-th of cp equal pieces, as a plain all-gather attention layer leaves the tokens).
enum class Partition { DCS, Contiguous };

// The padding rule of the DCS layout, the one place it is written: a sequence of n tokens is padded
// at its end to 2*cp chunks of dcs_chunk_len tokens each.
inline std::int64_t dcs_chunk_len(std::int64_t n, int cp) { return (n + 2 * cp - 1) / (2 * cp); }
inline std::int64_t dcs_padded_len(std::int64_t n, int cp) { return dcs_chunk_len(n, cp) * 2 * cp; }

// At cp = 1 both partitions are the identity: every function below then takes any lengths (the
// unpadded problem, each sequence at its real length, runs as the cp=1 reference).
inline Partition effective_partition(Partition p, int cp) { return cp == 1 ? Partition::Contiguous : p; }

// Throws hcp::Error naming `what` unless every sequence length is a multiple of 2*cp (cp at cp = 1).
void require_dcs_divisible(const SeqLayout& global, int cp, const std::string& what, Partition part = Partition::DCS);

// Local layout of a CP rank: every sequence keeps len/cp tokens (cu_seqlens / cp).
SeqLayout local_layout(const SeqLayout& global, int cp, Partition part = Partition::DCS);

// Real (unpadded) tokens of sequence s on `rank`: always a prefix of its local rows, since pads sit at
// the end of the sequence and a rank's chunks are in increasing position order.
std::int64_t local_real(const SeqLayout& global, std::int64_t s, int cp, int rank, Partition part = Partition::DCS);
// Zeros the pad rows of a local [Tl, ...] tensor of `rank` (no-op for an unpadded layout).
void zero_pad_rows(Tensor& local, const SeqLayout& global, int cp, int rank, Partition part = Partition::DCS);
// Global rows of the real tokens (in order), and of the pads.
std::vector<std::int64_t> real_rows(const SeqLayout& global);
std::vector<std::int64_t> pad_rows(const SeqLayout& global);
// The rows `rows` of a [T, ...] tensor (host or device), as a new contiguous tensor.
Tensor take_rows(const Tensor& t, const std::vector<std::int64_t>& rows);

// For each local token of `rank` (in local order), its index in the global token order. Rank r
// keeps chunks r and 2cp-1-r (of 2cp equal chunks) of every sequence, in that order.
std::vector<std::int64_t> dcs_global_index(const SeqLayout& global, int cp, int rank, Partition part = Partition::DCS);
// For each local token of `rank` (in local order), its index among the real tokens in global order
// (the unpadded problem's row), or -1 for a pad.
std::vector<std::int64_t> local_real_index(const SeqLayout& global, int cp, int rank, Partition part = Partition::DCS);
// Position of each local token inside its own sequence (RoPE / causal masks use these).
std::vector<std::int64_t> dcs_positions(const SeqLayout& global, int cp, int rank);
// Rank-major order (all ranks' local tokens concatenated by rank) -> global index of each.
std::vector<std::int64_t> dcs_rank_major_index(const SeqLayout& global, int cp, Partition part = Partition::DCS);

// Row copies of contiguous [R, ...] tensors in one memory space (host memcpy, or one device
// kernel): out row dst_rows[i] <- in row src_rows[i].
void copy_rows(Tensor& out, const Tensor& in, const std::vector<std::int64_t>& dst_rows,
               const std::vector<std::int64_t>& src_rows);

// Tensors with the token axis first ([T, ...]):
Tensor dcs_partition(const Tensor& global_t, const SeqLayout& global, int cp, int rank,
                     Partition part = Partition::DCS);
// Rank-major concatenation -> global order, and back (both exact permutations).
Tensor dcs_undo(const Tensor& rank_major, const SeqLayout& global, int cp, Partition part = Partition::DCS);
Tensor dcs_redo(const Tensor& global_t, const SeqLayout& global, int cp, Partition part = Partition::DCS);
// All-gather the local tensors of the CP group and return them in global order (every rank).
Tensor dcs_gather(Communicator& comm, const Tensor& local, const SeqLayout& global, Partition part = Partition::DCS);

// Sequence-parallel <-> hidden-parallel all-to-all (every channel block to its rank):
// cp2hp: local [Tl, C] (DCS order) -> [T, C/cp] in global token order, channels of block `rank`;
// for packed THD the de-interleave of sequences is part of the same permutation.
// hp2cp is its exact inverse; the backward of each is the other. At cp = 1 both return a view of
// their input (no copy, no communication).
Tensor cp2hp(Communicator& comm, const Tensor& local, const SeqLayout& global, Partition part = Partition::DCS);
Tensor hp2cp(Communicator& comm, const Tensor& hp, const SeqLayout& global, Partition part = Partition::DCS);

// Sequence packing for a CP group of `cp` ranks: concatenate sequences, each padded to
// dcs_padded_len with `pad_id`; labels are next-token targets inside each sequence, `ignore` on pads
// and last tokens.
struct PackedBatch {
  std::vector<std::int64_t> tokens, labels;
  SeqLayout layout;                    // THD, padded cu_seqlens
  std::vector<std::int64_t> seq_lens;  // unpadded lengths
  std::int64_t label_tokens = 0;       // labels != ignore
};
PackedBatch pack_sequences(const std::vector<std::vector<std::int64_t>>& seqs, int cp, std::int64_t pad_id,
                           std::int64_t ignore = -100);

// seq_idx of every token from the global padded cu_seqlens: the sequence whose range holds it
// (searchsorted(cu[1:], t, right=True)). For a BSHD batch each row is its own sequence.
std::vector<std::int64_t> seq_idx_from_cu(const std::vector<std::int64_t>& cu);

}  // namespace hcp::cp
