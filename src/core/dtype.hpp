// Element types and memory spaces.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace hcp {

enum class DType { F32, F64, BF16 };
enum class Space { Host, Cuda };

// bfloat16 storage: the upper 16 bits of an IEEE float, rounded to nearest even.
struct bf16 {
  std::uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
      bits = static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<std::uint16_t>(u >> 16);
    }
  }
  explicit operator float() const {
    std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::F64:
      return 8;
    case DType::BF16:
      return 2;
  }
  return 0;
}
// The bytes of n elements of dt.
inline std::size_t dtype_bytes(std::int64_t n, DType dt) { return static_cast<std::size_t>(n) * dtype_size(dt); }

// The accumulation rule, the one place it is written: sums, softmax statistics (LSE), state scans and
// routing scores of bf16 tensors are kept in fp32; fp32 and fp64 keep their own dtype.
constexpr DType acc_dtype(DType dt) { return dt == DType::BF16 ? DType::F32 : dt; }
// The same for the memory models, which count element bytes: 2 (bf16) -> 4, else unchanged.
constexpr std::int64_t acc_bytes(std::int64_t es) { return es == 2 ? 4 : es; }

std::string to_string(DType t);
std::string to_string(Space s);
DType dtype_from_string(const std::string& s);  // "fp32" | "fp64" | "bf16"

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::BF16;
}

}  // namespace hcp
