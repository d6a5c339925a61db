// Memory per rank, estimated from the deck before anything is allocated, against what the rank can
// get (host: MemAvailable of /proc/meminfo divided among the node's ranks; GPU: cudaMemGetInfo free,
// divided among the ranks sharing the device). A run that cannot fit is refused in the validate
// phase (exit 2 on every rank) naming the size keys and the estimate; sizes whose products do not fit
// in 64 bits are refused the same way. The estimates count the tensors a driver holds at once
// (reference and CP run, activations saved for backward, gradients), rounded up, not the exact peak.
#pragma once
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>

#include "common.hpp"
#include "comm/process_grid.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "io/deck.hpp"
#include "model/hybrid.hpp"
#include "model/mamba2.hpp"
#ifdef HCP_HAVE_CUDA
#include "kernels/cuda/runtime.hpp"
#endif

namespace hcp::drivers {

class Footprint {
 public:
  explicit Footprint(std::string keys) : keys_(std::move(keys)) {}
  // Adds the product of `factors` (elements) times `bytes_per` bytes, refusing on overflow.
  void add(std::initializer_list<std::int64_t> factors, std::int64_t bytes_per = 1) {
    std::int64_t v = bytes_per;
    for (std::int64_t f : factors) v = mul(v, f);
    HCP_INPUT_CHECK(bytes_ <= std::numeric_limits<std::int64_t>::max() - v, keys_, overflow());
    bytes_ += v;
  }
  std::int64_t mul(std::int64_t a, std::int64_t b) const {
    std::int64_t r = 0;
    HCP_INPUT_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &r), keys_, overflow());
    return r;
  }
  std::int64_t bytes() const { return bytes_; }

  // Refuses the run when the estimate exceeds what one rank of this node can have.
  void require_fits(Space space) const {
    int local = 1;
    node_local_rank(&local);
    int sharing = std::max(local, 1);  // ranks that draw on the same memory
#ifdef HCP_HAVE_CUDA
    if (space == Space::Cuda) sharing = std::max(1, (local + cuda::device_count() - 1) / std::max(cuda::device_count(), 1));
#endif
    const double avail = available(space) / sharing;
    HCP_INPUT_CHECK(static_cast<double>(bytes_) <= avail, keys_, "the run needs about ", gib(static_cast<double>(bytes_)),
              " per rank (estimated from these sizes) but ", space == Space::Cuda ? "the GPU has " : "this node has ",
              gib(avail), " per rank available (", sharing, " ranks share it): lower those sizes or use more ranks");
  }

 private:
  std::string overflow() const { return "these sizes give a tensor size that overflows 64 bits"; }
  static std::string gib(double b) {
    std::ostringstream os;
    os.precision(3);
    os << b / (1024.0 * 1024 * 1024) << " GiB";
    return os.str();
  }
  static double available(Space space) {
#ifdef HCP_HAVE_CUDA
    if (space == Space::Cuda) return static_cast<double>(cuda::free_memory());
#endif
    (void)space;
    std::ifstream in("/proc/meminfo");
    std::string key;
    double kb = 0;
    while (in >> key >> kb) {
      if (key == "MemAvailable:") return kb * 1024.0;
      in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    return std::numeric_limits<double>::infinity();  // unknown: not refused here
  }
  std::string keys_;
  std::int64_t bytes_ = 0;
};

}  // namespace hcp::drivers


