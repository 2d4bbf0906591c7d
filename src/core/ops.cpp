// The validating front end: every op checks its arguments once, resolves a
// detail::*Problem and hands it to exactly one device implementation. The metadata ops
// are in metadata_ops.cpp.
#include "pagedmha/ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/checks.h"
#include "core/problem.h"
#include "core/validate.h"
#include "cpu/convert.h"
#include "cpu/cpu_ops.h"
#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#if PAGEDMHA_WITH_CUDA
#include "cuda/cuda_ops.h"
#endif

namespace pagedmha {

using detail::ArgCheck;
using detail::ceil_div;
using detail::str;

namespace {

std::atomic<bool> g_debug_validation{false};

using detail::Named;

// Devices are checked first: a tensor on the wrong device must not be dereferenced.
void same_device(const ArgCheck& chk, Device dev, std::initializer_list<Named> tensors) {
  for (const auto& [t, name] : tensors) {
    if (t->defined()) chk.device(*t, name, dev);
  }
}

// The parts of batch_decode / batch_prefill that do not depend on how queries are
// grouped into requests. `batch` comes from seq_lens. `extra` is the op's own tensor
// (workspace or cu_seqlens_q), device-checked with the rest before anything is read.
detail::AttentionProblem resolve_attention(const ArgCheck& chk, const TensorView& q, const TensorView& k_cache,
                                           const TensorView& v_cache, const TensorView& page_table,
                                           const TensorView& seq_lens, int page_size, const TensorView& out,
                                           const AttentionParams& params, const TensorView& lse,
                                           Named extra) {
  chk.ndim(q, "q", 3);
  const Device dev = q.device;
  chk.device_supported(dev);
  same_device(chk, dev,
              {{&k_cache, "k_cache"}, {&v_cache, "v_cache"}, {&page_table, "page_table"}, {&seq_lens, "seq_lens"},
               {&out, "out"}, {&lse, "lse"}, {&params.sinks, "sinks"}, extra});

  chk.dtype_in(q, "q", {DType::bf16, DType::fp16, DType::fp8_e4m3});
  chk.last_dim_contiguous(q, "q");
  chk.aligned16(q, "q");
  const int rows = chk.int32_size(q, "q", 0);
  const int hq = chk.int32_size(q, "q", 1);

  detail::AttentionProblem p;
  p.kv = q.dtype == DType::fp8_e4m3
             ? detail::resolve_cache(chk, k_cache, v_cache, page_size, dev, {DType::fp8_e4m3})
             : detail::resolve_cache(chk, k_cache, v_cache, page_size, dev, {q.dtype, DType::fp8_e4m3});
  const int hkv = p.kv.num_kv_heads, d = p.kv.head_dim;
  chk.head_dim(q.size(2), "q");
  if (q.size(2) != d) chk.fail("q", "head dim " + str(d) + " (the cache's)", q.shape_str());
  if (hq < 1 || hq % hkv != 0) {
    chk.fail("q", "num_q_heads a multiple of num_kv_heads " + str(hkv), str(hq) + " heads " + q.shape_str());
  }

  chk.shape(out, "out", {rows, hq, d});
  if (q.dtype == DType::fp8_e4m3) {
    chk.dtype_in(out, "out", {DType::bf16, DType::fp16});
  } else {
    chk.dtype(out, "out", q.dtype);
  }
  chk.last_dim_contiguous(out, "out");
  chk.aligned16(out, "out");
  chk.no_self_overlap(out, "out");
  if (lse.defined()) {
    chk.shape(lse, "lse", {rows, hq});
    chk.dtype(lse, "lse", DType::fp32);
    chk.last_dim_contiguous(lse, "lse");
    chk.no_self_overlap(lse, "lse");
  }
  if (params.sinks.defined()) {
    chk.shape(params.sinks, "sinks", {hq});
    chk.dtype(params.sinks, "sinks", DType::fp32);
    chk.last_dim_contiguous(params.sinks, "sinks");
  }
  chk.scalar_finite(params.bmm1_scale, "bmm1_scale");
  chk.scalar_finite(params.bmm2_scale, "bmm2_scale");
  chk.int_at_least(params.window_left, "window_left", -1);
  chk.scalar_finite(params.logits_soft_cap, "logits_soft_cap");
  if (params.logits_soft_cap < 0.0f) chk.fail("logits_soft_cap", ">= 0 (0 disables)", str(params.logits_soft_cap));
  chk.int_at_least(params.num_splits, "num_splits", 0);
  chk.int_at_least(params.sm_margin, "sm_margin", 0);

  chk.int32_vector(seq_lens, "seq_lens", dev, -1);
  const int batch = chk.int32_size(seq_lens, "seq_lens", 0);
  chk.int32_matrix(page_table, "page_table", dev);
  if (page_table.size(0) != batch) {
    chk.fail("page_table", "shape [" + str(batch) + ", *] (one row per seq_lens entry)", page_table.shape_str());
  }
  const int page_table_cols = chk.int32_size(page_table, "page_table", 1);

  p.q = q.data;
  p.q_dtype = q.dtype;
  p.q_row_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.out = out.data;
  p.out_dtype = out.dtype;
  p.out_row_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  if (lse.defined()) {
    p.lse = lse.ptr<float>();
    p.lse_row_stride = lse.stride(0);
    p.lse_head_stride = lse.stride(1);
  }
  p.page_table = page_table.ptr<const int32_t>();
  p.page_table_row_stride = page_table.stride(0);
  p.page_table_cols = page_table_cols;
  p.seq_lens = seq_lens.ptr<const int32_t>();
  p.batch = batch;
  p.num_rows = rows;
  p.num_q_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim = d;
  p.bmm1_scale = params.bmm1_scale;
  p.bmm2_scale = params.bmm2_scale;
  p.window_left = params.window_left;
  p.logits_soft_cap = params.logits_soft_cap;
  p.sinks = params.sinks.defined() ? params.sinks.ptr<const float>() : nullptr;
  p.causal = params.causal;
  p.num_splits = params.num_splits;
  p.sm_margin = params.sm_margin;
  p.device = dev;
  return p;
}

// Host-side value checks of an attention problem whose metadata lives on the CPU.
void check_attention_values(const ArgCheck& chk, const detail::AttentionProblem& p) {
  chk.non_negative(p.seq_lens, p.batch, "seq_lens");
  if (p.cu_seqlens_q) {
    chk.prefix_sums(p.cu_seqlens_q, p.batch, p.num_rows, "cu_seqlens_q");
    for (int b = 0; b < p.batch; ++b) {
      const int n = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
      if (n > p.max_q_len) {
        chk.fail("max_q_len", ">= every query length (request " + str(b) + " has " + str(n) + ")", str(p.max_q_len));
      }
    }
  }
  if (p.sinks) {
    for (int h = 0; h < p.num_q_heads; ++h) {
      const float s = p.sinks[h];
      if (std::isnan(s) || s == std::numeric_limits<float>::infinity()) {
        chk.fail("sinks", "finite values or -inf", str(s) + " at index " + str(h));
      }
    }
  }
  const int64_t P = p.kv.page_size;
  for (int b = 0; b < p.batch; ++b) {
    const int64_t n = p.cu_seqlens_q ? p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b] : p.q_len_per_req;
    const int64_t L = p.seq_lens[b];
    if (n == 0 || L == 0) continue;  // reads no page
    const int64_t needed = ceil_div(L, P);
    if (needed > p.page_table_cols) {
      chk.fail("page_table", "at least ceil(seq_lens[" + str(b) + "] / page_size) = " + str(needed) + " columns",
               str(p.page_table_cols) + " columns");
    }
    // With a window, pages wholly before the first visible key are never read.
    const int64_t first_key = p.mask().first_key(L, n);
    const int32_t* row = p.page_table + b * p.page_table_row_stride;
    for (int64_t c = first_key / P; c < needed; ++c) {
      if (row[c] < 0 || row[c] >= p.kv.num_pages) {
        chk.fail("page_table", "page ids in [0, " + str(p.kv.num_pages) + ") for the pages read",
                 str(row[c]) + " at [" + str(b) + ", " + str(c) + "]");
      }
    }
  }
}

// The input range inside which no finite input overflows fp32 (docs/semantics.md):
// |q_i k_i| <= 2^112 keeps every dot product of D <= 256 terms finite, and sums of up to
// 2^31 weights <= 1 times |v| <= 2^56 stay finite.
constexpr float kMaxInputMagnitude = 72057594037927936.0f;  // 2^56

// Debug validation on the CPU: q and the K / V rows a request reads are in range. With
// `pending` (a step's write not made yet) a key in a slot it writes is read from its new
// row instead (fp8 caches: quantised on the write, so in range).
void check_input_range(const ArgCheck& chk, const detail::AttentionProblem& p,
                       const detail::PendingRows* pending = nullptr) {
  const int D = p.head_dim;
  std::vector<float> row(static_cast<std::size_t>(D));
  const auto in_range = [&](const void* base, DType t, int64_t off) {
    if (t == DType::fp8_e4m3) return true;  // e4m3 is within +-448
    cpu::load_row(cpu::offset(base, t, off), t, D, row.data());
    for (float x : row) {
      if (!(std::fabs(x) <= kMaxInputMagnitude)) return false;  // NaN fails too
    }
    return true;
  };
  const char* expect = "finite values of magnitude <= 2^56 (docs/semantics.md: larger ones may overflow fp32)";
  for (int b = 0; b < p.batch; ++b) {
    const int64_t row0 = p.cu_seqlens_q ? p.cu_seqlens_q[b] : int64_t{b} * p.q_len_per_req;
    const int64_t n = p.cu_seqlens_q ? p.cu_seqlens_q[b + 1] - row0 : p.q_len_per_req;
    for (int64_t i = 0; i < n; ++i)
      for (int h = 0; h < p.num_q_heads; ++h)
        if (!in_range(p.q, p.q_dtype, (row0 + i) * p.q_row_stride + h * p.q_head_stride))
          chk.fail("q", expect, "a value outside that range at row " + str(row0 + i) + ", head " + str(h));
    const int64_t L = p.seq_lens[b];
    if (n == 0 || L <= 0) continue;
    const int32_t* table = p.page_table + b * p.page_table_row_stride;
    for (int64_t j = p.mask().first_key(L, n); j < L; ++j) {
      const int64_t page = table[j / p.kv.page_size], off = j % p.kv.page_size;
      const int64_t w = pending != nullptr ? pending->find(page * p.kv.page_size + off) : -1;
      for (int h = 0; h < p.num_kv_heads; ++h) {
        for (int c = 0; c < 2; ++c) {
          if (w >= 0) {
            if (p.kv.dtype == DType::fp8_e4m3) continue;
            const int64_t t = pending->tokens[static_cast<std::size_t>(w)];
            const int64_t at = c == 0 ? t * pending->k_row_stride + h * pending->k_head_stride
                                      : t * pending->v_row_stride + h * pending->v_head_stride;
            if (!in_range(c == 0 ? pending->k : pending->v, pending->dtype, at)) {
              chk.fail(c == 0 ? "k" : "v", expect,
                       "a value outside that range at token " + str(t) + " (key " + str(j) + " of request " +
                           str(b) + ")");
            }
            continue;
          }
          const detail::PagedCache& pc = c == 0 ? p.kv.k : p.kv.v;
          if (!in_range(pc.data, p.kv.dtype, page * pc.page_stride + off * pc.token_stride + h * pc.head_stride)) {
            chk.fail(c == 0 ? "k_cache" : "v_cache", expect,
                     "a value outside that range at key " + str(j) + " of request " + str(b));
          }
        }
      }
    }
  }
}

void run_attention(const ArgCheck& chk, detail::AttentionProblem& p, bool decode) {
  if (p.device.is_cpu()) {
    check_attention_values(chk, p);
    if (debug_validation()) check_input_range(chk, p);
    cpu::attention(p);
    return;
  }
#if PAGEDMHA_WITH_CUDA
  if (debug_validation()) {
    cuda::validate_page_ids(p);
    cuda::validate_values(p, kMaxInputMagnitude);
  }
  if (decode) {
    cuda::batch_decode(p);
  } else {
    cuda::batch_prefill(p);
  }
#else
  (void)decode;
#endif
}

// Debug validation for a caller that writes the step's K / V before the op runs
// (MhaBackend): the checks run_attention makes on the values, made before that write, on
// what the op will read after it (a written slot's key from its new row). A rejected step
// then leaves the cache unchanged, and a new row that no query reads (padding) is not
// judged. A write whose views append_kv would reject is left out: its error comes there.
void check_values_before_write(const ArgCheck& chk, const detail::AttentionProblem& p,
                               const detail::PendingWrite& write) {
  if (!debug_validation() || p.batch == 0) return;
  detail::PendingRows pending;
  const TensorView &s = write.slots, &k = write.k, &v = write.v;
  const auto rows_ok = [&](const TensorView& x) {
    return x.defined() && x.ndim == 3 && x.size(0) >= s.numel() && x.size(1) == p.num_kv_heads &&
           x.size(2) == p.head_dim && (x.dtype == DType::bf16 || x.dtype == DType::fp16) && x.dtype == k.dtype &&
           x.device == p.device && (x.size(2) <= 1 || x.stride(2) == 1);
  };
  const bool usable = s.defined() && s.dtype == DType::int32 && s.ndim == 1 && s.device == p.device &&
                      (s.numel() <= 1 || s.stride(0) == 1) && rows_ok(k) && rows_ok(v);
  if (usable && s.numel() > 0) {
    std::vector<int32_t> slots(static_cast<std::size_t>(s.numel()));
    copy_bytes(slots.data(), Device::cpu(), s.data, s.device, slots.size() * 4, Stream{p.stream});
    synchronize(Stream{p.stream});
    std::vector<std::pair<int32_t, int32_t>> by_slot;  // (slot, token): the later token wins
    for (std::size_t t = 0; t < slots.size(); ++t) by_slot.emplace_back(slots[t], static_cast<int32_t>(t));
    std::sort(by_slot.begin(), by_slot.end());
    for (std::size_t i = 0; i < by_slot.size(); ++i) {
      if (i + 1 < by_slot.size() && by_slot[i + 1].first == by_slot[i].first) continue;
      pending.slots.push_back(by_slot[i].first);
      pending.tokens.push_back(by_slot[i].second);
    }
    pending.k = k.data, pending.v = v.data, pending.dtype = k.dtype;
    pending.k_row_stride = k.stride(0), pending.k_head_stride = k.stride(1);
    pending.v_row_stride = v.stride(0), pending.v_head_stride = v.stride(1);
  }
  if (p.device.is_cpu()) {
    check_input_range(chk, p, &pending);  // check_attention_values ran already (the front end's checks)
    return;
  }
#if PAGEDMHA_WITH_CUDA
  cuda::validate_page_ids(p);
  cuda::validate_values(p, kMaxInputMagnitude, &pending);
#endif
}

}  // namespace

