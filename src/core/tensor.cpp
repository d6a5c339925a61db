#include "core/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <thread>
#include <type_traits>

#include "core/device_ops.hpp"
#include "core/seq_layout.hpp"

namespace hcp {

std::string to_string(DType t) {
  switch (t) {
    case DType::F32:
      return "fp32";
    case DType::F64:
      return "fp64";
    case DType::BF16:
      return "bf16";
  }
  return "?";
}
std::string to_string(Space s) { return s == Space::Host ? "host" : "cuda"; }
DType dtype_from_string(const std::string& s) {
  if (s == "fp32") return DType::F32;
  if (s == "fp64") return DType::F64;
  if (s == "bf16") return DType::BF16;
  HCP_FAIL("unknown dtype '", s, "' (expected fp32, fp64 or bf16)");
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << "]";
  return os.str();
}
std::int64_t numel_of(const Shape& s) {
  std::int64_t n = 1;
  for (auto v : s) n *= v;
  return n;
}
Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  std::int64_t acc = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

namespace {
DeviceOps g_device_ops;
bool g_have_device = false;
const DeviceOps& require_device(const char* what) {
  HCP_CHECK(g_have_device, what,
            " on a CUDA tensor needs the CUDA backend: this process has no GPU backend "
            "initialised (a build without CUDA, or no usable GPU)");
  return g_device_ops;
}
thread_local Space g_default_space = Space::Host;
}  // namespace
Space default_space() { return g_default_space; }
SpaceScope::SpaceScope(Space s) : prev_(g_default_space) { g_default_space = s; }
SpaceScope::~SpaceScope() { g_default_space = prev_; }

void register_device_ops(const DeviceOps& ops) {
  g_device_ops = ops;
  g_have_device = true;
}
const DeviceOps* device_ops() { return g_have_device ? &g_device_ops : nullptr; }

namespace {
// fn(begin, end) over [0, n): one call below 2^20 elements, else one range per hardware thread.
// Callers compute each element from its index alone, so the split never changes a result.
template <class F>
void for_ranges(std::int64_t n, F&& fn) {
  const std::int64_t nt = n < (1 << 20) ? 1 : std::clamp<std::int64_t>(std::thread::hardware_concurrency(), 1, 32);
  std::vector<std::thread> pool;
  for (std::int64_t k = 1; k < nt; ++k) pool.emplace_back([&fn, n, nt, k] { fn(n * k / nt, n * (k + 1) / nt); });
  fn(0, n / nt);
  for (auto& th : pool) th.join();
}
// fn(typed pointer) for the dtype of `data`.
template <class F>
void with_typed(DType dt, void* data, F&& fn) {
  switch (dt) {
    case DType::F32:
      return fn(static_cast<float*>(data));
    case DType::F64:
      return fn(static_cast<double*>(data));
    case DType::BF16:
      return fn(static_cast<bf16*>(data));
  }
}
template <class F>
void with_typed(DType dt, const void* data, F&& fn) {
  with_typed(dt, const_cast<void*>(data),
             [&](auto* p) { fn(static_cast<const std::remove_pointer_t<decltype(p)>*>(p)); });
}
// A value as set() stores it (bf16 through float) and as get() reads it.
template <class D>
D narrow(double v) {
  if constexpr (std::is_same_v<D, bf16>)
    return bf16(static_cast<float>(v));
  else
    return static_cast<D>(v);
}
double widen(float v) { return v; }
double widen(double v) { return v; }
double widen(bf16 v) { return static_cast<float>(v); }

void raise_to(std::atomic<std::int64_t>& mark, std::int64_t v) {
  std::int64_t p = mark.load();
  while (v > p && !mark.compare_exchange_weak(p, v)) {
  }
}
struct StorageBytes {
  std::atomic<std::int64_t> live{0}, peak{0}, scope_peak{0};
  void add(std::int64_t n) {
    const std::int64_t now = live.fetch_add(n) + n;
    raise_to(peak, now);
    raise_to(scope_peak, now);
  }
};
StorageBytes g_bytes[2];  // host, cuda
StorageBytes& bytes_of(Space sp) { return g_bytes[sp == Space::Cuda ? 1 : 0]; }
}  // namespace

std::int64_t tensor_bytes_live(Space sp) { return bytes_of(sp).live.load(); }
std::int64_t tensor_bytes_peak(Space sp) { return bytes_of(sp).peak.load(); }
void reset_tensor_peak(Space sp) { bytes_of(sp).peak.store(bytes_of(sp).live.load()); }
std::int64_t take_tensor_scope_peak(Space sp) {
  StorageBytes& b = bytes_of(sp);
  return b.scope_peak.exchange(b.live.load());
}
void raise_tensor_scope_peak(Space sp, std::int64_t bytes) { raise_to(bytes_of(sp).scope_peak, bytes); }

Tensor Tensor::empty(const Shape& shape, DType dt, Space sp) {
  for (auto v : shape) HCP_CHECK(v >= 0, "negative extent in shape ", shape_str(shape));
  Tensor t;
  std::size_t bytes = static_cast<std::size_t>(numel_of(shape)) * dtype_size(dt);
  if (sp == Space::Cuda) {
    const DeviceOps& ops = require_device("Tensor::empty");
    auto fr = ops.free;
    const auto n = static_cast<std::int64_t>(bytes);
    t.storage_ = std::shared_ptr<void>(ops.alloc(std::max<std::size_t>(bytes, 1)), [fr, n](void* q) {
      fr(q);
      bytes_of(Space::Cuda).add(-n);
    });
    bytes_of(Space::Cuda).add(n);
  } else {
    void* p = std::aligned_alloc(64, ((bytes + 63) / 64) * 64 + 64);
    HCP_CHECK(p != nullptr, "host allocation of ", bytes, " bytes failed (a ", to_string(dt), " tensor of shape ",
              shape_str(shape), ")");
    const auto n = static_cast<std::int64_t>(bytes);
    t.storage_ = std::shared_ptr<void>(p, [n](void* q) {
      std::free(q);
      bytes_of(Space::Host).add(-n);
    });
    bytes_of(Space::Host).add(n);
  }
  t.data_ = t.storage_.get();
  t.dtype_ = dt;
  t.space_ = sp;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.defined_ = true;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dt, Space sp) {
  Tensor t = empty(shape, dt, sp);
  if (sp == Space::Cuda)
    require_device("Tensor::zeros").zero(t.data_, t.nbytes());
  else
    std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dt, Space sp) {
  Tensor t;
  t.data_ = data;
  t.dtype_ = dt;
  t.space_ = sp;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.defined_ = true;
  return t;
}

Tensor Tensor::from(const std::vector<double>& v, const Shape& shape, DType dt) {
  HCP_CHECK(static_cast<std::int64_t>(v.size()) == numel_of(shape), "Tensor::from: ", v.size(), " values for shape ",
            shape_str(shape));
  Tensor t = empty(shape, dt, Space::Host);
  for (std::size_t i = 0; i < v.size(); ++i) t.set(static_cast<std::int64_t>(i), v[i]);
  return t;
}

std::int64_t Tensor::size(int d) const {
  if (d < 0) d += dim();
  HCP_CHECK(d >= 0 && d < dim(), "axis ", d, " out of range for shape ", shape_str(shape_));
  return shape_[d];
}
std::int64_t Tensor::stride(int d) const {
  if (d < 0) d += dim();
  HCP_CHECK(d >= 0 && d < dim(), "axis ", d, " out of range for shape ", shape_str(shape_));
  return strides_[d];
}

bool Tensor::is_contiguous() const {
  std::int64_t acc = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

Tensor Tensor::view(const Shape& shape) const {
  HCP_CHECK(is_contiguous(), "view() of a non-contiguous tensor ", shape_str(shape_));
  Shape s = shape;
  int neg = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      HCP_CHECK(neg < 0, "view(): more than one -1 in ", shape_str(shape));
      neg = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (neg >= 0) {
    HCP_CHECK(known > 0 && numel() % known == 0, "view(): cannot infer -1 in ", shape_str(shape), " from ",
              shape_str(shape_));
    s[neg] = numel() / known;
  }
  HCP_CHECK(numel_of(s) == numel(), "view(): shape ", shape_str(s), " does not match ", numel(), " elements of ",
            shape_str(shape_));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::slice(int d, std::int64_t start, std::int64_t len) const {
  if (d < 0) d += dim();
  HCP_CHECK(d >= 0 && d < dim(), "slice(): axis ", d, " out of range for ", shape_str(shape_));
  HCP_CHECK(start >= 0 && len >= 0 && start + len <= shape_[d], "slice(): [", start, ", ", start + len,
            ") out of range of axis ", d, " of ", shape_str(shape_));
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + start * strides_[d] * static_cast<std::int64_t>(dtype_size(dtype_));
  t.shape_[d] = len;
  return t;
}

std::int64_t Tensor::offset_of(std::int64_t flat) const {
  std::int64_t off = 0;
  for (int i = dim() - 1; i >= 0; --i) {
    std::int64_t idx = flat % shape_[i];
    flat /= shape_[i];
    off += idx * strides_[i];
  }
  return off;
}

double Tensor::get(std::int64_t flat) const {
  HCP_CHECK(space_ == Space::Host, "get() on a ", to_string(space_), " tensor");
  std::int64_t o = offset_of(flat);
  switch (dtype_) {
    case DType::F32:
      return static_cast<const float*>(data_)[o];
    case DType::F64:
      return static_cast<const double*>(data_)[o];
    case DType::BF16:
      return static_cast<float>(static_cast<const bf16*>(data_)[o]);
  }
  return 0;
}

void Tensor::set(std::int64_t flat, double v) {
  HCP_CHECK(space_ == Space::Host, "set() on a ", to_string(space_), " tensor");
  std::int64_t o = offset_of(flat);
  switch (dtype_) {
    case DType::F32:
      static_cast<float*>(data_)[o] = static_cast<float>(v);
      break;
    case DType::F64:
      static_cast<double*>(data_)[o] = v;
      break;
    case DType::BF16:
      static_cast<bf16*>(data_)[o] = bf16(static_cast<float>(v));
      break;
  }
}

std::vector<double> Tensor::to_vector() const {
  std::vector<double> v(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) v[static_cast<std::size_t>(i)] = get(i);
  return v;
}

void Tensor::copy_from(const Tensor& src) {
  HCP_CHECK(src.shape_ == shape_, "copy_from(): shape ", shape_str(src.shape_), " into ", shape_str(shape_));
  if (space_ == Space::Cuda || src.space_ == Space::Cuda) {
    // Across spaces or on the device: one dtype (convert on the host first); strided views on the
    // device by the backend's strided copy.
    HCP_CHECK(src.dtype_ == dtype_, "copy_from() between ", to_string(src.space_), " and ", to_string(space_),
              " needs tensors of one dtype (", to_string(src.dtype_), " -> ", to_string(dtype_), ")");
    const DeviceOps& ops = require_device("copy_from()");
    if (is_contiguous() && src.is_contiguous()) {
      ops.copy(data_, space_, src.data_, src.space_, nbytes());
    } else if (space_ == Space::Host) {
      copy_from(src.to(Space::Host));  // device -> contiguous host copy -> strided host copy
    } else {
      const Tensor s = src.space_ == Space::Cuda ? src : src.clone().to(Space::Cuda);
      HCP_CHECK(dim() <= 8, "copy_from(): strided device copies support up to 8 axes");
      ops.copy_strided(data_, strides_.data(), s.data_, s.strides_.data(), shape_.data(), dim(), dtype_size(dtype_));
    }
    return;
  }
  if (src.dtype_ == dtype_ && is_contiguous() && src.is_contiguous()) {
    std::memcpy(data_, src.data_, nbytes());
    return;
  }
  const std::int64_t n = numel();
  if (is_contiguous() && src.is_contiguous()) {  // a dtype conversion: typed loops over ranges
    with_typed(dtype_, data_, [&](auto* d) {
      using D = std::remove_pointer_t<decltype(d)>;
      with_typed(src.dtype_, src.data_, [&](const auto* s) {
        for_ranges(n, [&](std::int64_t b, std::int64_t e) {
          for (std::int64_t i = b; i < e; ++i) d[i] = narrow<D>(widen(s[i]));
        });
      });
    });
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) set(i, src.get(i));
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, space_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dt) const {
  if (space_ == Space::Cuda && dt != dtype_) {
    const DeviceOps& ops = require_device("Tensor::to(DType)");
    if (!ops.convert) return to(Space::Host).to(dt).to(Space::Cuda);
    const Tensor c = is_contiguous() ? *this : clone();
    Tensor t = empty(shape_, dt, space_);
    ops.convert(t.data_, dt, c.data_, dtype_, numel());
    return t;
  }
  Tensor t = empty(shape_, dt, space_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Space sp) const {
  Tensor c = is_contiguous() ? *this : clone();
  Tensor t = empty(shape_, dtype_, sp);
  t.copy_from(c);
  return t;
}

void Tensor::fill(double v) {
  if (space_ == Space::Cuda) {
    Tensor h = Tensor::empty(shape_, dtype_, Space::Host);
    h.fill(v);
    copy_from(h);
    return;
  }
  const std::int64_t n = numel();
  for (std::int64_t i = 0; i < n; ++i) set(i, v);
}

ErrorStats compare(const Tensor& a, const Tensor& ref, double rel_floor) {
  HCP_CHECK(a.shape() == ref.shape(), "compare(): shapes ", shape_str(a.shape()), " and ", shape_str(ref.shape()));
  ErrorStats e;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = ref.get(i);
    double d = std::abs(x - y);
    if (std::isinf(x) && x == y) {
      d = 0;  // the same infinity (e.g. the LSE of a row with no key)
    } else if (!std::isfinite(x) || !std::isfinite(y)) {
      d = INFINITY;
      ++e.nonfinite;
    }
    e.max_abs = std::max(e.max_abs, d);
    e.max_rel = std::max(e.max_rel, d / std::max(std::abs(y), rel_floor));
    if (std::isfinite(y)) e.ref_max = std::max(e.ref_max, std::abs(y));
    if (std::isfinite(d)) {
      e.sq_diff += d * d;
      e.sq_ref += y * y;
    }
  }
  return e;
}

namespace {
// splitmix64 of (seed, index): reproducible regardless of rank count or iteration order.
double uniform_at(std::uint64_t s, std::int64_t i, double lo, double hi) {
  const std::uint64_t r = mix64(s ^ mix64(static_cast<std::uint64_t>(i)));
  const double u = static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);
  return lo + (hi - lo) * u;
}

// Element i of a host tensor <- value(index(i)) (index < 0: zero); contiguous ones over for_ranges.
template <class Index>
void fill_by_index(Tensor& t, std::uint64_t s, double lo, double hi, Index index) {
  HCP_CHECK(t.space() == Space::Host, "fill_uniform: a host tensor");
  const std::int64_t n = t.numel();
  const auto value = [&](std::int64_t i) {
    const std::int64_t k = index(i);
    return k < 0 ? 0.0 : uniform_at(s, k, lo, hi);
  };
  if (!t.is_contiguous()) {
    for (std::int64_t i = 0; i < n; ++i) t.set(i, value(i));
    return;
  }
  with_typed(t.dtype(), t.raw(), [&](auto* d) {
    using D = std::remove_pointer_t<decltype(d)>;
    for_ranges(n, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) d[i] = narrow<D>(value(i));
    });
  });
}
}  // namespace

void fill_uniform(Tensor& t, std::uint64_t seed, double lo, double hi) {
  fill_by_index(t, mix64(seed), lo, hi, [](std::int64_t i) { return i; });
}

void fill_uniform_rows(Tensor& t, std::uint64_t seed, const std::vector<std::int64_t>& rows, double lo, double hi) {
  HCP_CHECK(t.dim() >= 1 && t.size(0) == static_cast<std::int64_t>(rows.size()), "fill_uniform_rows: ", rows.size(),
            " row indices for ", t.dim() ? t.size(0) : 0, " rows");
  const std::int64_t len = t.size(0) > 0 ? t.numel() / t.size(0) : 0;
  fill_by_index(t, mix64(seed), lo, hi, [&](std::int64_t i) {
    const std::int64_t r = rows[static_cast<std::size_t>(i / len)];
    return r < 0 ? -1 : r * len + i % len;
  });
}

}  // namespace hcp
