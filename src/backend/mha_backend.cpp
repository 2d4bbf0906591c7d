// MhaBackend: metadata slots, cache groups, speculative routing and CUDA-graph state
// over the ops of ops.h (docs/semantics.md sections 3-6). No kernels live here.
#include "pagedmha/backend.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <set>
#include <string>

#include "backend/buffers.h"
#include "core/checks.h"
#include "core/side_stream.h"
#include "core/validate.h"
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

  page_table_buf_ = zeros(max_rows_ * max_num_pages_, dev, s);
  spec_seqlens_buf_ = zeros(c.max_bs, dev, s);
  block_seqlens_buf_ = zeros(max_rows_, dev, s);
  ext_meta_buf_ = zeros(3 * int64_t{c.max_bs} + 2, dev, s);
  ext_meta_host_.resize(3 * static_cast<std::size_t>(c.max_bs) + 2);

  // Decode workspace: the engine's, or sized here for the config's layer geometry (and
  // grown by register_layers), always before any capture.
  if (c.workspace_bytes > 0) workspace_ = Buffer(c.workspace_bytes, dev);
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
  int step = -1;
  if (decode_slot_ != nullptr) {
    step = block_draft() ? decode_slot_->batch / config_.spec_num_tokens : decode_slot_->batch;
  } else if (prefill_slot_ != nullptr) {
    step = prefill_slot_->batch;
  }
  if (step >= 0 && bs != step) fail("bs", str(step) + " (this step's batch_size)", str(bs));
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
  eager_prefill_.groups.clear();
  eager_decode_.groups.clear();
  if (b.forward_mode == ForwardMode::idle || b.batch_size == 0) return;
  check_batch(b, config_.max_bs);
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
    if (!gathered) gather(b, seq, table);
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
        gb.extend_capacity = std::max<int64_t>(tq, 2 * gb.extend_capacity);
        gb.extend_slots = Buffer(static_cast<std::size_t>(gb.extend_capacity) * 4, dev);
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
  rethrow_in_call(e, "MhaBackend.init_forward_metadata");
}

// ---------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------

const AttentionMetadata* MhaBackend::select_slot(ForwardMode mode) const {
  if (is_extend_or_mixed(mode)) return prefill_slot_;
  if (block_draft()) return decode_slot_;
  if (config_.spec_num_tokens > 1 && !config_.is_draft) return prefill_slot_;
  return decode_slot_;
}

TensorView MhaBackend::select_loc(const LayerSpec& layer, const AttentionMetadata* md,
                                  const TensorView& out_cache_loc) const {
  if (md == nullptr) return out_cache_loc;
  if (md->groups.empty()) {
    check_no_group(layer);
    return out_cache_loc;
  }
  if (config_.is_draft && out_cache_loc.defined()) return out_cache_loc;  // draft chains own their slots
  const GroupMetadata& g = layer_group(layer, *md);
  return g.out_cache_loc.defined() ? g.out_cache_loc : out_cache_loc;
}

TensorView MhaBackend::select_out_cache_loc(const LayerSpec& layer, ForwardMode mode,
                                            const TensorView& out_cache_loc) const try {
  const CallScope call("MhaBackend.select_out_cache_loc");
  return select_loc(layer, select_slot(mode), out_cache_loc);
} catch (const Error& e) {
  rethrow_in_call(e, "MhaBackend.select_out_cache_loc");
}

TensorView MhaBackend::forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const LayerSpec& layer, const KvCacheView& kv,
                                      const TensorView& out_cache_loc, int bs, const TensorView& out,
                                      bool save_kv_cache) try {
  const CallScope call("MhaBackend.forward_extend");
  check_step_bs(bs);
  if (prefill_slot_ == nullptr && decode_slot_ != nullptr) {
    fail("metadata", "an extend step's (init_forward_metadata with an extend batch)",
         "a decode step's metadata (call forward_decode, or init_forward_metadata for this extend step)");
  }
  return run_attention(q, k, v, layer, kv, out_cache_loc, prefill_slot_ ? *prefill_slot_ : AttentionMetadata{},
                       out, save_kv_cache, prefill_slot_ != nullptr);
} catch (const Error& e) {
  rethrow_in_call(e, "MhaBackend.forward_extend");
}

