// DISTGNN_CHECK(cond, parts...): TORCH_CHECK with the message assembled here, without iostreams, and handed to
// torch as a C string.
//
// TORCH_CHECK with arguments formats them through std::ostringstream in the extension's own code; in a JIT
// extension built with the GPU machines' image (torch 2.11, g++ 13.3) constructing an ostringstream segfaults, so
// the process died where an error was due (tests/test_gather_cuda.py and tests/test_sampling_gpu.py raise some).
// Message parts: C strings, std::string, integers, floats, bools, c10::Device, c10::ScalarType, IntArrayRef.
#pragma once

#include <cstdio>
#include <string>
#include <type_traits>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

namespace distgnn::detail {

inline void append(std::string& out, const char* part) { out += part == nullptr ? "(null)" : part; }
inline void append(std::string& out, const std::string& part) { out += part; }
inline void append(std::string& out, bool part) { out += part ? "true" : "false"; }
inline void append(std::string& out, c10::ScalarType part) { out += c10::toString(part); }
inline void append(std::string& out, const c10::Device& part) {
  out += c10::DeviceTypeName(part.type(), /*lower_case=*/true);
  if (part.has_index()) out += ":" + std::to_string(int(part.index()));
}
inline void append(std::string& out, c10::IntArrayRef part) {
  out += "[";
  for (size_t i = 0; i < part.size(); ++i) out += (i ? ", " : "") + std::to_string(part[i]);
  out += "]";
}
template <typename Number, typename = std::enable_if_t<std::is_arithmetic_v<Number>>>
void append(std::string& out, Number part) {
  if constexpr (std::is_floating_point_v<Number>) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g", double(part));
    out += text;
  } else {
    out += std::to_string(part);
  }
}

template <typename... Parts>
std::string check_message(const Parts&... parts) {
  std::string out;
  (append(out, parts), ...);
  return out;
}

}  // namespace distgnn::detail

#define DISTGNN_CHECK(cond, ...)                                                                  \
  do {                                                                                            \
    if (C10_UNLIKELY(!(cond))) {                                                                  \
      const std::string distgnn_check_message_ = ::distgnn::detail::check_message(__VA_ARGS__);   \
      TORCH_CHECK(false, distgnn_check_message_.c_str());                                         \
    }                                                                                             \
  } while (false)
