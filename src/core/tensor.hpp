// Tensors: shape, strides (in elements), dtype and memory space; owning or non-owning views.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/error.hpp"

namespace hcp {

using Shape = std::vector<std::int64_t>;

std::string shape_str(const Shape& s);
std::int64_t numel_of(const Shape& s);
Shape contiguous_strides(const Shape& s);

// The memory space of allocations that name none (Tensor::empty/zeros without a space): Host,
// unless a SpaceScope says otherwise. Layers set it from their inputs, so one code path allocates
// on the host for host tensors and on the GPU for CUDA tensors. Per thread.
Space default_space();
class SpaceScope {
 public:
  explicit SpaceScope(Space s);
  ~SpaceScope();
  SpaceScope(const SpaceScope&) = delete;
  SpaceScope& operator=(const SpaceScope&) = delete;

 private:
  Space prev_;
};

class Tensor {
 public:
  Tensor() = default;

  // Owning, contiguous, uninitialised / zero-filled host tensors.
  static Tensor empty(const Shape& shape, DType dt, Space sp = default_space());
  static Tensor zeros(const Shape& shape, DType dt, Space sp = default_space());
  // Non-owning contiguous view of memory the caller keeps alive.
  static Tensor wrap(void* data, const Shape& shape, DType dt, Space sp = Space::Host);
  // Host tensor from values (converted to dt).
  static Tensor from(const std::vector<double>& v, const Shape& shape, DType dt);

  bool defined() const { return defined_; }
  DType dtype() const { return dtype_; }
  Space space() const { return space_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  std::int64_t size(int d) const;
  std::int64_t stride(int d) const;
  std::int64_t numel() const { return numel_of(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  bool owns() const { return static_cast<bool>(storage_); }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <class T>
  T* data() {
    check_type<T>();
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* data() const {
    check_type<T>();
    return static_cast<const T*>(data_);
  }

  // Views sharing storage.
  Tensor view(const Shape& shape) const;                            // contiguous only; one -1 allowed
  Tensor slice(int d, std::int64_t start, std::int64_t len) const;  // along one axis
  // Copies.
  Tensor clone() const;               // contiguous copy, same dtype
  Tensor to(DType dt) const;          // contiguous copy converted
  Tensor to(Space sp) const;          // contiguous copy in another memory space (CUDA: needs the backend)
  void copy_from(const Tensor& src);  // same shape, any dtypes/strides (host)
  void fill(double v);

  // Element access by flat logical index (host, any strides), as double; for tests and I/O.
  double get(std::int64_t flat) const;
  void set(std::int64_t flat, double v);
  std::vector<double> to_vector() const;

 private:
  template <class T>
  void check_type() const {
    HCP_CHECK(dtype_of<T>() == dtype_, "tensor dtype is ", to_string(dtype_), ", accessed as ",
              to_string(dtype_of<T>()));
  }
  std::int64_t offset_of(std::int64_t flat) const;

  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  Space space_ = Space::Host;
  Shape shape_;
  Shape strides_;
  bool defined_ = false;
};

// Max |a-b| and max |a-b| / max(|b|, floor) over all elements (shapes must match).
// The larger of a and b, NaN when either is NaN (std::max(a, NaN) returns a, which would let a NaN
// through a "worst error <= tolerance" check).
inline double nan_max(double a, double b) { return (a != a || b != b) ? a + b : (a < b ? b : a); }

// Largest differences of `a` from `ref`. Any NaN, in either, or an infinity not matched by the same
// infinity, counts as an infinite difference: a NaN never passes a tolerance.
struct ErrorStats {
  double max_abs = 0, max_rel = 0, ref_max = 0;
  double sq_diff = 0, sq_ref = 0;  // sums of (a - ref)^2 and ref^2 over the finite elements
  std::int64_t nonfinite = 0;      // elements where a or ref is NaN or where only one is infinite
};
ErrorStats compare(const Tensor& a, const Tensor& ref, double rel_floor = 1e-6);

// Bytes of tensor storage alive in a memory space, and its high-water mark since the last
// reset_tensor_peak (which sets it to the bytes alive then). Counts every Tensor::empty/zeros of this
// process; kernel scratch outside tensors (CUDA stream-ordered buffers) is not counted.
std::int64_t tensor_bytes_live(Space sp);
std::int64_t tensor_bytes_peak(Space sp);
void reset_tensor_peak(Space sp);
// A second high-water mark, for nested scopes (PhaseTimes' per-phase peaks), independent of the
// first: take_tensor_scope_peak returns it and restarts it at the bytes alive now;
// raise_tensor_scope_peak lifts it to at least `bytes`.
std::int64_t take_tensor_scope_peak(Space sp);
void raise_tensor_scope_peak(Space sp, std::int64_t bytes);

// Drops the storage of tensors a layer saved for its backward: each becomes undefined. Layers call
// it at the end of backward, as autograd frees saved tensors, so they hold nothing between steps.
template <class... T>
void release_saved(T&... t) {
  ((t = Tensor()), ...);
}

// splitmix64: a well-mixed 64-bit hash (the fills below, checkpoint checksums and synthetic data).
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a (64-bit) of a name's bytes: names become seeds the same way with every compiler and
// standard library (std::hash may differ between them).
inline std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Deterministic inputs from (seed, index): uniform in [lo, hi).
void fill_uniform(Tensor& t, std::uint64_t seed, double lo = -1.0, double hi = 1.0);
// Rows of such a tensor without making it: row r of t [R, ...] (host) gets the values row rows[r] of
// a tensor [*, ...] filled by fill_uniform(seed) has; rows[r] < 0 gives a zero row.
void fill_uniform_rows(Tensor& t, std::uint64_t seed, const std::vector<std::int64_t>& rows, double lo = -1.0,
                       double hi = 1.0);

}  // namespace hcp
