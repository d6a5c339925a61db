// The layer drivers' random inputs: the unpadded problem's (the cp=1 reference) and each rank's own
// rows, made without the global tensor.
#include "inputs.hpp"

#include "common.hpp"
#include "cp/layout.hpp"

namespace hcp::drivers {

Tensor unpadded_uniform(const SeqLayout& global, const Shape& rest, DType dt, std::uint64_t seed) {
  Shape us{global.unpadded().total()};
  us.insert(us.end(), rest.begin(), rest.end());
  Tensor u = Tensor::empty(us, dt, Space::Host);
  fill_uniform(u, seed);
  return u;
}

Tensor local_uniform(const SeqLayout& global, int cp, int rank, const Shape& rest, DType dt, std::uint64_t seed) {
  return rows_uniform(cp::local_real_index(global, cp, rank), rest, dt, seed);
}

Tensor rows_uniform(const std::vector<std::int64_t>& rows, const Shape& rest, DType dt, std::uint64_t seed) {
  Shape ls{static_cast<std::int64_t>(rows.size())};
  ls.insert(ls.end(), rest.begin(), rest.end());
  Tensor t = Tensor::empty(ls, dt, Space::Host);
  fill_uniform_rows(t, seed, rows);
  return t;
}

}  // namespace hcp::drivers
