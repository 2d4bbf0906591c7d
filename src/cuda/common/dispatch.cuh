// The one place that maps the runtime (head dim, query dtype, cache dtype) of an
// attention problem onto the compiled instantiations.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>
#include <type_traits>

#include "core/problem.h"
#include "pagedmha/error.h"

namespace pagedmha::cuda {

template <class T>
struct TypeTag {
  using type = T;
};

/// Calls f(std::integral_constant<int, D>, TypeTag<T>, TypeTag<KV>) with T the output
/// and mma type (bf16 / fp16: the query dtype, or the out dtype for fp8 queries, which
/// the kernels convert to T exactly when loading them: AttentionArgs::q_fp8) and KV the
/// cache type (T or fp8 e4m3).
template <class F>
void dispatch_attention(const char* op, const detail::AttentionProblem& p, F&& f) {
  const DType t_dtype = p.q_dtype == DType::fp8_e4m3 ? p.out_dtype : p.q_dtype;
  if (p.q_dtype == DType::fp8_e4m3 && p.kv.dtype != DType::fp8_e4m3) {
    throw Error(std::string(op) + ": q: fp8_e4m3 queries need an fp8_e4m3 cache");
  }
  auto with_kv = [&](auto d, auto t) {
    if (p.kv.dtype == DType::fp8_e4m3) {
      f(d, t, TypeTag<__nv_fp8_e4m3>{});
    } else {
      f(d, t, t);
    }
  };
  auto with_type = [&](auto d) {
    if (t_dtype == DType::bf16) {
      with_kv(d, TypeTag<__nv_bfloat16>{});
    } else {
      with_kv(d, TypeTag<__half>{});
    }
  };
  switch (p.head_dim) {
    case 64: with_type(std::integral_constant<int, 64>{}); break;
    case 128: with_type(std::integral_constant<int, 128>{}); break;
    case 256: with_type(std::integral_constant<int, 256>{}); break;
    default: throw Error(std::string(op) + ": head_dim: expected 64, 128 or 256, got " + std::to_string(p.head_dim));
  }
}

}  // namespace pagedmha::cuda