void set_debug_validation(bool enabled) { g_debug_validation.store(enabled, std::memory_order_relaxed); }
bool debug_validation() { return g_debug_validation.load(std::memory_order_relaxed); }

void append_kv(const TensorView& k, const TensorView& v, const TensorView& k_cache, const TensorView& v_cache,
               const TensorView& out_cache_loc, int page_size, float k_scale, float v_scale, Stream stream) {
  const ArgCheck chk("append_kv");
  chk.ndim(k, "k", 3);
  const Device dev = k.device;
  chk.device_supported(dev);
  same_device(chk, dev, {{&v, "v"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"}, {&out_cache_loc, "out_cache_loc"}});
  chk.dtype_in(k, "k", {DType::bf16, DType::fp16});
  chk.shape(v, "v", {k.size(0), k.size(1), k.size(2)});
  chk.dtype(v, "v", k.dtype);
  chk.last_dim_contiguous(k, "k");
  chk.last_dim_contiguous(v, "v");
  chk.aligned16(k, "k");
  chk.aligned16(v, "v");
  detail::AppendKvProblem p;
  p.kv = detail::resolve_cache(chk, k_cache, v_cache, page_size, dev, {k.dtype, DType::fp8_e4m3});
  // Written caches: one slot's head row must not alias another's, nor K alias V.
  chk.no_self_overlap(k_cache, "k_cache");
  chk.no_self_overlap(v_cache, "v_cache");
  if (k_cache.data == v_cache.data && k_cache.numel() > 0) {
    chk.fail("v_cache", "memory distinct from k_cache (append_kv writes both)", "the same base pointer as k_cache");
  }
  chk.disjoint(v_cache, "v_cache", k_cache, "k_cache");
  if (k.size(1) != p.kv.num_kv_heads || k.size(2) != p.kv.head_dim) {
    chk.fail("k", "shape [*, " + str(p.kv.num_kv_heads) + ", " + str(p.kv.head_dim) + "] (the cache's heads)",
             k.shape_str());
  }
  chk.int32_vector(out_cache_loc, "out_cache_loc", dev, k.size(0));
  for (const auto& [w, name] : {Named{&k_cache, "k_cache"}, Named{&v_cache, "v_cache"}}) {
    chk.disjoint_from_inputs(*w, name, {{&k, "k"}, {&v, "v"}, {&out_cache_loc, "out_cache_loc"}});
  }
  for (const auto& [s, name] : {std::pair{k_scale, "k_scale"}, std::pair{v_scale, "v_scale"}}) {
    if (!std::isfinite(s) || s <= 0.0f) chk.fail(name, "a finite value > 0", str(s));
  }

  p.k = k.data;
  p.v = v.data;
  p.src_dtype = k.dtype;
  p.k_row_stride = k.stride(0);
  p.k_head_stride = k.stride(1);
  p.v_row_stride = v.stride(0);
  p.v_head_stride = v.stride(1);
  p.out_cache_loc = out_cache_loc.ptr<const int32_t>();
  p.num_tokens = k.size(0);
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  p.device = dev;
  p.stream = stream.handle;
  if (p.num_tokens == 0) return;

  if (dev.is_cpu()) {
    const int64_t num_slots = p.kv.num_pages * page_size;
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      const int32_t s = p.out_cache_loc[t];
      if (s < 0 || s >= num_slots) {
        chk.fail("out_cache_loc", "slots in [0, " + str(num_slots) + ")", str(s) + " at index " + str(t));
      }
    }
    cpu::append_kv(p);
    return;
  }
#if PAGEDMHA_WITH_CUDA
  if (debug_validation()) cuda::validate_slots(p);
  cuda::append_kv(p);
#endif
}

namespace {

// What an attention op writes (out, lse, the workspace; absent ones skipped) shares no
// memory with anything else it writes or reads.
void written_apart(const ArgCheck& chk, std::initializer_list<Named> writes, std::initializer_list<Named> reads) {
  for (auto w = writes.begin(); w != writes.end(); ++w) {
    if (!w->first->defined()) continue;
    for (auto o = std::next(w); o != writes.end(); ++o) {
      if (o->first->defined()) chk.disjoint(*o->first, o->second, *w->first, w->second);
    }
    chk.disjoint_from_inputs(*w->first, w->second, reads);
  }
}

// batch_decode's checks (all but the device-side values): the problem to run.
detail::AttentionProblem resolve_decode(const ArgCheck& chk, const TensorView& q, const TensorView& k_cache,
                                        const TensorView& v_cache, const TensorView& page_table,
                                        const TensorView& seq_lens, int page_size, int q_len_per_req,
                                        const TensorView& out, const AttentionParams& params, const TensorView& lse,
                                        const TensorView& workspace) {
  detail::AttentionProblem p = resolve_attention(chk, q, k_cache, v_cache, page_table, seq_lens, page_size, out,
                                                 params, lse, {&workspace, "workspace"});
  chk.int_at_least(q_len_per_req, "q_len_per_req", 1);
  if (p.num_rows != static_cast<int64_t>(p.batch) * q_len_per_req) {
    chk.fail("q", str(p.batch) + " requests (seq_lens) x q_len_per_req " + str(q_len_per_req) + " = " +
                      str(static_cast<int64_t>(p.batch) * q_len_per_req) + " rows",
             q.shape_str());
  }
  p.q_len_per_req = q_len_per_req;
  p.max_q_len = q_len_per_req;
  p.causal = true;  // params.causal is a batch_prefill option
  if (workspace.defined()) {
    chk.ndim(workspace, "workspace", 1);
    chk.dtype(workspace, "workspace", DType::uint8);
    chk.last_dim_contiguous(workspace, "workspace");
    p.workspace = workspace.data;
    p.workspace_bytes = static_cast<std::size_t>(workspace.size(0));
  }
  written_apart(chk, {{&out, "out"}, {&lse, "lse"}, {&workspace, "workspace"}},
                {{&q, "q"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"}, {&page_table, "page_table"},
                 {&seq_lens, "seq_lens"}, {&params.sinks, "sinks"}});
  const std::size_t need = decode_workspace_size(p.device, p.batch, q_len_per_req, p.num_q_heads, p.num_kv_heads,
                                                 p.head_dim);
  if (p.workspace_bytes < need) {
    chk.fail("workspace", "at least " + std::to_string(need) + " bytes (decode_workspace_size)",
             std::to_string(p.workspace_bytes) + " bytes");
  }
  return p;
}

}  // namespace

void batch_decode(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                  const TensorView& page_table, const TensorView& seq_lens, int page_size, int q_len_per_req,
                  const TensorView& out, const AttentionParams& params, const TensorView& lse,
                  const TensorView& workspace, Stream stream) {
  const ArgCheck chk("batch_decode");
  detail::AttentionProblem p = resolve_decode(chk, q, k_cache, v_cache, page_table, seq_lens, page_size,
                                              q_len_per_req, out, params, lse, workspace);
  p.stream = stream.handle;
  if (p.batch == 0) {  // validated, then a no-op (docs/semantics.md section 8.1)
    if (p.device.is_cpu()) check_attention_values(chk, p);
    return;
  }
  run_attention(chk, p, /*decode=*/true);
}

std::size_t decode_workspace_size(Device device, int64_t batch, int q_len_per_req, int num_q_heads,
                                  int num_kv_heads, int head_dim) {
  const ArgCheck chk("decode_workspace_size");
  chk.device_supported(device);
  chk.int_at_least(batch, "batch", 0);
  chk.int_at_least(q_len_per_req, "q_len_per_req", 1);
  chk.int_at_least(num_kv_heads, "num_kv_heads", 1);
  if (num_q_heads < 1 || num_q_heads % num_kv_heads != 0) {
    chk.fail("num_q_heads", "a positive multiple of num_kv_heads " + str(num_kv_heads), str(num_q_heads));
  }
  chk.head_dim(head_dim, "head_dim");
  if (device.is_cpu()) return 0;
#if PAGEDMHA_WITH_CUDA
  return cuda::decode_workspace_size(device.index, batch, q_len_per_req, num_q_heads, num_kv_heads, head_dim);
#else
  return 0;
#endif
}

std::size_t prefill_workspace_size(Device device, int64_t batch, int64_t total_q) {
  const ArgCheck chk("prefill_workspace_size");
  chk.device_supported(device);
  chk.int_at_least(batch, "batch", 0);
  chk.int_at_least(total_q, "total_q", 0);
  if (device.is_cpu()) return 0;
#if PAGEDMHA_WITH_CUDA
  return cuda::prefill_workspace_size(batch, total_q);
#else
  return 0;
#endif
}

namespace {

// batch_prefill's checks (all but the device-side values): the problem to run.
detail::AttentionProblem resolve_prefill(const ArgCheck& chk, const TensorView& q, const TensorView& k_cache,
                                         const TensorView& v_cache, const TensorView& page_table,
                                         const TensorView& seq_lens, const TensorView& cu_seqlens_q, int page_size,
                                         int max_q_len, const TensorView& out, const AttentionParams& params,
                                         const TensorView& lse, const TensorView& workspace) {
  detail::AttentionProblem p = resolve_attention(chk, q, k_cache, v_cache, page_table, seq_lens, page_size, out,
                                                 params, lse, {&cu_seqlens_q, "cu_seqlens_q"});
  same_device(chk, p.device, {{&workspace, "workspace"}});
  chk.int32_vector(cu_seqlens_q, "cu_seqlens_q", p.device, static_cast<int64_t>(p.batch) + 1);
  chk.int_at_least(max_q_len, "max_q_len", p.num_rows > 0 ? 1 : 0);
  p.cu_seqlens_q = cu_seqlens_q.ptr<const int32_t>();
  p.max_q_len = max_q_len;
  if (workspace.defined()) {
    chk.ndim(workspace, "workspace", 1);
    chk.dtype(workspace, "workspace", DType::uint8);
    chk.last_dim_contiguous(workspace, "workspace");
    chk.aligned16(workspace, "workspace");
    p.workspace = workspace.data;
    p.workspace_bytes = static_cast<std::size_t>(workspace.size(0));
  }
  written_apart(chk, {{&out, "out"}, {&lse, "lse"}, {&workspace, "workspace"}},
                {{&q, "q"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"}, {&page_table, "page_table"},
                 {&seq_lens, "seq_lens"}, {&params.sinks, "sinks"}, {&cu_seqlens_q, "cu_seqlens_q"}});
  const std::size_t need = prefill_workspace_size(p.device, p.batch, p.num_rows);
  if (p.workspace_bytes < need) {
    chk.fail("workspace", "at least " + std::to_string(need) + " bytes (prefill_workspace_size)",
             std::to_string(p.workspace_bytes) + " bytes");
  }
  return p;
}

}  // namespace

void batch_prefill(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                   const TensorView& page_table, const TensorView& seq_lens, const TensorView& cu_seqlens_q,
                   int page_size, int max_q_len, const TensorView& out, const AttentionParams& params,
                   const TensorView& lse, const TensorView& workspace, Stream stream) {
  const ArgCheck chk("batch_prefill");
  detail::AttentionProblem p = resolve_prefill(chk, q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q,
                                               page_size, max_q_len, out, params, lse, workspace);
  p.stream = stream.handle;
  if (p.batch == 0 || p.num_rows == 0) {
    if (p.device.is_cpu()) check_attention_values(chk, p);
    return;
  }
  run_attention(chk, p, /*decode=*/false);
}

namespace detail {

void check_batch_decode(const char* op, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                        const TensorView& page_table, const TensorView& seq_lens, int page_size, int q_len_per_req,
                        const TensorView& out, const AttentionParams& params, const TensorView& lse,
                        const TensorView& workspace, const PendingWrite& write, Stream stream) {
  const ArgCheck chk(op);
  AttentionProblem p = resolve_decode(chk, q, k_cache, v_cache, page_table, seq_lens, page_size, q_len_per_req, out,
                                      params, lse, workspace);
  p.stream = stream.handle;
  if (p.device.is_cpu()) check_attention_values(chk, p);
  check_values_before_write(chk, p, write);
}

void check_batch_prefill(const char* op, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                         const TensorView& page_table, const TensorView& seq_lens, const TensorView& cu_seqlens_q,
                         int page_size, int max_q_len, const TensorView& out, const AttentionParams& params,
                         const TensorView& lse, const TensorView& workspace, const PendingWrite& write,
                         Stream stream) {
  const ArgCheck chk(op);
  AttentionProblem p = resolve_prefill(chk, q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, page_size,
                                       max_q_len, out, params, lse, workspace);
  p.stream = stream.handle;
  if (p.device.is_cpu()) check_attention_values(chk, p);
  if (p.num_rows > 0) check_values_before_write(chk, p, write);
}

}  // namespace detail

void merge_attention_states(const TensorView& o, const TensorView& lse, const TensorView& out,
                            const TensorView& out_lse, const TensorView& sinks, Stream stream) {
  const ArgCheck chk("merge_attention_states");
  chk.ndim(o, "o", 4);
  const Device dev = o.device;
  chk.device_supported(dev);
  same_device(chk, dev, {{&lse, "lse"}, {&out, "out"}, {&out_lse, "out_lse"}, {&sinks, "sinks"}});
  chk.dtype_in(o, "o", {DType::bf16, DType::fp16, DType::fp32});
  chk.last_dim_contiguous(o, "o");
  chk.aligned16(o, "o");
  const int parts = chk.int32_size(o, "o", 0), rows = chk.int32_size(o, "o", 1), hq = chk.int32_size(o, "o", 2);
  chk.head_dim(o.size(3), "o");
  const int d = static_cast<int>(o.size(3));
  chk.shape(lse, "lse", {parts, rows, hq});
  chk.dtype(lse, "lse", DType::fp32);
  chk.last_dim_contiguous(lse, "lse");
  if (sinks.defined()) {
    chk.shape(sinks, "sinks", {hq});
    chk.dtype(sinks, "sinks", DType::fp32);
    chk.last_dim_contiguous(sinks, "sinks");
  }
  chk.shape(out, "out", {rows, hq, d});
  chk.dtype(out, "out", o.dtype);
  chk.last_dim_contiguous(out, "out");
  chk.aligned16(out, "out");
  chk.no_self_overlap(out, "out");
  chk.in_place_or_disjoint(out, "out", o, "o");
  chk.disjoint_from_input(out, "out", lse, "lse");
  chk.disjoint_from_input(out, "out", sinks, "sinks");
  if (out_lse.defined()) {
    chk.shape(out_lse, "out_lse", {rows, hq});
    chk.dtype(out_lse, "out_lse", DType::fp32);
    chk.last_dim_contiguous(out_lse, "out_lse");
    chk.no_self_overlap(out_lse, "out_lse");
    chk.in_place_or_disjoint(out_lse, "out_lse", lse, "lse");
    chk.disjoint(out_lse, "out_lse", out, "out");
    chk.disjoint_from_input(out_lse, "out_lse", o, "o");
    chk.disjoint_from_input(out_lse, "out_lse", sinks, "sinks");
  }

  detail::MergeProblem p;
  p.o = o.data;
  p.dtype = o.dtype;
  p.o_part_stride = o.stride(0), p.o_row_stride = o.stride(1), p.o_head_stride = o.stride(2);
  p.lse = lse.ptr<const float>();
  p.lse_part_stride = lse.stride(0), p.lse_row_stride = lse.stride(1), p.lse_head_stride = lse.stride(2);
  p.out = out.data;
  p.out_row_stride = out.stride(0), p.out_head_stride = out.stride(1);
  if (out_lse.defined()) {
    p.out_lse = out_lse.ptr<float>();
    p.out_lse_row_stride = out_lse.stride(0), p.out_lse_head_stride = out_lse.stride(1);
  }
  p.sinks = sinks.defined() ? sinks.ptr<const float>() : nullptr;
  p.num_parts = parts, p.num_rows = rows, p.num_heads = hq, p.head_dim = d;
  p.device = dev;
  p.stream = stream.handle;
  if (int64_t{rows} * hq == 0) return;

  if (dev.is_cpu()) {
    const auto bad = [](float x) { return std::isnan(x) || x == std::numeric_limits<float>::infinity(); };
    for (int h = 0; h < hq && p.sinks; ++h) {
      if (bad(p.sinks[h])) chk.fail("sinks", "finite values or -inf", str(p.sinks[h]) + " at index " + str(h));
    }
    for (int i = 0; i < parts; ++i)
      for (int t = 0; t < rows; ++t)
        for (int h = 0; h < hq; ++h) {
          const float x = p.lse[i * p.lse_part_stride + t * p.lse_row_stride + h * p.lse_head_stride];
          if (bad(x)) {
            chk.fail("lse", "finite values or -inf (an empty part)",
                     str(x) + " at [" + str(i) + ", " + str(t) + ", " + str(h) + "]");
          }
        }
    cpu::merge_attention_states(p);
    return;
  }
#if PAGEDMHA_WITH_CUDA
  cuda::merge_attention_states(p);
#endif
}

}  // namespace pagedmha
