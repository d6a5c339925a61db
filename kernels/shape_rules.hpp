// The ops' shape rules, one definition: the kernel API (kernels/api) checks every call with them
// before it routes the call, and the host bodies read the sizes they return. Each throws hcp::Error
// naming the op and the rule.
#pragma once
#include <cstdint>
#include <vector>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels::rules {

// A tensor argument's element count.
inline void require_numel(const Tensor& t, std::int64_t n, const char* what) {
  HCP_CHECK(t.numel() == n, what, ": expected ", n, " elements, got shape ", shape_str(t.shape()));
}

struct Shapes {
  std::int64_t tq, tkv, H, Hkv, D;
};

Shapes check_attn(const Tensor& q, const Tensor& k, const Tensor& v, const AttnParams& p);

constexpr std::int64_t kMaxConvWidth = 16;  // mamba.conv's bound in the decks

struct ConvShape {
  std::int64_t B, L, C, W;
};

ConvShape check_conv(const Tensor& x, const Tensor& w, const Tensor* bias, const std::vector<std::int64_t>* seq);

void check_ce(const Tensor& logits, const std::vector<std::int64_t>& labels, std::int64_t ignore);

void check_router(const RouterParams& p);

// T*k of a routing whose permutation moe_permute has made.
std::int64_t permuted_rows(const MoeRouting& r, const char* what);

// Share of the assignments per expert, from the routing's counts.
std::vector<double> assignment_shares(const MoeRouting& route, const RouterParams& p, std::int64_t tokens);

struct MlpShape {
  std::int64_t E, F1, F, C, rows;
  std::vector<std::int64_t> off;
};

MlpShape check_mlp(const Tensor& xp, const Tensor& W1, const Tensor& W2, const std::vector<std::int64_t>& counts,
                   Activation act);

void check_ssd(const SsdInputs& in, const SsdParams& p);

void check_state_scan(const Tensor& S, const Tensor& a, const Tensor& Sin, const std::vector<std::int64_t>& order,
                      const std::vector<std::int64_t>& off, const char* what);

void check_compose(const Tensor& A, const Tensor& B, const Tensor& A_prev, const Tensor& B_prev, const char* what);

}  // namespace hcp::kernels::rules
