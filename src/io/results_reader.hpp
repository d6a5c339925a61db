// Reading a results file back, and the checksums that make its values verifiable (the /checksums
// manifest, io/h5_util.hpp's write_manifest, and the post-processing recompute them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/tensor.hpp"

namespace hcp {

// Order-dependent 64-bit checksum of a tensor's values (each as the bits of its double value, keyed
// by its index), as 16 hex digits: the same for a tensor and for what a ResultsReader reads back of
// it. A tensor written in parts (rows() of several ranks) has the checksum of the sum, modulo 2^64,
// of its parts' checksum_part(part, index of the part's first element).
std::string checksum(const Tensor& t);
std::uint64_t checksum_part(const Tensor& t, std::int64_t first_element);
// The same sum over n values as doubles, the first keyed by index `first`.
std::uint64_t checksum_values(const double* v, std::size_t n, std::uint64_t first);
std::string checksum_hex(std::uint64_t v);

// Reading back (single process): datasets as double tensors, string/double attributes.
class ResultsReader {
 public:
  explicit ResultsReader(const std::string& path);
  ~ResultsReader();
  ResultsReader(const ResultsReader&) = delete;
  ResultsReader& operator=(const ResultsReader&) = delete;
  bool exists(const std::string& path) const;
  Tensor read(const std::string& path, DType dt = DType::F64) const;
  // Rows [first, first + rows) of the first axis of a dataset (a hyperslab: the rest is not read).
  Tensor read_rows(const std::string& path, std::int64_t first, std::int64_t rows, DType dt = DType::F64) const;
  std::string string_attr(const std::string& obj, const std::string& name) const;
  double double_attr(const std::string& obj, const std::string& name) const;

 private:
  std::string path_;
  long long file_ = -1;
};

}  // namespace hcp
