// MhaBackend: construction, metadata slots, cache groups and speculative routing over
// the ops of ops.h (docs/semantics.md sections 3-6); its forward calls are in forward.cpp
// and its CUDA-graph state in graph_state.cpp. No kernels live here.
#include "pagedmha/backend.h"

#include <algorithm>
#include <climits>
#include <set>
#include <string>

#include "backend/buffers.h"
#include "core/checks.h"
#include "core/side_stream.h"
#include "pagedmha/error.h"

namespace pagedmha {

using namespace backend_detail;

const char* forward_mode_name(ForwardMode mode) {
  switch (mode) {
    case ForwardMode::extend: return "extend";
    case ForwardMode::decode: return "decode";
    case ForwardMode::mixed: return "mixed";
    case ForwardMode::idle: return "idle";
    case ForwardMode::target_verify: return "target_verify";
    case ForwardMode::draft_extend: return "draft_extend";
  }
  return "unknown";
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

Buffer upload(const std::vector<int32_t>& host, Device dev, Stream s) {
  Buffer b(std::max<std::size_t>(host.size(), 1) * 4, dev);
  copy_bytes(b.data(), dev, host.data(), Device::cpu(), host.size() * 4, s);
  return b;
}

}  // namespace

// ---------------------------------------------------------------------------------
// Construction
// ---------------------------------------------------------------------------------

MhaBackend::MhaBackend(const BackendConfig& config) try : config_(config) {
  const CallScope call("MhaBackend");  // create_backend's scope wins when it made this one
  const BackendConfig& c = config_;
  // Before the first allocation: no CUDA runtime call reports a missing device.
  detail::check_device_usable(CallScope::name(), "config.device", c.device);
  if (c.page_size < 1) fail("config.page_size", ">= 1", str(c.page_size));
  if (c.context_len < 1) fail("config.context_len", ">= 1", str(c.context_len));
  // The metadata buffers hold max_bs (x N) rows of up to ceil(context_len / page_size)
  // int32 page ids, and row indices are int32: bounds keep every size product in range.
  constexpr int kMaxBatch = 1 << 20;
  if (c.max_bs < 1 || c.max_bs > kMaxBatch) fail("config.max_bs", "1.." + str(kMaxBatch), str(c.max_bs));
  if (c.spec_num_tokens < 1 || c.spec_num_tokens > 8 || c.spec_num_tokens > c.context_len) {
    fail("config.spec_num_tokens", "1..8 and <= context_len", str(c.spec_num_tokens));
  }
  if (c.kv_cache_dtype != DType::bf16 && c.kv_cache_dtype != DType::fp16 && c.kv_cache_dtype != DType::fp8_e4m3) {
    fail("config.kv_cache_dtype", "bf16, fp16 or fp8_e4m3", dtype_name(c.kv_cache_dtype));
  }
  if (c.out_dtype != DType::bf16 && c.out_dtype != DType::fp16) {
    fail("config.out_dtype", "bf16 or fp16", dtype_name(c.out_dtype));
  }
  check_unique_ids(c.state_cache_groups, "config.state_cache_groups");
  if (c.sm_margin < 0) fail("config.sm_margin", ">= 0", str(c.sm_margin));
  const Device dev = c.device;
  const Stream s = c.stream;
  const int N = c.spec_num_tokens;
  max_num_pages_ = static_cast<int>(ceil_div(c.context_len, c.page_size));
  max_rows_ = int64_t{c.max_bs} * (block_draft() ? N : 1);
  if (max_rows_ * max_num_pages_ > (int64_t{1} << 34)) {
    fail("config.max_bs", "max_bs x ceil(context_len / page_size) page ids at most 2^34 (the page-table buffer)",
         str(c.max_bs) + " x " + str(max_num_pages_));
  }

  std::vector<int32_t> host(static_cast<std::size_t>(max_rows_ + 1));
  for (int64_t i = 0; i <= max_rows_; ++i) host[i] = static_cast<int32_t>(i);
  iota_buf_ = upload(host, dev, s);
  host.assign(static_cast<std::size_t>(c.max_bs + 1), 0);
  for (int i = 0; i <= c.max_bs; ++i) host[i] = i * N;
  iota_step_buf_ = upload(host, dev, s);
  host.assign(static_cast<std::size_t>(c.max_bs), c.context_len);
  full_len_buf_ = upload(host, dev, s);

  // Allocation failures name the config field that sized the buffer, not Buffer.
  try {
    page_table_buf_ = zeros(max_rows_ * max_num_pages_, dev, s);
  } catch (const Error&) {
    fail("config.max_bs", "a page table that fits in memory (max_bs x ceil(context_len / page_size) int32)",
         str(c.max_bs) + " x " + str(max_num_pages_));
  }
  spec_seqlens_buf_ = zeros(c.max_bs, dev, s);
  block_seqlens_buf_ = zeros(max_rows_, dev, s);
  ext_meta_buf_ = zeros(3 * int64_t{c.max_bs} + 2, dev, s);
  ext_meta_host_.resize(3 * static_cast<std::size_t>(c.max_bs) + 2);

  // Decode workspace: the engine's, or sized here for the config's layer geometry (and
  // grown by register_layers), always before any capture.
  if (c.workspace_bytes > 0) {
    try {
      workspace_ = Buffer(c.workspace_bytes, dev);
    } catch (const Error&) {
      fail("config.workspace_bytes", "an allocatable size", std::to_string(c.workspace_bytes));
    }
  }
  if (c.num_q_heads != 0 || c.num_kv_heads != 0 || c.head_dim != 0) {
    check_geometry(c.num_q_heads, c.num_kv_heads, c.head_dim, "config.");
    LayerSpec largest;
    largest.num_q_heads = c.num_q_heads, largest.num_kv_heads = c.num_kv_heads, largest.head_dim = c.head_dim;
    register_layers({largest});
  }
  side_ = std::make_unique<detail::SideStream>(dev);
} catch (const Error& e) {
  rethrow_in_call(e, "MhaBackend");
}

MhaBackend::~MhaBackend() = default;

// The most workspace any decode-kernel call of this backend can ask for with this geometry:
// block draft max_bs * N rows of one query, else max_bs requests of 1 (decode, drafter) or
// N (verify) queries. The maximum over every smaller batch too, since a split heuristic may
// give a small batch more splits than a large one; this runs once per geometry.
std::size_t MhaBackend::decode_workspace_need(int num_q_heads, int num_kv_heads, int head_dim) const {
  const Device dev = config_.device;
  const int N = config_.spec_num_tokens;
  std::size_t need = 0;
  for (int64_t b = 1; b <= max_rows_; ++b) {
    need = std::max(need, decode_workspace_size(dev, b, 1, num_q_heads, num_kv_heads, head_dim));
  }
  if (N > 1 && !block_draft()) {
    for (int64_t b = 1; b <= config_.max_bs; ++b) {
      need = std::max(need, decode_workspace_size(dev, b, N, num_q_heads, num_kv_heads, head_dim));
    }
  }
  return need;
}

void MhaBackend::register_layers(const std::vector<LayerSpec>& layers) try {
  const CallScope call("MhaBackend.register_layers");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    check_geometry(l.num_q_heads, l.num_kv_heads, l.head_dim, "layers[" + std::to_string(i) + "].");
  }
  std::size_t need = 0;
  for (const LayerSpec& l : layers) {
    need = std::max(need, decode_workspace_need(l.num_q_heads, l.num_kv_heads, l.head_dim));
  }
  if (need <= workspace_.bytes()) return;
  if (config_.workspace_bytes > 0) {
    fail("config.workspace_bytes", ">= " + std::to_string(need) + " (decode_workspace_size for max_bs " +
         str(config_.max_bs) + " and the largest layer; 0 lets the backend size it)",
         std::to_string(config_.workspace_bytes));
  }
  workspace_ = Buffer(need, config_.device);
} catch (const Error& e) {
  rethrow_in_call(e, "MhaBackend.register_layers");
}

