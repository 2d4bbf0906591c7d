// Internal helpers shared by the MhaBackend translation units (mha_backend.cpp,
// forward.cpp, graph_state.cpp, registry.cpp, field_checks.cpp): argument errors, checks
// of the batch and layer fields, and the int32 metadata buffers the backend owns.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/tensor.h"

namespace pagedmha::backend_detail {

inline std::string str(int64_t v) { return std::to_string(v); }

// The public call the user made ("create_backend", "MhaBackend.forward_decode", ...):
// every error of the backend starts with it. The outermost scope wins, so the constructor
// run by create_backend, and register_layers run by the constructor, name the user's call.
class CallScope {
 public:
  explicit CallScope(const char* call) : outer_(slot()) {
    if (outer_ == nullptr) slot() = call;
  }
  ~CallScope() { slot() = outer_; }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  /// The active call, else `fallback`.
  static const char* name(const char* fallback = "MhaBackend") { return slot() ? slot() : fallback; }

 private:
  static const char*& slot() {
    static thread_local const char* call = nullptr;
    return call;
  }
  const char* outer_;
};

[[noreturn]] inline void fail(const std::string& arg, const std::string& expected, const std::string& given) {
  throw_invalid_argument(CallScope::name(), arg, expected, given);
}

// For the handler of a public entry point (`call`: its own name): rethrows `e` so that it
// starts with the user's call; an inner op's error ("append_kv: k: ...") gets it in front.
[[noreturn]] inline void rethrow_in_call(const Error& e, const char* call) {
  const std::string head = std::string(CallScope::name(call)) + ": ";
  const std::string m = e.what();
  if (m.compare(0, head.size(), head) == 0) throw e;
  throw Error(head + m);
}

/// Where the rows an op ran on start in the user's step: nonzero when a mixed step's
/// decode rows are checked as a batch of their own (their request 0 is the step's request
/// `request`, their q row 0 its row `row`).
struct RowOrigin {
  int64_t request = 0, row = 0;
};

// Runs op `f` (named `op` in its errors) on the user's arguments under the op's parameter
// names: an error about parameter p names the user's call and argument args[p] instead
// ({"seq_lens", "batch.seq_lens"}); other errors get the call in front. With a nonzero
// `origin` the error also says where its request and q-row indices start (formatted only
// when an error is thrown: this runs on every forward call).
template <class F>
void with_user_args(const char* op, std::initializer_list<std::pair<const char*, std::string>> args, F&& f,
                    RowOrigin origin = {}) {
  try {
    f();
  } catch (const Error& e) {
    const std::string m = e.what(), head = std::string(op) + ": ", call = std::string(CallScope::name()) + ": ";
    const std::string tail =
        origin.request == 0 ? std::string()
                            : " (request indices and q rows count from the step's decode rows: their request 0 is "
                              "request " + std::to_string(origin.request) + " of the batch, their q row 0 is row " +
                                  std::to_string(origin.row) + "; token indices are the step's)";
    if (m.compare(0, call.size(), call) == 0) {
      if (tail.empty()) throw;  // already names the user's call
      throw Error(m + tail);
    }
    if (m.compare(0, head.size(), head) == 0) {
      const std::size_t end = m.find(": ", head.size());
      const std::string param = m.substr(head.size(), end == std::string::npos ? 0 : end - head.size());
      for (const auto& [name, user] : args) {
        if (param == name) throw Error(std::string(CallScope::name()) + ": " + user + m.substr(end) + tail);
      }
    }
    throw Error(std::string(CallScope::name()) + ": " + m + tail);
  }
}

// int32 [n] view of b starting at element offset.
inline TensorView vec(const Buffer& b, int64_t offset, int64_t n) {
  return TensorView(static_cast<int32_t*>(b.data()) + offset, DType::int32, b.device(), {n});
}

// int32 [rows, cols] row-major view of b.
inline TensorView mat(const Buffer& b, int64_t rows, int64_t cols) {
  return TensorView(b.data(), DType::int32, b.device(), {rows, cols});
}

// Zero-filled buffer of n_int32 int32 values (at least one, so data() is never null).
inline Buffer zeros(int64_t n_int32, Device dev, Stream s) {
  Buffer b(static_cast<std::size_t>(std::max<int64_t>(n_int32, 1)) * 4, dev);
  fill_bytes(b.data(), dev, 0, b.bytes(), s);
  return b;
}

// ---- Checks of batch and layer fields (field_checks.cpp) ----

/// A float as the user would write it ("0", "-1", "inf", "nan"; str() takes integers).
std::string float_str(float v);
/// int32 [>= min_len], contiguous, on `dev`.
void check_int32_vector(const TensorView& t, const char* arg, Device dev, int64_t min_len);
/// int32 [>= min_rows, cols] on `dev`.
void check_int32_matrix(const TensorView& t, const std::string& arg, Device dev, int64_t min_rows);
/// Host int32 values t[0..n) of a CPU tensor (any stride).
std::vector<int32_t> host_values(const TensorView& t, const char* arg, int64_t n);
/// [T, H * D] or [T, H, D] (last dim contiguous) viewed as [T, H, D].
TensorView rows3(const TensorView& t, int heads, int head_dim, const char* arg);
/// A layer geometry the kernels support, named as the user gave it (`prefix` + field), so
/// that no inner call (decode_workspace_size) reports it under its own name.
void check_geometry(int num_q_heads, int num_kv_heads, int head_dim, const std::string& prefix);

}  // namespace pagedmha::backend_detail