TensorView MhaBackend::forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const LayerSpec& layer, const KvCacheView& kv,
                                      const TensorView& out_cache_loc, int bs, const TensorView& out,
                                      bool save_kv_cache) try {
  const CallScope call("MhaBackend.forward_decode");
  check_step_bs(bs);
  const AttentionMetadata* md = nullptr;
  if (block_draft()) {
    md = decode_slot_;  // bs * N rows of one query each; q rows / bs would read N
  } else {
    const int64_t q_len = bs > 0 && q.defined() ? q.size(0) / bs : 1;
    md = q_len > 1 ? prefill_slot_ : decode_slot_;
    // The rows of q chose a slot this step has no metadata for: the rows are what is
    // wrong (or the step's metadata), not a missing init_forward_metadata.
    const AttentionMetadata* other = q_len > 1 ? decode_slot_ : prefill_slot_;
    if (md == nullptr && other != nullptr) {
      fail("q", std::to_string(other->num_tokens) + " rows (this step's " +
                    (other->ragged ? "extend tokens" : "query rows") + ")",
           std::to_string(q.size(0)) + " rows for bs " + std::to_string(bs));
    }
  }
  return run_attention(q, k, v, layer, kv, out_cache_loc, md ? *md : AttentionMetadata{}, out, save_kv_cache,
                       md != nullptr);
} catch (const Error& e) {
  rethrow_in_call(e, "MhaBackend.forward_decode");
}

