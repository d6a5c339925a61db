// Vectorised row operations of the host softmax: float exp, and max / sum over a row.
// exp: x = k ln2 + r with k = round(x / ln2) (by the 1.5 * 2^23
// shifter: no branch), |r| <= ln2 / 2 (ln2 split in two so k ln2 is exact), e^r by its degree-7
// Taylor polynomial (truncation < 6e-9 relative), 2^k written into the exponent bits. Compiled
// with -fno-trapping-math so the clamp becomes a vector max; results are the same IEEE values.
#include <cstdint>
#include <cstring>

#include "kernels/host/common.hpp"

namespace hcp::kernels::host {

void exp_inplace(float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float v = xi > -87.0f ? xi : -87.0f;  // keeps 2^k normal
    const float kf = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const std::int32_t k = static_cast<std::int32_t>(kf);
    const float r = (v - kf * 0.693145751953125f) - kf * 1.42860682030941723e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const std::int32_t bits = (k + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    x[i] = p * scale;
  }
}

namespace {
// Eight independent lanes, then the lanes in a fixed order: the same order on every call (results
// are deterministic) and no chain of dependent adds or compares.
template <class T>
T lane_max(const T* x, std::int64_t n, T init) {
  T m[8] = {init, init, init, init, init, init, init, init};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
  for (; i < n; ++i) m[0] = x[i] > m[0] ? x[i] : m[0];
  T r = m[0];
  for (int j = 1; j < 8; ++j) r = m[j] > r ? m[j] : r;
  return r;
}
template <class T>
T lane_sum(const T* x, std::int64_t n) {
  T s[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += x[i + j];
  for (; i < n; ++i) s[0] += x[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}
}  // namespace

float row_max(const float* x, std::int64_t n, float init) { return lane_max(x, n, init); }
double row_max(const double* x, std::int64_t n, double init) { return lane_max(x, n, init); }
float row_sum(const float* x, std::int64_t n) { return lane_sum(x, n); }
double row_sum(const double* x, std::int64_t n) { return lane_sum(x, n); }

}  // namespace hcp::kernels::host
