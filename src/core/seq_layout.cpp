#include "core/seq_layout.hpp"

#include "core/error.hpp"

namespace hcp {

std::string to_string(Format f) { return f == Format::BSHD ? "bshd" : "thd"; }

SeqLayout SeqLayout::bshd(std::int64_t batch, std::int64_t seqlen) {
  SeqLayout l;
  l.format = Format::BSHD;
  for (std::int64_t b = 0; b <= batch; ++b) l.cu_seqlens.push_back(b * seqlen);
  return l;
}
SeqLayout SeqLayout::thd(std::vector<std::int64_t> cu) {
  SeqLayout l;
  l.format = Format::THD;
  l.cu_seqlens = std::move(cu);
  l.validate("cu_seqlens");
  return l;
}
void SeqLayout::validate(const char* what) const {
  HCP_CHECK(cu_seqlens.size() >= 2, what, ": needs at least 2 entries (one sequence)");
  HCP_CHECK(cu_seqlens[0] == 0, what, ": first entry must be 0, got ", cu_seqlens[0]);
  for (std::size_t i = 1; i < cu_seqlens.size(); ++i)
    HCP_CHECK(cu_seqlens[i] >= cu_seqlens[i - 1], what, ": must be non-decreasing (entry ", i, ")");
  HCP_CHECK(real_lens.empty() || static_cast<std::int64_t>(real_lens.size()) == nseq(), what, ": ", real_lens.size(),
            " real lengths for ", nseq(), " sequences");
  for (std::int64_t s = 0; s < static_cast<std::int64_t>(real_lens.size()); ++s)
    HCP_CHECK(real(s) >= 0 && real(s) <= len(s), what, ": sequence ", s, " has ", real(s), " real tokens of ", len(s));
}
bool SeqLayout::padded() const {
  for (std::int64_t s = 0; s < static_cast<std::int64_t>(real_lens.size()); ++s)
    if (real(s) != len(s)) return true;
  return false;
}
SeqLayout SeqLayout::unpadded() const {
  if (!padded()) return *this;
  std::vector<std::int64_t> cu{0};
  for (std::int64_t s = 0; s < nseq(); ++s) cu.push_back(cu.back() + real(s));
  return thd(cu);
}

}  // namespace hcp
