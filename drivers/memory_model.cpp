// The memory model of memory_model.hpp: per-token counts of the tensors each layer and strategy
// allocates (the tensors are named beside each term). The attention and Mamba drivers' models are
// in memory_model_layers.cpp, the hybrid step's in memory_model_hybrid.cpp; the limit, admission
// and --dry-run report in memory_admission.cpp.
#include "memory_model.hpp"

#include <algorithm>

#include "common.hpp"
#include "core/dtype.hpp"
#include "cp/layout.hpp"

namespace hcp::drivers {

std::int64_t padded_tokens(const Deck& d, int cp, const MemoryModel& m) {
  if (d.get_string("data.format") == "bshd") return m.mul(d.get_int("data.batch"), d.get_int("data.seqlen"));
  std::int64_t T = 0;
  for (std::int64_t n : parse_lengths(d, "data.seq_lens")) T = m.sum(T, m.mul(cp::dcs_chunk_len(n, cp), 2 * cp));
  return T;
}

std::int64_t real_tokens(const Deck& d, const MemoryModel& m) {
  if (d.get_string("data.format") == "bshd") return m.mul(d.get_int("data.batch"), d.get_int("data.seqlen"));
  std::int64_t T = 0;
  for (std::int64_t n : parse_lengths(d, "data.seq_lens")) T = m.sum(T, n);
  return T;
}

std::int64_t dtype_bytes(const Deck& d) {
  return static_cast<std::int64_t>(dtype_size(dtype_from_string(d.get_string("data.dtype"))));
}

CheckMode check_mode(const Deck& d) {
  const std::string& v = d.get_string("run.check");
  return v == "reference" ? CheckMode::Reference : v == "cross" ? CheckMode::Cross : CheckMode::Off;
}

std::int64_t sequences(const Deck& d) {
  if (d.get_string("data.format") == "bshd") return d.get_int("data.batch");
  return static_cast<std::int64_t>(parse_lengths(d, "data.seq_lens").size());
}
std::int64_t split_gradient_sets(const cp::DocPartition& docs) {
  std::int64_t most = 1;
  for (int r = 0; r < docs.cp; ++r) {
    std::int64_t n = 0;
    for (const cp::SplitPart& p : docs.split_parts(r)) n += p.layout.nseq() > 0 ? 1 : 0;
    most = std::max(most, n);
  }
  return most;
}
std::int64_t state_bytes(const Deck& d) { return d.get_string("data.dtype") == "bf16" ? 4 : dtype_bytes(d); }

std::int64_t mamba_param_count(const model::Mamba2Config& c) {
  // in_proj, conv weight and bias, A_log / D / dt_bias, norm weight, out_proj
  return c.d_in_proj() * c.hidden + c.conv_dim() * (c.conv + 1) + 3 * c.heads + c.d_inner() + c.hidden * c.d_inner();
}

bool host_bf16(const Deck& d) { return d.get_string("run.device") == "host" && d.get_string("data.dtype") == "bf16"; }

}  // namespace hcp::drivers
