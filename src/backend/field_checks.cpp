// Checks of the batch and layer fields an engine passes the backend (shapes, dtypes,
// devices, host values), their errors naming the field as the user set it.
#include <sstream>

#include "backend/buffers.h"

namespace pagedmha::backend_detail {

std::string float_str(float v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void check_int32_vector(const TensorView& t, const char* arg, Device dev, int64_t min_len) {
  if (!t.defined()) fail(arg, "an int32 tensor of at least " + str(min_len) + " elements", "undefined");
  if (t.dtype != DType::int32) fail(arg, "dtype int32", dtype_name(t.dtype));
  if (t.ndim != 1) fail(arg, "a 1-d tensor", t.shape_str());
  if (!(t.device == dev)) fail(arg, "device " + dev.str(), t.device.str());
  if (t.size(0) < min_len) fail(arg, "at least " + str(min_len) + " elements", t.shape_str());
  if (t.size(0) > 1 && t.stride(0) != 1) fail(arg, "a contiguous tensor", "stride " + str(t.stride(0)));
}

void check_int32_matrix(const TensorView& t, const std::string& arg, Device dev, int64_t min_rows) {
  if (!t.defined()) fail(arg, "an int32 [rows, cols] tensor", "undefined");
  if (t.dtype != DType::int32) fail(arg, "dtype int32", dtype_name(t.dtype));
  if (t.ndim != 2) fail(arg, "a 2-d tensor", t.shape_str());
  if (!(t.device == dev)) fail(arg, "device " + dev.str(), t.device.str());
  if (t.size(0) < min_rows) fail(arg, "at least " + str(min_rows) + " rows", t.shape_str());
}

std::vector<int32_t> host_values(const TensorView& t, const char* arg, int64_t n) {
  if (t.dtype != DType::int32) fail(arg, "dtype int32", dtype_name(t.dtype));
  if (!t.device.is_cpu()) fail(arg, "a host (cpu) tensor", t.device.str());
  if (t.ndim != 1 || t.size(0) < n) fail(arg, "shape [>= " + str(n) + "]", t.shape_str());
  std::vector<int32_t> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = t.ptr<const int32_t>()[i * t.stride(0)];
  return v;
}

TensorView rows3(const TensorView& t, int heads, int head_dim, const char* arg) {
  if (!t.defined()) fail(arg, "a tensor [T, " + str(int64_t{heads} * head_dim) + "]", "undefined");
  if (t.ndim == 3) {
    if (t.size(1) != heads || t.size(2) != head_dim) {
      fail(arg, "shape [T, " + str(heads) + ", " + str(head_dim) + "]", t.shape_str());
    }
    return t;
  }
  if (t.ndim != 2 || t.size(1) != int64_t{heads} * head_dim) {
    fail(arg, "shape [T, " + str(int64_t{heads} * head_dim) + "]", t.shape_str());
  }
  if (t.stride(1) != 1 && t.size(1) > 1) fail(arg, "a contiguous last dim", "stride " + str(t.stride(1)));
  return TensorView(t.data, t.dtype, t.device, {t.size(0), heads, head_dim}, {t.stride(0), head_dim, 1});
}

void check_geometry(int num_q_heads, int num_kv_heads, int head_dim, const std::string& prefix) {
  if (num_kv_heads < 1) fail(prefix + "num_kv_heads", ">= 1", str(num_kv_heads));
  if (num_q_heads < 1 || num_q_heads % num_kv_heads != 0) {
    fail(prefix + "num_q_heads", "a positive multiple of num_kv_heads " + str(num_kv_heads), str(num_q_heads));
  }
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) fail(prefix + "head_dim", "64, 128 or 256", str(head_dim));
}

}  // namespace pagedmha::backend_detail
