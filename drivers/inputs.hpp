// The layer drivers' random inputs: the unpadded problem's (the cp=1 reference) and each rank's own
// rows, made without the global tensor.
#pragma once
#include <cstdint>
#include <vector>

#include "core/seq_layout.hpp"
#include "core/tensor.hpp"

namespace hcp::drivers {

// Uniform random inputs of the unpadded problem [real tokens, rest...] (`seed`), and this rank's rows
// of them in the padded DualChunkSwap layout (pads zero), made without the global tensor: the real
// tokens' inputs do not depend on the padding or cp, so runs at different CP sizes solve the same
// problem (their files compare tensor by tensor), and a rank holds only its share.
Tensor unpadded_uniform(const SeqLayout& global, const Shape& rest, DType dt, std::uint64_t seed);
Tensor local_uniform(const SeqLayout& global, int cp, int rank, const Shape& rest, DType dt, std::uint64_t seed);
// The same for rows given as local_real_index gives them (a per-document placement's real_index).
Tensor rows_uniform(const std::vector<std::int64_t>& rows, const Shape& rest, DType dt, std::uint64_t seed);

// A host copy (the tensor itself when it lives on the host).
inline Tensor host(const Tensor& t) { return t.space() == Space::Host ? t : t.to(Space::Host); }

}  // namespace hcp::drivers
