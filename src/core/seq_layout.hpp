// Sequence layouts: BSHD batches [B,S,H,D] and THD packed sequences [T,H,D] with cu_seqlens.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hcp {

enum class Format { BSHD, THD };
std::string to_string(Format f);

// Describes how the token axis of a tensor is organised. For BSHD, `cu_seqlens` is filled with the
// uniform boundaries 0, S, 2S, ... so every kernel can treat both formats as a list of segments.
struct SeqLayout {
  Format format = Format::BSHD;
  std::vector<std::int64_t> cu_seqlens;  // size nseq+1, cu_seqlens[0]=0, non-decreasing
  // Tokens of each sequence before its padding (cu_seqlens holds the padded lengths); empty: none
  // padded. Pads sit at the end of their sequence; they are never attention keys, and every layer
  // gives them zero outputs and gradients.
  std::vector<std::int64_t> real_lens;

  static SeqLayout bshd(std::int64_t batch, std::int64_t seqlen);
  static SeqLayout thd(std::vector<std::int64_t> cu);
  std::int64_t nseq() const { return static_cast<std::int64_t>(cu_seqlens.size()) - 1; }
  std::int64_t total() const { return cu_seqlens.empty() ? 0 : cu_seqlens.back(); }
  std::int64_t len(std::int64_t s) const { return cu_seqlens[s + 1] - cu_seqlens[s]; }
  std::int64_t real(std::int64_t s) const {
    return real_lens.empty() ? len(s) : real_lens[static_cast<std::size_t>(s)];
  }
  bool padded() const;
  // The same sequences at their real lengths, packed without padding (THD; BSHD when none is padded).
  SeqLayout unpadded() const;
  void validate(const char* what) const;  // throws hcp::Error naming `what`
};

}  // namespace hcp
