// MhaBackend: the attention backend a serving engine embeds (docs/semantics.md sections 3-6).
// It owns no kernels: it turns the engine's per-step batch description into attention
// metadata (KV lengths, cu_seqlens, page tables, write slots) with the ops of ops.h,
// writes new K/V and calls batch_decode / batch_prefill. CPU and CUDA tensors alike.
//
// Usage (one backend per model; a drafter gets its own with is_draft = true):
//
//   pagedmha::BackendConfig cfg;
//   cfg.page_size = 64; cfg.context_len = 8192; cfg.max_bs = 256;
//   cfg.device = pagedmha::Device::cuda(0); cfg.stream = pagedmha::Stream{cuda_stream};
//   cfg.num_q_heads = 32; cfg.num_kv_heads = 8; cfg.head_dim = 128;  // the largest layer
//   auto backend = pagedmha::create_backend("pagedmha", cfg);         // registry.h
//   // The decode workspace is allocated here from that geometry; without it, call
//   // backend->register_layers(layer_specs) before the first step.
//
//   // Every step (eager):
//   pagedmha::ForwardBatch fb;
//   fb.forward_mode = pagedmha::ForwardMode::decode;
//   fb.batch_size = bs; fb.req_pool_indices = rpi; fb.seq_lens = seq_lens;  // int32, device
//   fb.req_to_page = req_to_page;                                           // int32, device
//   backend->init_forward_metadata(fb);
//   for (int l = 0; l < num_layers; ++l)  // q: [T, Hq*D]; k, v: [T, Hkv*D]; out: [T, Hq*D]
//     backend->forward_decode(q, k, v, layer_specs[l], {k_cache[l], v_cache[l]}, out_cache_loc,
//                             bs, out);  // writes k, v at out_cache_loc, then attends
//
//   // CUDA graphs (decode, verify, draft, block draft); metadata calls stay outside:
//   backend->init_cuda_graph_state(max_bs, seq_lens_buf);                        // once
//   backend->init_forward_metadata_capture_cuda_graph(bs, ForwardMode::decode);  // per padded
//   ... capture the layers' forward_decode calls ...                             // bs
//   //   (block draft: fill_block_decode_seq_lens(bs, block_ends) first, inside the graph)
//   // Every step: write seq_lens_buf, set fb.seq_lens = seq_lens_buf, then
//   backend->init_forward_metadata_replay_cuda_graph(fb);  // and replay the graph of bs
//
// Extend (prefill) steps set extend_seq_lens_cpu (and extend_prefix_lens_cpu for a cached
// prefix) as host int32 tensors and call forward_extend. Host code never reads a device value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/ops.h"
#include "pagedmha/tensor.h"

