#include "comm/pinned_cache.hpp"

#include "core/error.hpp"

namespace hcp {

PinnedCache::~PinnedCache() {
  for (const Buf& b : bufs_) free_(b.p);
}

void* PinnedCache::take(std::size_t bytes) {
  Buf* best = nullptr;
  for (Buf& b : bufs_)
    if (!b.taken && b.capacity >= bytes && (!best || b.capacity < best->capacity)) best = &b;
  if (!best) {
    std::size_t cap = std::size_t{1} << 16;
    while (cap < bytes) cap <<= 1;
    bufs_.push_back({alloc_(cap), cap, false});
    best = &bufs_.back();
  }
  best->taken = true;
  return best->p;
}

void PinnedCache::give(void* p) {
  for (Buf& b : bufs_)
    if (b.p == p) {
      HCP_CHECK(b.taken, "PinnedCache::give: buffer was not taken");
      b.taken = false;
      return;
    }
  HCP_FAIL("PinnedCache::give: buffer not from this cache");
}

std::size_t PinnedCache::held_bytes() const {
  std::size_t n = 0;
  for (const Buf& b : bufs_) n += b.capacity;
  return n;
}

}  // namespace hcp
