// Output buffers that skip zero-filling: every element is written by a
// kernel right after allocation, and zeroing tens of MB per call is not free.
#pragma once

#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace distgnn {

template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}

  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-initialisation: no zeroing
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
using OutputVector = std::vector<T, UninitializedAllocator<T>>;

}  // namespace distgnn