// ---------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------

TensorView MhaBackend::iota(int64_t n) const { return vec(iota_buf_, 0, n); }
TensorView MhaBackend::iota_step(int64_t n) const { return vec(iota_step_buf_, 0, n); }

void MhaBackend::clamp(const TensorView& in, const char* arg, int lo, int hi, int repeat, const TensorView& out) const {
  with_user_args("clamp_seq_lens", {{"seq_lens", arg}}, [&] { clamp_seq_lens(in, lo, hi, repeat, out, config_.stream); });
}

std::vector<CacheGroupTable> MhaBackend::shed_state_groups(const std::vector<CacheGroupTable>& tables) const {
  std::vector<CacheGroupTable> kept;
  for (const CacheGroupTable& t : tables) {
    const auto& state = config_.state_cache_groups;
    if (std::find(state.begin(), state.end(), t.group_id) == state.end()) kept.push_back(t);
  }
  return kept;
}

void MhaBackend::check_unique_ids(const std::vector<std::string>& ids, const char* arg) {
  std::set<std::string> seen;
  for (const std::string& id : ids) {
    if (!seen.insert(id).second) fail(arg, "distinct cache group ids", "'" + id + "' twice");
  }
}

void MhaBackend::check_unique_ids(const std::vector<CacheGroupTable>& tables, const char* arg) {
  std::vector<std::string> ids;
  for (const CacheGroupTable& t : tables) ids.push_back(t.group_id);
  check_unique_ids(ids, arg);
}