TensorView MhaBackend::run_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const LayerSpec& layer, const KvCacheView& kv,
                                     const TensorView& out_cache_loc, const AttentionMetadata& md,
                                     const TensorView& out, bool save_kv_cache, bool has_metadata) {
  if (!has_metadata) {
    fail("metadata", "init_forward_metadata (or a graph replay) for this step's slot first", "no metadata");
  }
  if (md.groups.empty()) check_no_group(layer);
  const int Hq = layer.num_q_heads, Hkv = layer.num_kv_heads, D = layer.head_dim;
  check_geometry(Hq, Hkv, D, "layer.");
  // Checked before any K/V write; 0, the LayerSpec default, means the usual D^-0.5.
  if (!std::isfinite(layer.scaling)) fail("layer.scaling", "a finite sm_scale (0: head_dim^-0.5)", std::to_string(layer.scaling));
  const float scaling = layer.scaling != 0.0f ? layer.scaling : 1.0f / std::sqrt(static_cast<float>(D));
  const TensorView q3 = rows3(q, Hq, D, "q");
  const TensorView out3 = rows3(out, Hq, D, "out");
  const int64_t T = q3.size(0);
  if (T != md.num_tokens) {
    fail("q", str(md.num_tokens) + " rows (this step's " + std::string(md.ragged ? "extend tokens" : "query rows") +
         ")", q.shape_str());
  }
  if (out3.size(0) != T) fail("out", str(T) + " rows", out.shape_str());
  const TensorView out2 = out3.stride(1) == D
                              ? TensorView(out.data, out.dtype, out.device, {T, int64_t{Hq} * D}, {out3.stride(0), 1})
                              : out;
  const Stream s = config_.stream;
  const bool fp8 = config_.kv_cache_dtype == DType::fp8_e4m3;
  const float k_scale = fp8 ? layer.k_scale : 1.0f;
  const float v_scale = fp8 ? layer.v_scale : 1.0f;
  // The layer's attention fields, named as the engine set them (the ops would name their
  // own parameters), before anything is written.
  if (layer.window_left < -1) fail("layer.window_left", ">= -1 (-1: no window)", str(layer.window_left));
  if (!std::isfinite(layer.logits_soft_cap) || layer.logits_soft_cap < 0.0f) {
    fail("layer.logits_soft_cap", "a finite value >= 0 (0: off)", std::to_string(layer.logits_soft_cap));
  }
  // Checked for every cache dtype: a 16-bit cache ignores the scales, but 0, a negative
  // or a non-finite scale is a mistake wherever it is set (docs/semantics.md section 8.5).
  for (const auto& [x, name] : {std::pair{layer.k_scale, "layer.k_scale"}, std::pair{layer.v_scale, "layer.v_scale"}}) {
    if (!std::isfinite(x) || x <= 0.0f) fail(name, "a finite value > 0", float_str(x));
  }
  if (layer.sinks.defined()) {
    const TensorView& sk = layer.sinks;
    if (sk.dtype != DType::fp32 || sk.ndim != 1 || sk.size(0) != Hq || sk.device != config_.device) {
      fail("layer.sinks", "fp32 [" + str(Hq) + "] (one per query head) on " + config_.device.str(),
           std::string(dtype_name(sk.dtype)) + " " + sk.shape_str() + " on " + sk.device.str());
    }
    if (sk.device.is_cpu()) {
      for (int64_t h = 0; h < Hq; ++h) {
        const float x = static_cast<const float*>(sk.data)[h * sk.stride(0)];
        if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) {
          fail("layer.sinks", "finite values or -inf", std::to_string(x) + " at index " + str(h));
        }
      }
    }
  }

  TensorView loc, k3, v3;
  const bool save = save_kv_cache && k.defined();
  if (save) {
    loc = select_loc(layer, &md, out_cache_loc);
    if (!loc.defined()) fail("out_cache_loc", "int32 write slots when saving K/V", "undefined");
    k3 = rows3(k, Hkv, D, "k");
    v3 = rows3(v, Hkv, D, "v");
    // Exactly the step's T tokens: a short k or slot list would silently drop KV entries.
    if (k3.size(0) != T) fail("k", str(T) + " rows (the step's tokens)", k.shape_str());
    if (v3.size(0) != T) fail("v", str(T) + " rows (the step's tokens)", v.shape_str());
    if (loc.ndim != 1 || loc.size(0) < T) {
      fail("out_cache_loc", "int32 [>= " + str(T) + "] write slots (the step's tokens)", loc.shape_str());
    }
  }

  const TensorView table = T == 0 ? TensorView{}
                                  : (md.groups.empty() ? md.page_table : layer_group(layer, md).page_table);
  AttentionParams params;
  params.bmm1_scale = scaling * k_scale;
  // With an fp8 cache the scale is a product of two finite factors, which may still round
  // to 0 (a uniform softmax) or overflow.
  if (fp8 && (params.bmm1_scale == 0.0f || !std::isfinite(params.bmm1_scale))) {
    fail("layer.scaling", "a value whose product with layer.k_scale float32 holds (neither 0 nor inf)",
         float_str(scaling) + " * " + float_str(k_scale) + " = " + float_str(params.bmm1_scale));
  }
  params.bmm2_scale = v_scale;  // upstream leaves this at 1: v_scale never reaches the reads
  params.window_left = layer.window_left;
  params.logits_soft_cap = layer.logits_soft_cap;
  params.sinks = layer.sinks;
  const Device dev = config_.device;
  const TensorView workspace = workspace_.bytes() > 0 ? workspace_.bytes_view() : TensorView{};
  const TensorView plan_ws = prefill_workspace_.bytes() > 0 ? prefill_workspace_.bytes_view() : TensorView{};

  // The step's attention as at most two op calls: a prefill over the leading extend rows
  // and a decode over the trailing one-query rows (all of them for decode steps).
  struct Plan {
    int64_t t_pre = 0, n_pre = 0, n_dec = 0;  // prefill tokens / rows, decode rows
    int dec_q_len = 1;
  } plan;
  if (T > 0) {
    if (md.ragged) {
      // Trailing 1-query rows go to batch_decode when its workspace fits (it always does
      // once the geometry is registered); the prefill tiles then cover only the extend rows.
      const int64_t n_dec = md.decode_rows;
      const bool split = n_dec > 0 && decode_workspace_size(dev, n_dec, 1, Hq, Hkv, D) <= workspace_.bytes();
      plan.n_dec = split ? n_dec : 0;
      plan.n_pre = md.batch - plan.n_dec;
      plan.t_pre = T - plan.n_dec;
    } else {
      const std::size_t need = decode_workspace_size(dev, md.batch, md.max_seq_len_q, Hq, Hkv, D);
      if (need > workspace_.bytes()) {  // never allocated here: this may run under graph capture
        const std::string geometry = "Hq " + str(Hq) + ", Hkv " + str(Hkv) + ", D " + str(D);
        if (config_.workspace_bytes > 0) {
          fail("config.workspace_bytes", ">= " + std::to_string(need) + " for this layer's decode (" + geometry + ")",
               std::to_string(config_.workspace_bytes));
        }
        fail("layer", "a geometry the decode workspace was sized for (config.num_q_heads / num_kv_heads / "
             "head_dim, or register_layers before the first step)", geometry);
      }
      plan.n_dec = md.batch;
      plan.dec_q_len = md.max_seq_len_q;
    }
  }
  const int64_t r_dec = plan.t_pre;  // first q row of the decode call
  auto prefill_rows = [&](auto&& f) {
    f(q3.slice(0, 0, plan.t_pre), table.slice(0, 0, plan.n_pre), md.cache_seqlens.slice(0, 0, plan.n_pre),
      md.cu_seqlens_q.slice(0, 0, plan.n_pre + 1), plan.n_dec > 0 ? md.prefill_max_seq_len_q : md.max_seq_len_q,
      out3.slice(0, 0, plan.t_pre));
  };
  auto decode_rows = [&](auto&& f) {
    if (!md.ragged) return f(q3, table, md.cache_seqlens, out3);
    f(q3.slice(0, r_dec, T - r_dec), table.slice(0, plan.n_pre, plan.n_dec),
      md.cache_seqlens.slice(0, plan.n_pre, plan.n_dec), out3.slice(0, r_dec, T - r_dec));
  };

  // Everything is checked before anything is written: a rejected call leaves the cache,
  // the outputs and this backend as they were. The ops' metadata are the step's: their
  // errors name the batch fields they came from (the cache is only known here).
  const std::string table_arg = T == 0 || md.groups.empty()
                                    ? "batch.req_to_page (this step's page-table rows)"
                                    : "batch.group_tables['" + layer_group(layer, md).group_id + "']";
  auto as_user_args = [&](const char* op, auto&& check, RowOrigin origin = {}) {
    with_user_args(op,
                   {{"q", "q"}, {"out", "out"}, {"k_cache", "k_cache"}, {"v_cache", "v_cache"},
                    {"page_table", table_arg}, {"seq_lens", "batch.seq_lens"},
                    {"cu_seqlens_q", "batch.extend_seq_lens_cpu"}, {"sinks", "layer.sinks"}},
                   check, origin);
  };
  // The caches append_kv writes are read by the attention after it, as are its inputs:
  // a cache laid over the step's q, lengths, tables or sinks would change them in between.
  if (save) {
    const detail::ArgCheck chk(CallScope::name());
    for (const auto& [c, name] : {detail::Named{&kv.k_cache, "k_cache"}, detail::Named{&kv.v_cache, "v_cache"}}) {
      chk.disjoint_from_inputs(*c, name,
                               {{&q3, "q"}, {&table, table_arg.c_str()}, {&md.cache_seqlens, "batch.seq_lens"},
                                {&md.cu_seqlens_q, "batch.extend_seq_lens_cpu"}, {&params.sinks, "layer.sinks"}});
    }
  }
  // With debug validation the value checks run here too, on the keys as they will be after
  // this step's write (append_kv's rows for the slots it fills).
  const detail::PendingWrite written =
      save ? detail::PendingWrite{loc.slice(0, 0, T), k3, v3} : detail::PendingWrite{};
  if (plan.t_pre > 0) {
    prefill_rows([&](const TensorView& qr, const TensorView& tr, const TensorView& sl, const TensorView& cu, int mq,
                     const TensorView& orr) {
      as_user_args("batch_prefill", [&] {
        detail::check_batch_prefill("batch_prefill", qr, kv.k_cache, kv.v_cache, tr, sl, cu, config_.page_size, mq,
                                    orr, params, {}, plan_ws, written, s);
      });
    });
  }
  if (plan.n_dec > 0) {
    decode_rows([&](const TensorView& qr, const TensorView& tr, const TensorView& sl, const TensorView& orr) {
      // A mixed step's decode rows are checked as their own batch: errors say where it
      // starts (the step's new tokens, which the pending write holds whole, keep theirs).
      as_user_args(
          "batch_decode",
          [&] {
            detail::check_batch_decode("batch_decode", qr, kv.k_cache, kv.v_cache, tr, sl, config_.page_size,
                                       plan.dec_q_len, orr, params, {}, workspace, written, s);
          },
          md.ragged ? RowOrigin{plan.n_pre, r_dec} : RowOrigin{});
    });
  }
  if (save) {
    with_user_args("append_kv",
                   {{"k", "k"}, {"v", "v"}, {"k_cache", "k_cache"}, {"v_cache", "v_cache"},
                    {"out_cache_loc", "out_cache_loc"}, {"k_scale", "layer.k_scale"}, {"v_scale", "layer.v_scale"}},
                   [&] {
                     append_kv(k3, v3, kv.k_cache, kv.v_cache, loc.slice(0, 0, T), config_.page_size, k_scale,
                               v_scale, s);
                   });
  }
  if (T == 0) return out2;

  auto run_prefill = [&](Stream stream) {
    prefill_rows([&](const TensorView& qr, const TensorView& tr, const TensorView& sl, const TensorView& cu, int mq,
                     const TensorView& orr) {
      batch_prefill(qr, kv.k_cache, kv.v_cache, tr, sl, cu, config_.page_size, mq, orr, params, {}, plan_ws, stream);
    });
  };
  auto run_decode = [&](Stream stream) {
    decode_rows([&](const TensorView& qr, const TensorView& tr, const TensorView& sl, const TensorView& orr) {
      batch_decode(qr, kv.k_cache, kv.v_cache, tr, sl, config_.page_size, plan.dec_q_len, orr, params, {}, workspace,
                   stream);
    });
  };
  if (plan.n_dec == 0) {
    run_prefill(s);
    return out2;
  }
  if (plan.t_pre == 0) {
    run_decode(s);
    return out2;
  }
  // On CUDA the two kernels share the GPU: the compute-bound prefill tiles go first, the
  // memory-bound decode rows follow on a higher-priority side stream and take SMs as
  // prefill tiles retire (they read the same cache and write disjoint output rows).
  // A throw between fork and join still joins (an unjoined fork would break a capture).
  struct JoinOnThrow {
    detail::SideStream* side;
    Stream main;
    ~JoinOnThrow() {
      if (!side) return;
      try {
        side->join(main);
      } catch (...) {  // already unwinding from the first error
      }
    }
  } guard{side_.get(), s};
  const Stream aux = side_->fork(s);
  run_prefill(s);
  run_decode(aux);
  guard.side = nullptr;
  side_->join(s);
  return out2;
}

}  // namespace pagedmha
