// Bindings of include/pagedmha/ops.h: one function per op, keyword names as in the header,
// AttentionParams fields as keyword-only arguments. Views are built while holding the GIL,
// the op runs without it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <cstdint>
#include <optional>

#include "array.h"
#include "pagedmha/ops.h"
#include "pagedmha/variant.h"

namespace pagedmha::python {

namespace {

/// Converts the arguments of one op, naming the op in every error. Inputs may be
/// read-only arrays; outputs (written by the op) must be writable.
struct Views {
  const char* op;
  TensorView operator()(const char* name, const ArrayArg& a) const { return to_view(a, op, name, Access::read); }
  TensorView out(const char* name, const ArrayArg& a) const { return to_view(a, op, name, Access::write); }
};

// None: the legacy default stream (the Python layer resolves torch / CuPy current streams).
Stream to_stream(std::optional<std::uintptr_t> handle) {
  return Stream{reinterpret_cast<void*>(handle.value_or(0))};
}

// bmm1_scale None: head_dim^-0.5 with head_dim = q's last dim, the default of FlashAttention
// and FlashInfer (an unscaled softmax is never what a caller who left it out meant).
AttentionParams attention_params(const Views& view, const TensorView& q,
                                 std::optional<double> bmm1_scale, double bmm2_scale,
                                 int window_left, double logits_soft_cap, const ArrayArg& sinks) {
  const int64_t head_dim = q.ndim > 0 ? q.shape[q.ndim - 1] : 0;
  AttentionParams p;
  // Without a head dim the op rejects q itself; the scale is then never used.
  p.bmm1_scale = bmm1_scale ? to_float32(*bmm1_scale, view.op, "bmm1_scale")
                            : (head_dim > 0 ? 1.0f / std::sqrt(static_cast<float>(head_dim)) : 1.0f);
  p.bmm2_scale = to_float32(bmm2_scale, view.op, "bmm2_scale");
  p.window_left = window_left;
  p.logits_soft_cap = to_float32(logits_soft_cap, view.op, "logits_soft_cap");
  p.sinks = view("sinks", sinks);
  return p;
}

constexpr const char* kAppendKvDoc = R"(Writes new tokens into a paged KV cache.

k_cache[out_cache_loc[t]] = k[t] and v_cache[out_cache_loc[t]] = v[t] for every token t;
no other slot is touched. An fp8 cache stores saturate_rne(x / k_scale) (and v_scale).

Args:
    k, v: [T, Hkv, D] bf16 or fp16 (T may be 0).
    k_cache, v_cache: paged cache, [num_pages * page_size, Hkv, D] or
        [num_pages, page_size, Hkv, D] (any strides, last dim contiguous); dtype equal to
        k's, or fp8_e4m3.
    out_cache_loc: int32 [T], slots in [0, num_pages * page_size).
    page_size: tokens per page (>= 1).
    k_scale, v_scale: fp8 quantisation scales (> 0); 1.0 for 16-bit caches.
    stream: cudaStream_t as an int (None: the current torch / CuPy stream of CUDA
        inputs, else the legacy default stream). CPU calls ignore it and return when done.

Raises:
    pagedmha.Error: bad shapes, dtypes, devices or scales; a slot outside the pool
        (CPU, or CUDA with debug validation on).)";

constexpr const char* kBatchDecodeDoc = R"(Decode / speculative-verify attention over a paged KV cache.

Each request has q_len_per_req queries at the last positions of its KV length L
(bottom-right causal). Writes out (and lse when given); returns None.

Args:
    q: [batch * q_len_per_req, Hq, D] bf16 or fp16 (fp8_e4m3 with an fp8 cache), rows
        request-major (row b * q_len_per_req + i). Any strides, last dim contiguous.
    k_cache, v_cache: paged cache [.., Hkv, D] (see append_kv), dtype of q or fp8_e4m3.
    page_table: int32 [batch, cols] of page ids; columns >= ceil(L / page_size) are never read.
    seq_lens: int32 [batch], KV length L in tokens including this step's queries (read on
        the device at kernel time on CUDA).
    page_size: tokens per page. q_len_per_req: queries per request (>= 1).
    out: same shape as q, bf16 or fp16 (the query dtype; bf16 for fp8 queries).
    bmm1_scale: q_scale * k_scale * sm_scale, applied to q.k in fp32. None (the default):
        D**-0.5 with D = q.shape[-1] (FlashAttention's and FlashInfer's default); a value
        given is used as is (an fp8 cache's k_scale and an fp8 q's q_scale go into it).
    bmm2_scale: v_scale, applied to the output.
    window_left: a query at position p sees keys [p - window_left, p]; -1: no window.
    logits_soft_cap: c > 0 applies c * tanh(s / c) to the logits; 0 disables.
    sinks: optional fp32 [Hq], an unscaled extra logit per query head (natural-log units).
    num_splits: CUDA split-KV count; 0 lets the kernel choose per request.
    sm_margin: SMs the persistent Hopper kernel leaves free for work beside it on another
        stream, such as a collective (FlashAttention-3's sm_margin): its grid is sized for
        max(1, SMs - sm_margin) SMs. Results do not change. >= 0; ignored elsewhere.
    lse: optional fp32 [batch * q_len_per_req, Hq], log-sum-exp (natural log, includes the sink).
    workspace: uint8 buffer of at least decode_workspace_size(...) bytes; None when that is 0.
    stream: as in append_kv.

Head dims 64, 128, 256; Hq % Hkv == 0. A query seeing no key gives out = 0 and lse = -inf
(or its sink).

Raises:
    pagedmha.Error: naming the argument, the expectation and the value given.)";