// Estimates (bytes per rank) of the drivers, from the deck alone, as counts of tensors of the sizes
// named (the rank-0 reference run holds the global problem; the CP run its share and the gathered
// results). Loose upper bounds of what is alive at once, not the exact peak.
namespace hcp::drivers {

// Global tokens after padding: batch x seqlen (BSHD) or the lengths padded to 2*cp (THD).
inline std::int64_t footprint_tokens(const Deck& d, int cp, Footprint& f) {
  if (d.get_string("data.format") == "bshd") return f.mul(d.get_int("data.batch"), d.get_int("data.seqlen"));
  std::int64_t T = 0;
  for (std::int64_t n : parse_lengths(d, "data.seq_lens")) {
    const std::int64_t m = 2 * cp, padded = f.mul((n / m) + (n % m != 0), m);
    HCP_INPUT_CHECK(T <= std::numeric_limits<std::int64_t>::max() - padded, d.where("data.seq_lens"),
                    "key 'data.seq_lens': the total length overflows 64 bits");
    T += padded;
  }
  return T;
}

inline std::int64_t dtype_bytes(const Deck& d) {
  return static_cast<std::int64_t>(dtype_size(dtype_from_string(d.get_string("data.dtype"))));
}

// q, k, v, dout, o and the gradients of the global problem (reference), the gathered results, the
// all-gather's global K/V and gradients: 12 global-sized sets of (heads + kv_heads) head_dim.
inline Footprint attention_footprint(const Deck& d, int cp) {
  Footprint f("data.seqlen/data.batch/data.seq_lens, attention.heads, attention.kv_heads, attention.head_dim");
  const std::int64_t T = footprint_tokens(d, cp, f);
  f.add({12, T, d.get_int("attention.heads") + d.get_int("attention.kv_heads"), d.get_int("attention.head_dim")},
        dtype_bytes(d));
  return f;
}

// Per token: input, output and their gradients (hidden), in_proj output and its gradient, conv
// output, SSD output, each for the reference and the CP run.
inline Footprint mamba_footprint(const Deck& d, int cp, const model::Mamba2Config& c) {
  Footprint f("data.seqlen/data.batch/data.seq_lens, mamba.hidden, mamba.heads, mamba.head_dim, mamba.n_groups, mamba.d_state");
  const std::int64_t T = footprint_tokens(d, cp, f);
  const std::int64_t per_token = 8 * c.hidden + 4 * c.d_in_proj() + 4 * c.conv_dim() + 4 * c.d_inner();
  f.add({2, T, per_token}, dtype_bytes(d));
  return f;
}

// Every block's saved activations and gradients (the largest mixer's per-token size), the logits and
// their gradient in fp32, for the reference and the CP run.
inline Footprint hybrid_footprint(const model::HybridConfig& h, std::int64_t T, std::int64_t es, const std::string& keys) {
  Footprint f(keys);
  const auto& a = h.attn;
  const std::int64_t mamba = 4 * h.mamba.d_in_proj() + 4 * h.mamba.conv_dim() + 4 * h.mamba.d_inner();
  const std::int64_t attn = 12 * (a.heads + a.kv_heads) * a.head_dim;
  const std::int64_t moe = 4 * h.moe.topk * h.moe.ffn + 4 * h.moe.shared_ffn + 2 * h.moe.experts;
  const std::int64_t mlp = 4 * h.mlp.ffn;
  const std::int64_t per_block = 8 * h.hidden + std::max({mamba, attn, moe, mlp});
  f.add({2, T, static_cast<std::int64_t>(h.pattern.size()), per_block}, es);
  f.add({2, T, h.vocab, 3}, 4);
  return f;
}

// `copies` sets of the parameters one rank holds at EP size `ep` (experts 1/ep), `bytes` per element.
inline void add_parameters(Footprint& f, const model::HybridConfig& h, int ep, std::int64_t copies, std::int64_t bytes) {
  f.add({copies, model::param_count(h, ep).total}, bytes);
}

// train_hybrid: a step's tokens are at most seqs_per_step rows of max_len (+ padding to 2*cp).
// Parameters: master weights, AdamW moments and widened gradients in the master dtype (fp32 for
// bf16), the step's compute copy and gradients; rank 0's cp=1 replica holds the whole set again.
inline Footprint train_footprint(const Deck& d, const model::HybridConfig& h, int cp, int ep) {
  Footprint t("data.seqs_per_step, data.max_len");
  const std::int64_t T = t.mul(d.get_int("data.seqs_per_step"), d.get_int("data.max_len") + 2 * cp);
  Footprint f = hybrid_footprint(h, T, dtype_bytes(d), "data.seqs_per_step, data.max_len and the model sizes");
  const std::int64_t es = dtype_bytes(d), ms = std::max<std::int64_t>(es, 4);
  add_parameters(f, h, ep, 4, ms);
  add_parameters(f, h, ep, 2, es);
  if (d.get_bool("train.reference")) {
    add_parameters(f, h, 1, 4, ms);
    add_parameters(f, h, 1, 2, es);
  }
  return f;
}

}  // namespace hcp::drivers
