// The memory model's arithmetic: a rank's tensor bytes as named parts, each held on every rank or on
// rank 0 (the cp=1 reference), built from the deck's sizes by overflow-checked products. The
// strategies' records (cp/strategy.hpp, model/mamba2_strategy.hpp) give their terms in it; the
// drivers' models (drivers/memory_model.hpp) add them up, admit or refuse a run, and print it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "core/error.hpp"

namespace hcp {

// Where a part lives: on every rank; on rank 0 while the CP cases run (kept reference results); on
// rank 0 before them (the reference's own step, freed before the CP cases begin).
enum class Holder { EveryRank, Rank0Kept, Rank0Before };

struct MemoryPart {
  std::string name;
  Holder holder = Holder::EveryRank;
  std::int64_t bytes = 0;
};

class MemoryModel {
 public:
  // `keys`: the deck keys the sizes come from (named when a product overflows or a part does not fit).
  explicit MemoryModel(std::string keys) : keys_(std::move(keys)) {}
  // Adds to part `name` the product of `factors` times `bytes_per` (refused when it overflows 64 bits).
  MemoryModel& add(const std::string& name, std::initializer_list<std::int64_t> factors, std::int64_t bytes_per = 1,
                   Holder h = Holder::EveryRank) {
    std::int64_t v = bytes_per;
    for (std::int64_t f : factors) v = mul(v, f);
    for (MemoryPart& p : parts_)
      if (p.name == name && p.holder == h) {
        p.bytes = sum(p.bytes, v);
        return *this;
      }
    parts_.push_back({name, h, v});
    return *this;
  }
  std::int64_t mul(std::int64_t a, std::int64_t b) const {
    std::int64_t r = 0;
    HCP_INPUT_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &r), keys_, overflow());
    return r;
  }
  std::int64_t sum(std::int64_t a, std::int64_t b) const {
    HCP_INPUT_CHECK(a <= std::numeric_limits<std::int64_t>::max() - b, keys_, overflow());
    return a + b;
  }
  // Closes the model: 2 % of every part for the small tensors the terms leave out (index lists, LSE
  // rows, per-head vectors) and the allocator's rounding.
  MemoryModel& with_slack() {
    std::vector<MemoryPart> slack;
    for (const MemoryPart& p : parts_) {
      auto it = std::find_if(slack.begin(), slack.end(), [&](const MemoryPart& s) { return s.holder == p.holder; });
      if (it == slack.end()) slack.push_back({"small tensors (2 %)", p.holder, 0}), it = slack.end() - 1;
      it->bytes = sum(it->bytes, p.bytes / 50);
    }
    for (MemoryPart& s : slack) add(s.name, {s.bytes}, 1, s.holder);
    return *this;
  }
  std::int64_t total(Holder h) const {
    std::int64_t t = 0;
    for (const MemoryPart& p : parts_)
      if (p.holder == h) t = sum(t, p.bytes);
    return t;
  }
  // What every rank holds in a CP case.
  std::int64_t every_rank() const { return total(Holder::EveryRank); }
  // Rank 0's high-water: its reference step before the cases, or the kept results beside a case.
  std::int64_t rank0() const {
    return std::max(total(Holder::Rank0Before), sum(total(Holder::Rank0Kept), every_rank()));
  }
  std::int64_t peak() const { return std::max(every_rank(), rank0()); }
  bool reference_held() const { return total(Holder::Rank0Before) + total(Holder::Rank0Kept) > 0; }
  const std::vector<MemoryPart>& parts() const { return parts_; }
  const std::string& keys() const { return keys_; }

 private:
  std::string overflow() const { return "these sizes give a tensor size that overflows 64 bits"; }
  std::string keys_;
  std::vector<MemoryPart> parts_;
};

}  // namespace hcp