constexpr const char* kBatchPrefillDoc = R"(Prefill / extend attention with ragged queries over a paged KV cache.

Request b's queries are rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q and sit at the last
positions of its KV length L (a cached prefix of L - n tokens precedes them). Writes out
(and lse when given); returns None.

Args:
    q: [total_q, Hq, D] bf16 or fp16. Any strides, last dim contiguous.
    k_cache, v_cache: paged cache [.., Hkv, D] (see append_kv), dtype of q or fp8_e4m3.
    page_table: int32 [batch, cols] of page ids.
    seq_lens: int32 [batch], KV length in tokens including the new tokens.
    cu_seqlens_q: int32 [batch + 1], exclusive prefix sums of the query lengths.
    page_size: tokens per page.
    max_q_len: host upper bound of the query lengths (tokens); pass the step's own
        maximum (on Hopper at head_dim 256, at most 1024 selects faster tiles).
    out: same shape as q, the query dtype.
    bmm1_scale, bmm2_scale, window_left, logits_soft_cap, sinks: as in batch_decode.
    causal: True: bottom-right causal mask; False: every query sees all L keys (the window
        still bounds keys from the left).
    sm_margin: as in batch_decode (whole clusters; at fp8 KV with D = 64 the smaller grid
        may choose 192-row query tiles, which round a few elements differently).
    lse: optional fp32 [total_q, Hq].
    workspace: uint8 buffer of at least prefill_workspace_size(device, batch, total_q) bytes
        (the Hopper kernel's tile plan); None when that is 0 (CPU arrays).
    stream: as in append_kv.

Raises:
    pagedmha.Error: naming the argument, the expectation and the value given.)";

constexpr const char* kMergeDoc = R"(Merges K partial attention results over disjoint key sets into one.

