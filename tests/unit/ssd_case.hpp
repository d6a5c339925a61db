// The SSD test case shared by the host and GPU tests: random inputs (fp64 unless asked), optional
// seq_idx and initial states; on() copies it to another memory space.
#pragma once
#include "kernels/kernels.hpp"
#include "unit/fd.hpp"

namespace hcp::test {
using kernels::SsdGrads;
using kernels::SsdInputs;
using kernels::SsdParams;

struct SsdCase {
  SsdParams p;
  Tensor x, dt, A_log, B, C, D, dt_bias, init;
  std::vector<std::int64_t> seq;
  bool use_seq = false, use_init = false;

  SsdCase(std::int64_t b, std::int64_t L, std::int64_t H, std::int64_t P, std::int64_t G, std::int64_t N,
          std::int64_t chunk, std::uint64_t seed, DType d = DType::F64) {
    p.batch = b;
    p.seqlen = L;
    p.heads = H;
    p.head_dim = P;
    p.groups = G;
    p.d_state = N;
    p.chunk = chunk;
    x = test::rand({b, L, H, P}, seed, -1, 1, d);
    dt = test::rand({b, L, H}, seed + 1, -2.0, 0.5, d);
    A_log = test::rand({H}, seed + 2, -0.5, 0.8, d);
    B = test::rand({b, L, G, N}, seed + 3, -1, 1, d);
    C = test::rand({b, L, G, N}, seed + 4, -1, 1, d);
    D = test::rand({H}, seed + 5, -1, 1, d);
    dt_bias = test::rand({H}, seed + 6, -0.5, 0.5, d);
    init = test::rand({b, H, P, N}, seed + 7, -1, 1, d);
  }
  SsdInputs inputs() const {
    return {&x, &dt, &A_log, &B, &C, &D, &dt_bias, use_init ? &init : nullptr, use_seq ? &seq : nullptr};
  }
  SsdCase on(Space sp) const {
    SsdCase c = *this;
    for (Tensor* t : {&c.x, &c.dt, &c.A_log, &c.B, &c.C, &c.D, &c.dt_bias, &c.init}) *t = t->to(sp);
    return c;
  }
  Tensor zeros(const Shape& s) const { return Tensor::zeros(s, x.dtype(), x.space()); }
  Tensor y() const { return zeros(x.shape()); }
  // Zeroed gradient buffers of every input and parameter, and the SsdGrads pointing at them.
  struct Grads {
    Tensor dx, ddt, dA_log, dB, dC, dD, ddt_bias, dinit;
    SsdGrads ptrs(bool with_init) {
      return {&dx, &ddt, &dA_log, &dB, &dC, &dD, &ddt_bias, with_init ? &dinit : nullptr};
    }
  };
  Grads zero_grads() const {
    auto z = [this](const Tensor& t) { return zeros(t.shape()); };
    return {z(x), z(dt), z(A_log), z(B), z(C), z(D), z(dt_bias), z(init)};
  }
  Tensor states() const { return zeros({p.batch, p.heads, p.head_dim, p.d_state}); }
};
}  // namespace hcp::test
