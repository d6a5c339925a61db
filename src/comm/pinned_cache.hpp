// Page-locked host buffers kept for reuse by the host-staged MPI path (MpiCommunicator): pinning
// memory costs about as much as copying it several times, and freeing it synchronises the device,
// so a staged call takes a cached buffer instead of pinning and freeing its own.
#pragma once
#include <cstddef>
#include <vector>

namespace hcp {

class PinnedCache {
 public:
  using Alloc = void* (*)(std::size_t);
  using Free = void (*)(void*);
  PinnedCache(Alloc alloc, Free free) : alloc_(alloc), free_(free) {}
  ~PinnedCache();
  PinnedCache(const PinnedCache&) = delete;
  PinnedCache& operator=(const PinnedCache&) = delete;
  // A buffer of at least `bytes`: the smallest idle one that holds them, else a new one of the
  // next power of two (at least 64 KiB), so that sizes that vary a little from call to call reuse
  // one buffer. It stays taken until give().
  void* take(std::size_t bytes);
  void give(void* p);
  std::size_t held_bytes() const;  // pinned bytes in the cache, taken or idle
  std::size_t buffers() const { return bufs_.size(); }

 private:
  struct Buf {
    void* p;
    std::size_t capacity;
    bool taken;
  };
  Alloc alloc_;
  Free free_;
  std::vector<Buf> bufs_;
};

}  // namespace hcp