Part i is the attention of the same queries over its own key set (a split of the KV, a
context-parallel rank's shard, a shared prefix). The result is the attention over the
union: with M = max(max_i lse[i], sink), w_i = exp(lse[i] - M), Z = sum_i w_i + exp(sink - M),
out = sum_i (w_i / Z) o[i] and out_lse = M + ln Z (fp32 math, out rounded once). Writes out
(and out_lse when given); returns None.

Args:
    o: [K, T, Hq, D] bf16, fp16 or fp32, the parts' outputs (a stacked or all-gathered
        tensor; any strides, last dim contiguous). D in {64, 128, 256}.
    lse: fp32 [K, T, Hq], the parts' lse (natural log, as batch_decode / batch_prefill
        write it). -inf marks an empty part; its o is ignored.
    out: [T, Hq, D], o's dtype. May be o[i] itself (in place); otherwise disjoint from o.
    out_lse: optional fp32 [T, Hq]; may be lse[i] itself.
    sinks: optional fp32 [Hq] sink logits (natural-log units, unscaled), counted once here:
        pass them when no part was computed with sinks, or compute exactly one part with
        sinks and pass None.
    stream: as in append_kv.

No key and no sink gives out = 0, out_lse = -inf (never NaN); K = 0 gives that everywhere.

Raises:
    pagedmha.Error: shapes, dtypes, devices, overlapping outputs; NaN / +inf in lse or
        sinks (CPU arrays).)";

constexpr const char* kPrefillWorkspaceDoc = R"(Bytes of workspace batch_prefill needs.

Args:
    device: "cpu" or "cuda[:N]" (0 on the CPU).
    batch: requests (>= 0). total_q: query rows of all requests (>= 0).

Returns:
    int: bytes; depends only on these sizes, so one buffer for the largest step serves all.)";

constexpr const char* kGatherDoc = R"(Gathers per-request page tables from the engine's request-to-page table.

out[r, c] = req_to_page[req_pool_indices[r], c] for c < ceil(seq_lens[r] / page_size) and 0
(the dummy page) for the other c < cols, for rows r < bs; other rows and columns untouched.

Args:
    req_to_page: int32 [max_requests + 1, max_pages] (row 0 is the padding row).
    req_pool_indices: int32 [>= bs]. seq_lens: int32 [>= bs] (tokens).
    out: int32 [>= bs, >= cols].
    bs: rows to write. cols: columns to write (<= max_pages). page_size: tokens per page.
    stream: as in append_kv.

Raises:
    pagedmha.Error: cols > max_pages, bs out of range, dtypes, negative lengths.)";

constexpr const char* kCumsumDoc = R"(Exclusive prefix sums: out[0] = 0, out[i + 1] = out[i] + lengths[i].

Args:
    lengths: int32 [n] (>= 0). out: int32 [n + 1]. stream: as in append_kv.)";

constexpr const char* kClampDoc = R"(Speculative-verify clamp: out[i] = max(seq_lens[i], min_len). out may be seq_lens.

Args:
    seq_lens: int32 [n] (tokens). min_len: >= 0. out: int32 [n]. stream: as in append_kv.)";

constexpr const char* kDecodeSlotsDoc = R"(Cache write slots of a decode (q_len_per_req == 1) or verify step.

out[r * N + j] = slot(r, max(seq_lens[r] - N + j, 0)) with N = q_len_per_req and
slot(r, pos) = page_table[r, pos // page_size] * page_size + pos % page_size.

Args:
    page_table: int32 [bs, cols]. seq_lens: int32 [bs], KV length after the step (tokens).
    page_size: tokens per page. q_len_per_req: N >= 1. out: int32 [bs * N].
    stream: as in append_kv.)";

constexpr const char* kExtendSlotsDoc = R"(Cache write slots of an extend step.

For request r the positions [prefix_lens[r], prefix_lens[r] + n_r), with
n_r = cu_seqlens_q[r + 1] - cu_seqlens_q[r], go in order to out[cu_seqlens_q[r] + i].

Args:
    page_table: int32 [bs, cols]. prefix_lens: int32 [bs] (cached tokens).
    cu_seqlens_q: int32 [bs + 1]. page_size: tokens per page.
    out: int32 [>= cu_seqlens_q[bs]]. stream: as in append_kv.)";

constexpr const char* kWorkspaceDoc = R"(Bytes of workspace batch_decode needs.