namespace pagedmha {

namespace detail {
class SideStream;
}

/// The engine's forward modes. draft_extend behaves as extend, target_verify as a
/// decode step with spec_num_tokens queries per request.
enum class ForwardMode : uint8_t { extend, decode, mixed, idle, target_verify, draft_extend };

/// "extend", "decode", ...
const char* forward_mode_name(ForwardMode mode);
/// extend, mixed and draft_extend: ragged queries through the prefill slot.
inline bool is_extend_or_mixed(ForwardMode m) {
  return m == ForwardMode::extend || m == ForwardMode::mixed || m == ForwardMode::draft_extend;
}

/// Construction config (fixed for the backend's lifetime).
struct BackendConfig {
  int page_size = 16;      ///< P: tokens per page (>= 1).
  int context_len = 0;     ///< C: the longest KV length of a request, tokens (>= 1).
  DType kv_cache_dtype = DType::bf16;  ///< bf16, fp16 or fp8_e4m3.
  DType out_dtype = DType::bf16;       ///< Output dtype (bf16 or fp16): the query dtype.
  int max_bs = 1;          ///< Most requests in one step (eager and graph buffers).
  Device device{};
  int spec_num_tokens = 1;  ///< N: speculative tokens per request (1..8; 1 = off).
  bool is_draft = false;    ///< This backend serves the drafter of a speculative pair.
  bool draft_block_decode = false;  ///< Block-diffusion (DFLASH) drafter: N rows per request.
  /// Decode workspace bytes the backend allocates up front; must cover
  /// decode_workspace_size for max_bs requests of this backend's rows (N queries when
  /// verifying, N rows per request for block draft) and the largest layer. 0: the backend
  /// sizes it from the geometry below or register_layers (0 bytes on the CPU).
  std::size_t workspace_bytes = 0;
  /// Largest layer geometry (all 0: none; give it or call register_layers). Sizes the
  /// workspace when workspace_bytes is 0, else checks it.
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  /// Cache groups of the "state" family (recurrent layers without KV): dropped everywhere.
  /// Distinct ids (a repeated one is an error).
  std::vector<std::string> state_cache_groups;
  /// Stream every op of this backend is issued on (set_stream changes it).
  Stream stream{};
  /// SMs every attention launch leaves free for a kernel beside it on another stream,
  /// such as a collective (AttentionParams::sm_margin; >= 0; results do not change beyond
  /// rounding).
  int sm_margin = 0;
};

/// Per-layer attention parameters (the engine's attention layer).
struct LayerSpec {
  int layer_id = 0;
  int num_q_heads = 0;   ///< Hq
  int num_kv_heads = 0;  ///< Hkv (Hq % Hkv == 0)
  int head_dim = 0;      ///< D: 64, 128 or 256
  /// sm_scale; 0 (the default) means head_dim^-0.5. Must be finite (error otherwise).
  float scaling = 0.0f;
  int window_left = -1;  ///< W; -1: no window (HF sliding_window S -> S - 1)
  /// fp8 caches only: stored = x / scale; reads use bmm1 = scaling * k_scale, bmm2 = v_scale.
  /// Ignored (treated as 1) for bf16 / fp16 caches, which store values unscaled. Must be
  /// finite and > 0 for every cache dtype (error otherwise: 0 or NaN is never meant).
  float k_scale = 1.0f, v_scale = 1.0f;
  float logits_soft_cap = 0.0f;
  /// Cache group whose page table this layer reads and writes. With one group in the step
  /// the layer must name it or leave this empty; with several it must name one of them;
  /// with none (no group_tables) it must be empty.
  std::string group_id;
  TensorView sinks;      ///< Optional fp32 [Hq] sink logits.
};

/// One layer's paged K and V buffers ([num_slots, Hkv, D] or [num_pages, P, Hkv, D]).
struct KvCacheView {
  TensorView k_cache, v_cache;
};

/// A cache group's page table for this step: int32 [>= bs, cols] of absolute page ids.
/// Eager tables may carry -1 in ragged tails (never dereferenced).
struct CacheGroupTable {
  std::string group_id;
  TensorView page_table;
};

/// What the engine passes every step (device tensors on config.device unless "host").
struct ForwardBatch {
  ForwardMode forward_mode = ForwardMode::decode;
  int batch_size = 0;           ///< bs: requests (rows of seq_lens used).
  TensorView req_pool_indices;  ///< int32 [>= bs]; padded rows use 0.
  /// int32 [>= bs]: KV length after this step, 0..context_len (checked where host-readable:
  /// CPU device or seq_lens_cpu; a contract on CUDA).
  TensorView seq_lens;
  /// host int32 [>= bs] (optional): a host copy of seq_lens, used only for checks and to
  /// derive extend prefixes. Must equal seq_lens[0, bs) (checked on the CPU device, and on
  /// CUDA in debug validation, which copies seq_lens to the host and synchronises).
  TensorView seq_lens_cpu;
  /// host int32 [>= bs]: new tokens per request (extend / mixed: decode rows give 1).
  TensorView extend_seq_lens_cpu;
  /// host int32 [>= bs]: cached prefix per request (absent: seq_lens_cpu - extend, else 0).
  /// prefix + extend must equal seq_lens (checked where seq_lens is host-readable).
  TensorView extend_prefix_lens_cpu;
  TensorView out_cache_loc;  ///< int32 [T]: slots of the new tokens (single-table mode).
  TensorView req_to_page;    ///< int32 [max_requests + 1, max_pages]; row 0 all zeros.
  /// Per-cache-group tables (hybrid models), distinct ids. Empty: one table from req_to_page.
  std::vector<CacheGroupTable> group_tables;
};

/// A cache group's resolved view inside one metadata slot.
struct GroupMetadata {
  std::string group_id;
  TensorView page_table;     ///< int32 [batch, cols]
  TensorView out_cache_loc;  ///< int32 write slots of this step (decode: [bs], verify: [bs*N],
                             ///< extend: [total new tokens]); undefined when not computed.
};

/// One metadata slot: what one kernel call reads (all tensors int32 on the device).
struct AttentionMetadata {
  TensorView cache_seqlens;  ///< [batch] KV length per kernel row
  TensorView cu_seqlens_q;   ///< [batch + 1]
  TensorView cu_seqlens_k;   ///< [batch + 1] (extend only)
  TensorView page_table;     ///< [batch, cols] (single-table mode; undefined with groups)
  std::vector<GroupMetadata> groups;
  int batch = 0;          ///< Kernel rows (requests; block draft: bs * N)
  int max_seq_len_q = 1;  ///< Host bound of the queries per row
  int64_t num_tokens = 0; ///< Query rows of the step (batch * max_seq_len_q unless ragged)
  bool ragged = false;    ///< true: batch_prefill with cu_seqlens_q; false: batch_decode
  /// Ragged only (host-known): the trailing rows of one query each (mixed steps put decode
  /// rows last). They run through batch_decode on row views instead of 128-row prefill
  /// tiles with one useful row; the leading batch - decode_rows rows through batch_prefill
  /// with max_q_len prefill_max_seq_len_q. Same results: a 1-query row at L - 1 sees the
  /// same keys either way. Falls back to one batch_prefill when the decode workspace was
  /// not sized for this layer's geometry (config geometry or register_layers). On CUDA the
  /// decode rows run on a backend-owned side stream beside the prefill kernel, forked
  /// from and joined back into config.stream inside the call (also under graph capture),
  /// so callers still see one stream.
  int decode_rows = 0;
  int prefill_max_seq_len_q = 0;
};

/// The backend. Not thread-safe; one instance per model (and per drafter).
/// Errors name the call the user made and the argument as passed, whichever inner op
/// rejects it: "create_backend: config.head_dim: expected 64, 128 or 256, got 96",
/// "MhaBackend.forward_decode: out_cache_loc: expected dtype int32, got int64".
class MhaBackend {
 public:
  /// Allocates every persistent buffer (page tables [max_bs * rows, ceil(C / P)], clamp
  /// buffers, workspace). Errors: invalid config values; config.workspace_bytes below the
  /// need of the config's geometry.
  explicit MhaBackend(const BackendConfig& config);
  ~MhaBackend();
  MhaBackend(const MhaBackend&) = delete;
  MhaBackend& operator=(const MhaBackend&) = delete;