std::optional<std::vector<int32_t>> MhaBackend::host_seq_lens(const ForwardBatch& b, int bs) const {
  // seq_lens itself where the host can read it: the CPU device, or a CUDA device in debug
  // validation, which may synchronise (docs/semantics.md section 8.4).
  std::optional<std::vector<int32_t>> seq;
  if (config_.device.is_cpu()) {
    seq = host_values(b.seq_lens, "batch.seq_lens", bs);
  } else if (debug_validation() && b.seq_lens_cpu.defined() && bs > 0) {
    seq.emplace(static_cast<std::size_t>(bs));
    copy_bytes(seq->data(), Device::cpu(), b.seq_lens.data, b.seq_lens.device, std::size_t(bs) * 4, config_.stream);
    synchronize(config_.stream);
  }
  std::optional<std::vector<int32_t>> copy;
  if (b.seq_lens_cpu.defined()) copy = host_values(b.seq_lens_cpu, "batch.seq_lens_cpu", bs);
  if (!seq && !copy) return std::nullopt;
  const char* arg = seq ? "batch.seq_lens" : "batch.seq_lens_cpu";
  const std::vector<int32_t>& L = seq ? *seq : *copy;
  // Lengths past C would be clamped (verify) or read past the table's intent: refuse them.
  for (int r = 0; r < bs; ++r) {
    if (L[r] < 0 || L[r] > config_.context_len) {
      fail(arg, "lengths in 0.." + str(config_.context_len) + " (context_len)", str(L[r]) + " at " + str(r));
    }
  }
  // A stale host copy would derive wrong extend prefixes and pass wrong checks.
  for (int r = 0; seq && copy && r < bs; ++r) {
    if ((*copy)[r] != (*seq)[r]) {
      fail("batch.seq_lens_cpu", "a host copy of batch.seq_lens (" + str((*seq)[r]) + " at " + str(r) + ")",
           str((*copy)[r]) + " at " + str(r));
    }
  }
  return L;
}

// bs of forward_* must be the step's batch_size (block draft: requests, not rows).
void MhaBackend::check_step_bs(int bs) const {
  if (step_bs_ >= 0 && bs != step_bs_) fail("bs", str(step_bs_) + " (this step's batch_size)", str(bs));
}

void MhaBackend::check_batch(const ForwardBatch& b, int max_bs) const {
  if (b.batch_size < 0 || b.batch_size > max_bs) {
    fail("batch.batch_size", "0.." + str(max_bs) + " (max_bs)", str(b.batch_size));
  }
  check_int32_vector(b.seq_lens, "batch.seq_lens", config_.device, b.batch_size);
}

// page_table rows [0, bs) from req_to_page, zero-padded past ceil(seq_len / P).
void MhaBackend::gather(const ForwardBatch& b, const TensorView& seq_lens, const TensorView& out) const {
  check_int32_matrix(b.req_to_page, "batch.req_to_page", config_.device, 1);
  if (b.req_to_page.size(1) < max_num_pages_) {
    fail("batch.req_to_page", "at least ceil(context_len / page_size) = " + str(max_num_pages_) + " columns",
         b.req_to_page.shape_str());
  }
  check_int32_vector(b.req_pool_indices, "batch.req_pool_indices", config_.device, b.batch_size);
  with_user_args("gather_page_table_with_padding",
                 {{"req_to_page", "batch.req_to_page"}, {"req_pool_indices", "batch.req_pool_indices"},
                  {"seq_lens", "batch.seq_lens"}},
                 [&] {
                   gather_page_table_with_padding(b.req_to_page, b.req_pool_indices, seq_lens, out, b.batch_size,
                                                  max_num_pages_, config_.page_size, config_.stream);
                 });
}