Args:
    device: "cpu", "cuda" or "cuda:N" (or anything whose str() is, e.g. a torch.device).
    batch: requests; q_len_per_req: queries per request; num_q_heads, num_kv_heads, head_dim.

Returns:
    int: bytes (0 on the CPU). Depends only on these sizes and the device, so a buffer
    sized once for the largest batch serves every smaller call.)";

}  // namespace

void bind_ops(nb::module_& m) {
  using nb::arg;

  m.def(
      "append_kv",
      [](const ArrayArg& k, const ArrayArg& v, const ArrayArg& k_cache, const ArrayArg& v_cache,
         const ArrayArg& out_cache_loc, int page_size, double k_scale, double v_scale,
         std::optional<std::uintptr_t> stream) {
        const Views view{"append_kv"};
        const float ks = to_float32(k_scale, view.op, "k_scale"), vs = to_float32(v_scale, view.op, "v_scale");
        const TensorView k_ = view("k", k), v_ = view("v", v), kc = view.out("k_cache", k_cache),
                         vc = view.out("v_cache", v_cache), loc = view("out_cache_loc", out_cache_loc);
        nb::gil_scoped_release release;
        append_kv(k_, v_, kc, vc, loc, page_size, ks, vs, to_stream(stream));
      },
      arg("k"), arg("v"), arg("k_cache"), arg("v_cache"), arg("out_cache_loc"), arg("page_size"),
      arg("k_scale") = 1.0, arg("v_scale") = 1.0, nb::kw_only(), arg("stream").none() = nb::none(),
      kAppendKvDoc);

  m.def(
      "batch_decode",
      [](const ArrayArg& q, const ArrayArg& k_cache, const ArrayArg& v_cache,
         const ArrayArg& page_table, const ArrayArg& seq_lens, int page_size, int q_len_per_req,
         const ArrayArg& out, std::optional<double> bmm1_scale, double bmm2_scale, int window_left,
         double logits_soft_cap, const ArrayArg& sinks, int num_splits, int sm_margin, const ArrayArg& lse,
         const ArrayArg& workspace, std::optional<std::uintptr_t> stream) {
        const Views view{"batch_decode"};
        const TensorView q_ = view("q", q), kc = view("k_cache", k_cache),
                         vc = view("v_cache", v_cache), pt = view("page_table", page_table),
                         sl = view("seq_lens", seq_lens), o = view.out("out", out),
                         l = view.out("lse", lse), ws = view.out("workspace", workspace);
        AttentionParams params = attention_params(view, q_, bmm1_scale, bmm2_scale, window_left,
                                                  logits_soft_cap, sinks);
        params.num_splits = num_splits;
        params.sm_margin = sm_margin;
        nb::gil_scoped_release release;
        batch_decode(q_, kc, vc, pt, sl, page_size, q_len_per_req, o, params, l, ws,
                     to_stream(stream));
      },
      arg("q"), arg("k_cache"), arg("v_cache"), arg("page_table"), arg("seq_lens"),
      arg("page_size"), arg("q_len_per_req"), arg("out"), nb::kw_only(), arg("bmm1_scale").none() = nb::none(),
      arg("bmm2_scale") = 1.0, arg("window_left") = -1, arg("logits_soft_cap") = 0.0,
      arg("sinks").none() = nb::none(), arg("num_splits") = 0, arg("sm_margin") = 0, arg("lse").none() = nb::none(),
      arg("workspace").none() = nb::none(), arg("stream").none() = nb::none(), kBatchDecodeDoc);

  m.def(
      "batch_prefill",
      [](const ArrayArg& q, const ArrayArg& k_cache, const ArrayArg& v_cache,
         const ArrayArg& page_table, const ArrayArg& seq_lens, const ArrayArg& cu_seqlens_q,
         int page_size, int max_q_len, const ArrayArg& out, std::optional<double> bmm1_scale,
         double bmm2_scale, int window_left, double logits_soft_cap, const ArrayArg& sinks,
         bool causal, int sm_margin, const ArrayArg& lse, const ArrayArg& workspace,
         std::optional<std::uintptr_t> stream) {
        const Views view{"batch_prefill"};
        const TensorView q_ = view("q", q), kc = view("k_cache", k_cache),
                         vc = view("v_cache", v_cache), pt = view("page_table", page_table),
                         sl = view("seq_lens", seq_lens), cu = view("cu_seqlens_q", cu_seqlens_q),
                         o = view.out("out", out), l = view.out("lse", lse),
                         ws = view.out("workspace", workspace);
        AttentionParams params = attention_params(view, q_, bmm1_scale, bmm2_scale, window_left,
                                                  logits_soft_cap, sinks);
        params.causal = causal;
        params.sm_margin = sm_margin;
        nb::gil_scoped_release release;
        batch_prefill(q_, kc, vc, pt, sl, cu, page_size, max_q_len, o, params, l, ws,
                      to_stream(stream));
      },
      arg("q"), arg("k_cache"), arg("v_cache"), arg("page_table"), arg("seq_lens"),
      arg("cu_seqlens_q"), arg("page_size"), arg("max_q_len"), arg("out"), nb::kw_only(),
      arg("bmm1_scale").none() = nb::none(), arg("bmm2_scale") = 1.0, arg("window_left") = -1,
      arg("logits_soft_cap") = 0.0, arg("sinks").none() = nb::none(), arg("causal") = true,
      arg("sm_margin") = 0, arg("lse").none() = nb::none(), arg("workspace").none() = nb::none(),
      arg("stream").none() = nb::none(), kBatchPrefillDoc);

  m.def(
      "merge_attention_states",
      [](const ArrayArg& o, const ArrayArg& lse, const ArrayArg& out, const ArrayArg& out_lse,
         const ArrayArg& sinks, std::optional<std::uintptr_t> stream) {
        const Views view{"merge_attention_states"};
        const TensorView o_ = view("o", o), l = view("lse", lse), out_ = view.out("out", out),
                         ol = view.out("out_lse", out_lse), s = view("sinks", sinks);
        nb::gil_scoped_release release;
        merge_attention_states(o_, l, out_, ol, s, to_stream(stream));
      },
      arg("o"), arg("lse"), arg("out"), nb::kw_only(), arg("out_lse").none() = nb::none(),
      arg("sinks").none() = nb::none(), arg("stream").none() = nb::none(), kMergeDoc);

  m.def(
      "gather_page_table_with_padding",
      [](const ArrayArg& req_to_page, const ArrayArg& req_pool_indices, const ArrayArg& seq_lens,
         const ArrayArg& out, int bs, int cols, int page_size, std::optional<std::uintptr_t> stream) {
        const Views view{"gather_page_table_with_padding"};
        const TensorView r2p = view("req_to_page", req_to_page),
                         idx = view("req_pool_indices", req_pool_indices),
                         sl = view("seq_lens", seq_lens), o = view.out("out", out);
        nb::gil_scoped_release release;
        gather_page_table_with_padding(r2p, idx, sl, o, bs, cols, page_size, to_stream(stream));
      },
      arg("req_to_page"), arg("req_pool_indices"), arg("seq_lens"), arg("out"), arg("bs"),
      arg("cols"), arg("page_size"), nb::kw_only(), arg("stream").none() = nb::none(), kGatherDoc);

  m.def(
      "cumsum_lengths",
      [](const ArrayArg& lengths, const ArrayArg& out, std::optional<std::uintptr_t> stream) {
        const Views view{"cumsum_lengths"};
        const TensorView len = view("lengths", lengths), o = view.out("out", out);
        nb::gil_scoped_release release;
        cumsum_lengths(len, o, to_stream(stream));
      },
      arg("lengths"), arg("out"), nb::kw_only(), arg("stream").none() = nb::none(), kCumsumDoc);

  m.def(
      "clamp_seq_lens",
      [](const ArrayArg& seq_lens, int min_len, const ArrayArg& out, std::optional<std::uintptr_t> stream) {
        const Views view{"clamp_seq_lens"};
        const TensorView sl = view("seq_lens", seq_lens), o = view.out("out", out);
        nb::gil_scoped_release release;
        clamp_seq_lens(sl, min_len, o, to_stream(stream));
      },
      arg("seq_lens"), arg("min_len"), arg("out"), nb::kw_only(), arg("stream").none() = nb::none(), kClampDoc);

  m.def(
      "decode_write_slots",
      [](const ArrayArg& page_table, const ArrayArg& seq_lens, int page_size, int q_len_per_req,
         const ArrayArg& out, std::optional<std::uintptr_t> stream) {
        const Views view{"decode_write_slots"};
        const TensorView pt = view("page_table", page_table), sl = view("seq_lens", seq_lens),
                         o = view.out("out", out);
        nb::gil_scoped_release release;
        decode_write_slots(pt, sl, page_size, q_len_per_req, o, to_stream(stream));
      },
      arg("page_table"), arg("seq_lens"), arg("page_size"), arg("q_len_per_req"), arg("out"),
      nb::kw_only(), arg("stream").none() = nb::none(), kDecodeSlotsDoc);

  m.def(
      "extend_write_slots",
      [](const ArrayArg& page_table, const ArrayArg& prefix_lens, const ArrayArg& cu_seqlens_q,
         int page_size, const ArrayArg& out, std::optional<std::uintptr_t> stream) {
        const Views view{"extend_write_slots"};
        const TensorView pt = view("page_table", page_table),
                         pl = view("prefix_lens", prefix_lens),
                         cu = view("cu_seqlens_q", cu_seqlens_q), o = view.out("out", out);
        nb::gil_scoped_release release;
        extend_write_slots(pt, pl, cu, page_size, o, to_stream(stream));
      },
      arg("page_table"), arg("prefix_lens"), arg("cu_seqlens_q"), arg("page_size"), arg("out"),
      nb::kw_only(), arg("stream").none() = nb::none(), kExtendSlotsDoc);

  m.def(
      "decode_workspace_size",
      [](nb::handle device, int64_t batch, int q_len_per_req, int num_q_heads, int num_kv_heads,
         int head_dim) {
        const Device d =
            parse_device(device, "decode_workspace_size", "device");
        return decode_workspace_size(d, batch, q_len_per_req, num_q_heads, num_kv_heads, head_dim);
      },
      arg("device"), arg("batch"), arg("q_len_per_req"), arg("num_q_heads"), arg("num_kv_heads"),
      arg("head_dim"), kWorkspaceDoc);

  m.def(
      "prefill_workspace_size",
      [](nb::handle device, int64_t batch, int64_t total_q) {
        const Device d =
            parse_device(device, "prefill_workspace_size", "device");
        return prefill_workspace_size(d, batch, total_q);
      },
      arg("device"), arg("batch"), arg("total_q"), kPrefillWorkspaceDoc);

  m.def(
      "visible_pairs",
      [](int64_t seq_len, int64_t q_len, int window_left, bool causal) {
        return MaskVariant{causal, window_left}.pairs(seq_len, q_len);
      },
      arg("seq_len"), arg("q_len"), arg("window_left") = -1, arg("causal") = true,
      "Visible (query, key) pairs of one request of q_len queries ending at KV length seq_len\n"
      "(include/pagedmha/variant.h, the mask every op uses): 4 * Hq * D * pairs is its prefill flops.");

  m.def("set_debug_validation", &set_debug_validation, arg("enabled"),
        "Turns debug validation on or off (off by default; no cost when off): CUDA ops then also\n"
        "check on the device that every page id read is in [0, num_pages) and every write slot\n"
        "is inside the pool, synchronise, and raise pagedmha.Error on a violation.");
  m.def("debug_validation", &debug_validation, "Whether debug validation is on.");
}

}  // namespace pagedmha::python