  const BackendConfig& config() const { return config_; }
  void set_stream(Stream stream) { config_.stream = stream; }
  /// Pages per request row: ceil(context_len / page_size).
  int max_num_pages() const { return max_num_pages_; }
  bool support_kv_cache_prewrite() const { return true; }

  /// Declares the model's attention layers before the first step (and before any capture):
  /// grows the backend-owned decode workspace to the largest need among them, or, with
  /// config.workspace_bytes set, checks that it suffices. Optional when the config gives
  /// the largest geometry. Errors: invalid head counts / head dims; workspace_bytes too small.
  void register_layers(const std::vector<LayerSpec>& layers);

  /// Builds the metadata of one eager step (docs/semantics.md section 3). extend / mixed /
  /// draft_extend: prefill slot (and, for a drafter, the decode slot too); decode /
  /// target_verify: decode slot, plus the verify prefill slot when N > 1; block draft:
  /// decode slot with bs * N rows; idle: nothing. Issues device work on the stream only.
  /// Errors: dtypes, devices, bs > max_bs, missing host lengths, duplicate group ids;
  /// where host-readable, seq_lens outside 0..context_len and prefix + extend != seq_lens.
  void init_forward_metadata(const ForwardBatch& batch);

  /// Attention for extend / mixed steps through the prefill slot. q: [T, Hq * D] or
  /// [T, Hq, D] (strided rows allowed); k, v: [T, Hkv * D] or [T, Hkv, D], or undefined;
  /// out: [T, Hq * D] or [T, Hq, D] of the query dtype. When save_kv_cache and k is given,
  /// writes K/V at select_out_cache_loc(...) first. Returns out as [T, Hq * D].
  /// Trailing rows of one query run through batch_decode, the rest through batch_prefill
  /// (AttentionMetadata::decode_rows). T must be the step's token count; k and v then have T rows and the write slots at
  /// least T entries (exactly T are written). bs must be the step's batch_size. Errors
  /// name q / k / v / out_cache_loc / bs with the expected and given sizes.
  TensorView forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                            const LayerSpec& layer, const KvCacheView& kv,
                            const TensorView& out_cache_loc, int bs, const TensorView& out,
                            bool save_kv_cache = true);
  /// Attention for decode-mode steps. Routing: block draft -> decode slot; else
  /// q rows / bs > 1 -> prefill slot (uniform N queries, decode kernel); else decode slot.
  /// Sizes as forward_extend (bs: the step's requests, not the block-draft rows).
  TensorView forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                            const LayerSpec& layer, const KvCacheView& kv,
                            const TensorView& out_cache_loc, int bs, const TensorView& out,
                            bool save_kv_cache = true);

  /// Write slots for a KV prewrite of `layer` in this step: the layer's group slots when
  /// cache groups are active (a drafter prefers the caller's), else `out_cache_loc`.
  TensorView select_out_cache_loc(const LayerSpec& layer, ForwardMode mode,
                                  const TensorView& out_cache_loc) const;

  // ---- CUDA graphs (docs/semantics.md section 4) ----

  /// Allocates the graph buffers for up to max_bs requests (<= config.max_bs).
  /// seq_lens_buf: the engine's int32 [>= max_bs] lengths buffer; the decode slot's
  /// cache_seqlens aliases it and the backend never writes it. cache_group_ids: the groups
  /// a captured step may use (state groups are shed; distinct ids); each gets a
  /// [max_bs, max_pages] table padded with 0 and write-slot buffers.
  void init_cuda_graph_state(int max_bs, const TensorView& seq_lens_buf,
                             const std::vector<std::string>& cache_group_ids = {});
  /// Records the metadata slots of padded batch size bs (decode-mode steps only) over the
  /// graph buffers and points the slots at them. Call before capture begins.
  /// cache_group_ids: the groups this graph reads (subset of init_cuda_graph_state's).
  void init_forward_metadata_capture_cuda_graph(int bs, ForwardMode mode,
                                                const std::vector<std::string>& cache_group_ids = {});
  /// Before each replay, outside the graph: gathers page tables (req_to_page or the
  /// group tables) into the graph buffers, recomputes clamps and write slots, re-points
  /// the slots. batch.seq_lens must be the seq_lens_buf the engine already filled.
  /// A live group table may have fewer rows than bs: the missing rows must be padded rows
  /// (seq_len <= 1; checked where seq_lens is host-readable) and read page 0.
  /// Errors: bs not captured, a captured group's table missing (stale-table guard),
  /// duplicate group ids, seq_lens outside 0..context_len (where host-readable).
  void init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch);
  /// Block draft, inside the graph: KV length of the N rows of request r becomes
  /// clamp(block_ends[r], N, C). block_ends: int32 [>= bs] on the device.
  void fill_block_decode_seq_lens(int bs, const TensorView& block_ends);

  /// The current slots (null when the last init did not set them). For tools and tests.
  const AttentionMetadata* prefill_metadata() const { return prefill_slot_; }
  const AttentionMetadata* decode_metadata() const { return decode_slot_; }

 private:
  struct GroupBuffers {  // persistent per-group buffers
    Buffer table;        // [rows, max_pages] (graph only)
    Buffer decode_slots, verify_slots, extend_slots;
    int64_t extend_capacity = 0;
    int64_t written_cols = 0;  // graph: widest live table copied so far
  };
  struct GraphState {
    int max_bs = 0;
    TensorView seq_lens_buf;
    Buffer page_table, spec_seqlens, block_seqlens;
    Buffer row_lens;  // drafter: a live group table's full length per row (whole-row gathers)
    std::map<std::string, GroupBuffers> groups;
    std::map<int, AttentionMetadata> decode, prefill;
    std::map<int, std::vector<std::string>> captured_groups;
  };

  bool block_draft() const { return config_.draft_block_decode && config_.spec_num_tokens > 1; }
  int verify_writes() const { return config_.is_draft ? 1 : config_.spec_num_tokens; }
  std::vector<CacheGroupTable> shed_state_groups(const std::vector<CacheGroupTable>& tables) const;
  static void check_unique_ids(const std::vector<std::string>& ids, const char* arg);
  static void check_unique_ids(const std::vector<CacheGroupTable>& tables, const char* arg);
  // seq_lens[0, bs) on the host when readable (CPU device, else seq_lens_cpu), checked to
  // lie in 0..context_len; nullopt otherwise (CUDA without seq_lens_cpu).
  std::optional<std::vector<int32_t>> host_seq_lens(const ForwardBatch& batch, int bs) const;
  void check_step_bs(int bs) const;
  void check_batch(const ForwardBatch& batch, int max_bs) const;
  std::size_t decode_workspace_need(int num_q_heads, int num_kv_heads, int head_dim) const;
  TensorView iota(int64_t n) const;        // 0, 1, ..., n - 1
  TensorView iota_step(int64_t n) const;   // 0, N, 2N, ... (n entries)
  void gather_block_rows(const ForwardBatch& batch, const TensorView& out) const;
  // clamp_seq_lens of `in`, the user's argument `arg` (named in its errors).
  void clamp(const TensorView& in, const char* arg, int lo, int hi, int repeat, const TensorView& out) const;
  void gather(const ForwardBatch& batch, const TensorView& seq_lens, const TensorView& out) const;
  const AttentionMetadata* select_slot(ForwardMode mode) const;
  TensorView select_loc(const LayerSpec& layer, const AttentionMetadata* md,
                        const TensorView& out_cache_loc) const;
  GroupBuffers& eager_group(const std::string& id);
  static void check_no_group(const LayerSpec& layer);
  const GroupMetadata& layer_group(const LayerSpec& layer, const AttentionMetadata& md) const;
  TensorView run_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                           const LayerSpec& layer, const KvCacheView& kv,
                           const TensorView& out_cache_loc, const AttentionMetadata& md,
                           const TensorView& out, bool save_kv_cache, bool has_metadata);

  BackendConfig config_;
  int max_num_pages_ = 0;
  int64_t max_rows_ = 0;  // max_bs * (block draft ? N : 1)
  Buffer workspace_;          // batch_decode's (split-KV partials)
  Buffer prefill_workspace_;  // batch_prefill's tile plan: its own, since mixed steps run both at once
  Buffer iota_buf_, iota_step_buf_, full_len_buf_;  // constants
  Buffer page_table_buf_, spec_seqlens_buf_, block_seqlens_buf_;
  Buffer ext_meta_buf_;              // device [cu_q (bs+1) | cu_k (bs+1) | prefix (bs)]
  std::vector<int32_t> ext_meta_host_;
  std::map<std::string, GroupBuffers> eager_groups_;
  AttentionMetadata eager_prefill_, eager_decode_;
  const AttentionMetadata* prefill_slot_ = nullptr;
  const AttentionMetadata* decode_slot_ = nullptr;
  int step_bs_ = -1;  // the current step's batch_size (requests); 0 idle; -1 no step metadata
  // Slot buffers outgrown or replaced (extend slots, an earlier graph state): kept, not
  // freed, since select_out_cache_loc may have handed out views of them.
  std::vector<Buffer> retired_;
  bool has_graph_ = false;
  GraphState graph_;
  // CUDA: mixed steps run their decode rows here, beside the prefill rows' kernel.
  std::unique_ptr<detail::SideStream> side_;
};

}  // namespace pagedmha
