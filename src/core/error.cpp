#include "core/error.hpp"

namespace hcp::detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg) {
  std::string f(file);
  auto pos = f.rfind("/src/");
  if (pos == std::string::npos) pos = f.rfind("/kernels/");
  if (pos == std::string::npos) pos = f.rfind("/drivers/");
  if (pos != std::string::npos) f = f.substr(pos + 1);
  throw Error(f + ":" + std::to_string(line) + ": " + msg);
}
[[noreturn]] void throw_input_error(const std::string& where, const std::string& msg) {
  throw Error(where + ": " + msg);
}
}  // namespace hcp::detail