// Block draft: request r's full row copied to rows r * N + j. One strided gather per j;
// lengths of C copy every column (the kernel reads only ceil(L / P) of them).
void MhaBackend::gather_block_rows(const ForwardBatch& b, const TensorView& out) const {
  const int N = config_.spec_num_tokens;
  const int64_t cols = max_num_pages_;
  for (int j = 0; j < N; ++j) {
    TensorView rows(out.ptr<int32_t>() + j * cols, DType::int32, out.device, {b.batch_size, cols},
                    {N * cols, 1});
    gather(b, vec(full_len_buf_, 0, b.batch_size), rows);
  }
}

MhaBackend::GroupBuffers& MhaBackend::eager_group(const std::string& id) {
  auto it = eager_groups_.find(id);
  if (it != eager_groups_.end()) return it->second;
  GroupBuffers g;
  g.decode_slots = zeros(config_.max_bs, config_.device, config_.stream);
  g.verify_slots = zeros(int64_t{config_.max_bs} * config_.spec_num_tokens, config_.device, config_.stream);
  return eager_groups_.emplace(id, std::move(g)).first->second;
}

void MhaBackend::check_no_group(const LayerSpec& layer) {
  // A named group without its table would silently read and write the step's shared
  // table, which belongs to another group in a hybrid model.
  if (!layer.group_id.empty()) {
    fail("layer.group_id", "empty (this step passed no cache-group tables)", "'" + layer.group_id + "'");
  }
}

const GroupMetadata& MhaBackend::layer_group(const LayerSpec& layer, const AttentionMetadata& md) const {
  // A lone group also serves layers that name no group; a name must match, so a layer of
  // a group whose table is missing this step never reads another group's table.
  if (md.groups.size() == 1 && layer.group_id.empty()) return md.groups.front();
  std::string known;
  for (const GroupMetadata& g : md.groups) {
    if (g.group_id == layer.group_id) return g;
    known += (known.empty() ? "" : ", ") + g.group_id;
  }
  fail("layer.group_id", "one of the step's cache groups {" + known + "}", "'" + layer.group_id + "'");
}

// ---------------------------------------------------------------------------------
// Eager metadata
// ---------------------------------------------------------------------------------

