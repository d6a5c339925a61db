// Sequence layouts: BSHD batches [B,S,H,D] and THD packed sequences [T,H,D] with cu_seqlens.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hcp {

enum class Format { BSHD, THD };
std::string to_string(Format f);
Format format_from_string(const std::string& s);  // "bshd" | "thd"

// Describes how the token axis of a tensor is organised. For BSHD, `cu_seqlens` is filled with the
// uniform boundaries 0, S, 2S, ... so every kernel can treat both formats as a list of segments.
struct SeqLayout {
  Format format = Format::BSHD;
  std::vector<std::int64_t> cu_seqlens;  // size nseq+1, cu_seqlens[0]=0, non-decreasing

  static SeqLayout bshd(std::int64_t batch, std::int64_t seqlen);
  static SeqLayout thd(std::vector<std::int64_t> cu);
  std::int64_t nseq() const { return static_cast<std::int64_t>(cu_seqlens.size()) - 1; }
  std::int64_t total() const { return cu_seqlens.empty() ? 0 : cu_seqlens.back(); }
  std::int64_t len(std::int64_t s) const { return cu_seqlens[s + 1] - cu_seqlens[s]; }
  void validate(const char* what) const;  // throws hcp::Error naming `what`
};

}  // namespace hcp