void MhaBackend::init_forward_metadata(const ForwardBatch& b) try {
  const CallScope call("MhaBackend.init_forward_metadata");
  prefill_slot_ = decode_slot_ = nullptr;
  step_bs_ = -1;
  eager_prefill_.groups.clear();
  eager_decode_.groups.clear();
  if (b.forward_mode == ForwardMode::idle || b.batch_size == 0) {
    step_bs_ = 0;
    return;
  }
  check_batch(b, config_.max_bs);
  step_bs_ = b.batch_size;  // reset to -1 if a later check rejects the step
  check_unique_ids(b.group_tables, "batch.group_tables");
  const Device dev = config_.device;
  const Stream s = config_.stream;
  const int bs = b.batch_size;
  const int P = config_.page_size;
  const int N = config_.spec_num_tokens;
  const std::vector<CacheGroupTable> groups = shed_state_groups(b.group_tables);
  if (!groups.empty() && block_draft()) {
    fail("batch.group_tables", "none with draft_block_decode (cache groups are not supported there)",
         str(static_cast<int64_t>(groups.size())) + " groups");
  }
  for (const CacheGroupTable& g : groups) {
    check_int32_matrix(g.page_table, "batch.group_tables['" + g.group_id + "']", dev, bs);
  }

  const TensorView seq = b.seq_lens.slice(0, 0, bs);
  const TensorView table = mat(page_table_buf_, bs, max_num_pages_);
  bool gathered = false;
  auto single_table = [&]() {
    // A drafter's seq_lens grow in place between its steps (the decode slot aliases
    // them), past the pages they cover now: its rows are gathered whole.
    if (!gathered) gather(b, config_.is_draft ? vec(full_len_buf_, 0, bs) : seq, table);
    gathered = true;
    return table;
  };
  auto group_view = [&](const CacheGroupTable& g) { return g.page_table.slice(0, 0, bs); };
  auto group_arg = [](const CacheGroupTable& g) { return "batch.group_tables['" + g.group_id + "']"; };
  // md's tables: the gathered single table, or each cache group's table with the write
  // slots that write_slots(g) fills.
  auto set_tables = [&](AttentionMetadata& md, auto&& write_slots) {
    md.groups.clear();
    md.page_table = groups.empty() ? single_table() : TensorView{};
    for (const CacheGroupTable& g : groups) md.groups.push_back({g.group_id, group_view(g), write_slots(g)});
  };

  // One query per row over the caller's seq_lens (aliased, never copied).
  auto build_decode = [&]() {
    AttentionMetadata& md = eager_decode_;
    md.cache_seqlens = seq;
    md.cu_seqlens_q = iota(bs + 1);
    md.cu_seqlens_k = {};
    md.batch = bs;
    md.max_seq_len_q = 1;
    md.num_tokens = bs;
    md.ragged = false;
    set_tables(md, [&](const CacheGroupTable& g) {
      const TensorView slots = vec(eager_group(g.group_id).decode_slots, 0, bs);
      with_user_args("decode_write_slots", {{"page_table", group_arg(g)}, {"seq_lens", "batch.seq_lens"}},
                     [&] { decode_write_slots(group_view(g), seq, P, 1, slots, s); });
      return slots;
    });
    decode_slot_ = &eager_decode_;
  };

  if (is_extend_or_mixed(b.forward_mode)) {
    if (!b.extend_seq_lens_cpu.defined()) {
      fail("batch.extend_seq_lens_cpu", "host int32 [bs] new-token counts for " +
           std::string(forward_mode_name(b.forward_mode)), "undefined");
    }
    // Every row's query length is its own input length (mixed decode rows give 1).
    const std::vector<int32_t> ext = host_values(b.extend_seq_lens_cpu, "batch.extend_seq_lens_cpu", bs);
    for (int r = 0; r < bs; ++r) {
      if (ext[r] < 0) fail("batch.extend_seq_lens_cpu", "non-negative lengths", str(ext[r]) + " at " + str(r));
    }
    std::vector<int32_t> prefix(static_cast<std::size_t>(bs), 0);
    if (b.extend_prefix_lens_cpu.defined()) {
      prefix = host_values(b.extend_prefix_lens_cpu, "batch.extend_prefix_lens_cpu", bs);
    } else if (b.seq_lens_cpu.defined()) {
      const std::vector<int32_t> L = host_values(b.seq_lens_cpu, "batch.seq_lens_cpu", bs);
      for (int r = 0; r < bs; ++r) {
        const int64_t p = int64_t{L[r]} - ext[r];  // 64-bit: int32 operands could overflow
        if (p < 0) {
          fail("batch.seq_lens_cpu", "lengths >= extend_seq_lens_cpu (a prefix >= 0)", str(L[r]) + " at " + str(r));
        }
        prefix[r] = static_cast<int32_t>(p);
      }
    }
    for (int r = 0; r < bs; ++r) {
      if (prefix[r] < 0) {
        fail("batch.extend_prefix_lens_cpu", "non-negative prefix lengths", str(prefix[r]) + " at " + str(r));
      }
    }
    // K/V lands at [prefix, prefix + ext) while attention reads [0, seq_len): they must meet.
    if (const auto L = host_seq_lens(b, bs)) {
      for (int r = 0; r < bs; ++r) {
        if (int64_t{prefix[r]} + ext[r] != (*L)[r]) {
          fail("batch.seq_lens", "prefix + extend length = " + str(int64_t{prefix[r]} + ext[r]) + " at " + str(r),
               str((*L)[r]));
        }
      }
    }
    int32_t* cu_q = ext_meta_host_.data();
    int32_t* cu_k = cu_q + bs + 1;
    int32_t* pre = cu_k + bs + 1;
    int64_t tq = 0, tk = 0;
    int max_q = 0;
    cu_q[0] = cu_k[0] = 0;
    for (int r = 0; r < bs; ++r) {
      tq += ext[r];
      tk += int64_t{prefix[r]} + ext[r];
      if (tk > INT_MAX) fail("batch.seq_lens", "a total below 2^31", str(tk));
      cu_q[r + 1] = static_cast<int32_t>(tq);
      cu_k[r + 1] = static_cast<int32_t>(tk);
      pre[r] = prefix[r];
      max_q = std::max(max_q, ext[r]);
    }
    copy_bytes(ext_meta_buf_.data(), dev, ext_meta_host_.data(), Device::cpu(), (3 * std::size_t(bs) + 2) * 4, s);
    const TensorView cu_q_dev = vec(ext_meta_buf_, 0, bs + 1);
    const TensorView prefix_dev = vec(ext_meta_buf_, 2 * int64_t{bs} + 2, bs);

    AttentionMetadata& md = eager_prefill_;
    md.cache_seqlens = seq;
    md.cu_seqlens_q = cu_q_dev;
    md.cu_seqlens_k = vec(ext_meta_buf_, bs + 1, bs + 1);
    md.batch = bs;
    md.max_seq_len_q = max_q;
    md.num_tokens = tq;
    md.ragged = true;
    int lead = bs;  // rows [lead, bs) have one query each: batch_decode runs them
    while (lead > 0 && ext[lead - 1] == 1) --lead;
    md.decode_rows = bs - lead;
    md.prefill_max_seq_len_q = 0;
    for (int r = 0; r < lead; ++r) md.prefill_max_seq_len_q = std::max(md.prefill_max_seq_len_q, ext[r]);
    set_tables(md, [&](const CacheGroupTable& g) {
      GroupBuffers& gb = eager_group(g.group_id);
      if (gb.extend_capacity < tq) {  // eager only: extend steps are never captured
        const int64_t capacity = std::max<int64_t>(tq, 2 * gb.extend_capacity);
        Buffer grown(static_cast<std::size_t>(capacity) * 4, dev);
        // Retired, not freed: select_out_cache_loc may have handed out a view of it (the
        // buffers double, so the retired ones hold less than the live one).
        if (gb.extend_slots.bytes() > 0) retired_.push_back(std::move(gb.extend_slots));
        gb.extend_slots = std::move(grown);
        gb.extend_capacity = capacity;
      }
      const TensorView slots = vec(gb.extend_slots, 0, tq);
      with_user_args("extend_write_slots",
                     {{"page_table", group_arg(g)}, {"prefix_lens", "batch.extend_prefix_lens_cpu"}},
                     [&] { extend_write_slots(group_view(g), prefix_dev, cu_q_dev, P, slots, s); });
      return slots;
    });
    // The prefill kernel's tile plan, grown like the write slots (eager steps only).
    const std::size_t plan = prefill_workspace_size(dev, bs, tq);
    if (prefill_workspace_.bytes() < plan) {
      prefill_workspace_ = Buffer(std::max(plan, 2 * prefill_workspace_.bytes()), dev);
    }
    prefill_slot_ = &eager_prefill_;
    if (config_.is_draft) build_decode();  // the drafter's later single-token steps
    return;
  }

  if (!block_draft()) host_seq_lens(b, bs);  // block draft: lengths are block ends, clamped
  if (block_draft()) {
    // N rows of one query per request, all of KV length clamp(block_end, N, C).
    const int64_t rows = int64_t{bs} * N;
    AttentionMetadata& md = eager_decode_;
    gather_block_rows(b, mat(page_table_buf_, rows, max_num_pages_));
    md.cache_seqlens = vec(block_seqlens_buf_, 0, rows);
    clamp(seq, "batch.seq_lens", N, config_.context_len, N, md.cache_seqlens);
    md.cu_seqlens_q = iota(rows + 1);
    md.cu_seqlens_k = {};
    md.page_table = mat(page_table_buf_, rows, max_num_pages_);
    md.batch = static_cast<int>(rows);
    md.max_seq_len_q = 1;
    md.num_tokens = rows;
    md.ragged = false;
    decode_slot_ = &eager_decode_;
    return;
  }

  if (N == 1 || config_.is_draft) build_decode();
  if (N > 1) {
    // Verify: N queries per request over max(seq_len, N) (capped at C), in a backend
    // buffer: padded rows (seq_len 1) would otherwise leave early queries keyless.
    AttentionMetadata& md = eager_prefill_;
    md.cache_seqlens = vec(spec_seqlens_buf_, 0, bs);
    clamp(seq, "batch.seq_lens", N, config_.context_len, 1, md.cache_seqlens);
    md.cu_seqlens_q = iota_step(bs + 1);
    md.cu_seqlens_k = {};
    md.batch = bs;
    md.max_seq_len_q = N;
    md.num_tokens = int64_t{bs} * N;
    md.ragged = false;
    const int w = verify_writes();
    set_tables(md, [&](const CacheGroupTable& g) {
      const TensorView slots = vec(eager_group(g.group_id).verify_slots, 0, int64_t{bs} * w);
      with_user_args("decode_write_slots", {{"page_table", group_arg(g)}, {"seq_lens", "batch.seq_lens"}},
                     [&] { decode_write_slots(group_view(g), seq, P, w, slots, s); });
      return slots;
    });
    prefill_slot_ = &eager_prefill_;
  }
} catch (const Error& e) {
  // A rejected step leaves no metadata (a slot set before the failing check would serve
  // the next forward call half-built, over arrays the caller may have released).
  prefill_slot_ = decode_slot_ = nullptr;
  step_bs_ = -1;
  rethrow_in_call(e, "MhaBackend.init_forward_metadata");
}

}  // namespace pagedmha
