// CUDA-graph state of MhaBackend (docs/semantics.md section 4): persistent buffers sized at
// init_cuda_graph_state, per-batch-size metadata recorded at capture, device-only
// refresh before each replay. Nothing here allocates after init_cuda_graph_state.
#include <algorithm>
#include <string>

#include "backend/buffers.h"
#include "pagedmha/backend.h"
#include "pagedmha/error.h"

namespace pagedmha {

using namespace backend_detail;

void MhaBackend::init_cuda_graph_state(int max_bs, const TensorView& seq_lens_buf,
                                       const std::vector<std::string>& cache_group_ids) try {
  const CallScope call("MhaBackend.init_cuda_graph_state");
  if (max_bs < 1 || max_bs > config_.max_bs) fail("max_bs", "1.." + str(config_.max_bs) + " (config.max_bs)", str(max_bs));
  if (!seq_lens_buf.defined() || seq_lens_buf.dtype != DType::int32 || seq_lens_buf.ndim != 1 ||
      !(seq_lens_buf.device == config_.device) || seq_lens_buf.size(0) < max_bs ||
      (seq_lens_buf.size(0) > 1 && seq_lens_buf.stride(0) != 1)) {
    fail("seq_lens_buf", "contiguous int32 [>= " + str(max_bs) + "] on " + config_.device.str(),
         seq_lens_buf.defined() ? std::string(dtype_name(seq_lens_buf.dtype)) + " " + seq_lens_buf.shape_str() + " on " +
                                      seq_lens_buf.device.str()
                                : "undefined");
  }
  check_unique_ids(cache_group_ids, "cache_group_ids");
  const Device dev = config_.device;
  const Stream s = config_.stream;
  const int N = config_.spec_num_tokens;
  const int64_t rows = int64_t{max_bs} * (block_draft() ? N : 1);
  GraphState g;
  g.max_bs = max_bs;
  g.seq_lens_buf = seq_lens_buf;
  g.page_table = zeros(rows * max_num_pages_, dev, s);
  g.spec_seqlens = zeros(max_bs, dev, s);
  g.block_seqlens = zeros(rows, dev, s);
  if (config_.is_draft) g.row_lens = zeros(max_bs, dev, s);
  for (const std::string& id : cache_group_ids) {
    const auto& state = config_.state_cache_groups;
    if (std::find(state.begin(), state.end(), id) != state.end()) continue;
    if (block_draft()) fail("cache_group_ids", "none with draft_block_decode", "'" + id + "'");
    GroupBuffers gb;
    gb.table = zeros(int64_t{max_bs} * max_num_pages_, dev, s);
    gb.decode_slots = zeros(max_bs, dev, s);
    gb.verify_slots = zeros(int64_t{max_bs} * N, dev, s);
    g.groups.emplace(id, std::move(gb));
  }
  // The old state's slot buffers are retired, not freed (views of them may be out).
  for (auto& [id, gb] : graph_.groups) {
    for (Buffer* b : {&gb.decode_slots, &gb.verify_slots}) {
      if (b->bytes() > 0) retired_.push_back(std::move(*b));
    }
  }
  graph_ = std::move(g);
  has_graph_ = true;
  prefill_slot_ = decode_slot_ = nullptr;  // slots may have pointed into the old state
  step_bs_ = -1;
} catch (const Error& e) {
  rethrow_in_call(e, "MhaBackend.init_cuda_graph_state");
}

void MhaBackend::init_forward_metadata_capture_cuda_graph(int bs, ForwardMode mode,
                                                          const std::vector<std::string>& cache_group_ids) try {
  const CallScope call("MhaBackend.init_forward_metadata_capture_cuda_graph");
  if (!has_graph_) fail("init_cuda_graph_state", "a call before capture", "none");
  if (is_extend_or_mixed(mode) || mode == ForwardMode::idle) {
    fail("forward_mode", "a decode-mode step (decode, target_verify) for graph capture", forward_mode_name(mode));
  }
  if (bs < 1 || bs > graph_.max_bs) fail("bs", "1.." + str(graph_.max_bs) + " (graph max_bs)", str(bs));
  const int N = config_.spec_num_tokens;
  const int C = config_.context_len;
  const int64_t cols = max_num_pages_;
  check_unique_ids(cache_group_ids, "cache_group_ids");
  std::vector<std::string> ids;
  for (const std::string& id : cache_group_ids) {
    const auto& state = config_.state_cache_groups;
    if (std::find(state.begin(), state.end(), id) != state.end()) continue;
    if (!graph_.groups.count(id)) fail("cache_group_ids", "groups named at init_cuda_graph_state", "'" + id + "'");
    ids.push_back(id);
  }
  const TensorView seq = graph_.seq_lens_buf.slice(0, 0, bs);
  graph_.decode.erase(bs);
  graph_.prefill.erase(bs);

  auto describe = [&](AttentionMetadata& md, bool verify) {
    md.cu_seqlens_k = {};
    md.batch = bs;
    md.ragged = false;
    md.max_seq_len_q = verify ? N : 1;
    md.num_tokens = int64_t{bs} * md.max_seq_len_q;
    md.cu_seqlens_q = verify ? iota_step(bs + 1) : iota(bs + 1);
    md.page_table = ids.empty() ? mat(graph_.page_table, bs, cols) : TensorView{};
    md.groups.clear();
    for (const std::string& id : ids) {
      const GroupBuffers& gb = graph_.groups.at(id);
      const int w = verify ? verify_writes() : 1;
      md.groups.push_back({id, mat(gb.table, bs, cols), vec(verify ? gb.verify_slots : gb.decode_slots, 0, int64_t{bs} * w)});
    }
  };

  if (block_draft()) {
    const int64_t rows = int64_t{bs} * N;
    AttentionMetadata& md = graph_.decode[bs];
    md.cache_seqlens = vec(graph_.block_seqlens, 0, rows);
    // A safe seed (N) until fill_block_decode_seq_lens runs.
    clamp(seq, "seq_lens_buf", N, N, N, md.cache_seqlens);
    md.cu_seqlens_q = iota(rows + 1);
    md.cu_seqlens_k = {};
    md.page_table = mat(graph_.page_table, rows, cols);
    md.batch = static_cast<int>(rows);
    md.max_seq_len_q = 1;
    md.num_tokens = rows;
    md.ragged = false;
  } else {
    if (N == 1 || config_.is_draft) {
      AttentionMetadata& md = graph_.decode[bs];
      describe(md, false);
      md.cache_seqlens = seq;  // aliases the engine's seq_lens_buf; never written here
    }
    if (N > 1) {
      AttentionMetadata& md = graph_.prefill[bs];
      describe(md, true);
      md.cache_seqlens = vec(graph_.spec_seqlens, 0, bs);
      clamp(seq, "seq_lens_buf", N, C, 1, md.cache_seqlens);
    }
  }
  graph_.captured_groups[bs] = ids;
  decode_slot_ = graph_.decode.count(bs) ? &graph_.decode.at(bs) : nullptr;
  prefill_slot_ = graph_.prefill.count(bs) ? &graph_.prefill.at(bs) : nullptr;
  step_bs_ = bs;
} catch (const Error& e) {
  prefill_slot_ = decode_slot_ = nullptr;  // a rejected step leaves no metadata
  step_bs_ = -1;
  rethrow_in_call(e, "MhaBackend.init_forward_metadata_capture_cuda_graph");
}

void MhaBackend::init_forward_metadata_replay_cuda_graph(const ForwardBatch& b) try {
  const CallScope call("MhaBackend.init_forward_metadata_replay_cuda_graph");
  if (!has_graph_) fail("init_cuda_graph_state", "a call before replay", "none");
  const int bs = b.batch_size;
  auto cap = graph_.captured_groups.find(bs);
  if (cap == graph_.captured_groups.end()) fail("batch.batch_size", "a captured batch size", str(bs));
  if (is_extend_or_mixed(b.forward_mode) || b.forward_mode == ForwardMode::idle) {
    fail("batch.forward_mode", "a decode-mode step for graph replay", forward_mode_name(b.forward_mode));
  }
  const Device dev = config_.device;
  const Stream s = config_.stream;
  const int N = config_.spec_num_tokens;
  const int P = config_.page_size;
  const int64_t cols = max_num_pages_;
  if (b.seq_lens.defined() && b.seq_lens.data != graph_.seq_lens_buf.data) {
    fail("batch.seq_lens", "the seq_lens_buf given to init_cuda_graph_state (the graph aliases it)",
         "another tensor");
  }
  check_unique_ids(b.group_tables, "batch.group_tables");
  ForwardBatch host_view = b;
  host_view.seq_lens = graph_.seq_lens_buf;
  // Block draft: the buffer holds block ends, clamped by design.
  const auto host_len = block_draft() ? std::nullopt : host_seq_lens(host_view, bs);
  const TensorView seq = graph_.seq_lens_buf.slice(0, 0, bs);
  AttentionMetadata* dmd = graph_.decode.count(bs) ? &graph_.decode.at(bs) : nullptr;
  AttentionMetadata* pmd = graph_.prefill.count(bs) ? &graph_.prefill.at(bs) : nullptr;
  const std::vector<std::string>& captured = cap->second;

  if (captured.empty()) {
    ForwardBatch fb = b;
    fb.seq_lens = graph_.seq_lens_buf;
    if (block_draft()) {
      gather_block_rows(fb, mat(graph_.page_table, int64_t{bs} * N, cols));
    } else {
      // Whole rows for a drafter, as in init_forward_metadata.
      gather(fb, config_.is_draft ? vec(full_len_buf_, 0, bs) : seq, mat(graph_.page_table, bs, cols));
    }
  } else {
    const std::vector<CacheGroupTable> live = shed_state_groups(b.group_tables);
    for (const std::string& id : captured) {
      auto it = std::find_if(live.begin(), live.end(), [&](const CacheGroupTable& t) { return t.group_id == id; });
      if (it == live.end()) {
        fail("batch.group_tables", "a table for every captured cache group (stale-table guard)",
             "no table for '" + id + "'");
      }
      const TensorView& t = it->page_table;
      if (!t.defined() || t.dtype != DType::int32 || t.ndim != 2 || !(t.device == dev)) {
        fail("batch.group_tables['" + id + "']", "int32 [rows, cols] on " + dev.str(),
             t.defined() ? t.shape_str() : "undefined");
      }
      if (t.size(1) > cols) fail("batch.group_tables['" + id + "']", "at most " + str(cols) + " columns", t.shape_str());
      GroupBuffers& gb = graph_.groups.at(id);
      const int64_t live_rows = std::min<int64_t>(t.size(0), bs);
      // Rows past the live table read page 0: only padded rows (seq_len <= 1) may lack one.
      for (int64_t r = live_rows; host_len && r < bs; ++r) {
        if ((*host_len)[r] > 1) {
          fail("batch.group_tables['" + id + "']", "a row for every request with seq_len > 1 (row " + str(r) +
               " has seq_len " + str((*host_len)[r]) + ")", t.shape_str());
        }
      }
      const int64_t live_cols = t.size(1);
      // Graph tables are padded with 0: clear stale wider columns, and padded rows.
      if (live_cols < gb.written_cols) {
        fill_bytes(gb.table.data(), dev, 0, gb.table.bytes(), s);
        gb.written_cols = 0;
      } else if (live_rows < bs) {
        fill_bytes(static_cast<int32_t*>(gb.table.data()) + live_rows * cols, dev, 0,
                   static_cast<std::size_t>((bs - live_rows) * cols) * 4, s);
      }
      gb.written_cols = std::max(gb.written_cols, live_cols);
      const std::string table_arg = "batch.group_tables['" + id + "']";
      if (live_rows > 0) {
        // A drafter's rows whole (its seq_lens advance in place between replays' steps,
        // into pages the lengths now do not reach), else padded past ceil(seq_len / P).
        TensorView lens = seq.slice(0, 0, live_rows);
        if (config_.is_draft) {
          const int whole = static_cast<int>(live_cols * P);
          lens = vec(graph_.row_lens, 0, live_rows);
          clamp(seq.slice(0, 0, live_rows), "batch.seq_lens", whole, whole, 1, lens);
        }
        with_user_args("gather_page_table_with_padding", {{"req_to_page", table_arg}, {"seq_lens", "batch.seq_lens"}},
                       [&] {
                         gather_page_table_with_padding(t, iota(live_rows), lens, mat(gb.table, live_rows, cols),
                                                        static_cast<int>(live_rows), static_cast<int>(live_cols), P, s);
                       });
      }
      const TensorView table = mat(gb.table, bs, cols);
      with_user_args("decode_write_slots", {{"page_table", table_arg}, {"seq_lens", "batch.seq_lens"}}, [&] {
        if (dmd) decode_write_slots(table, seq, P, 1, vec(gb.decode_slots, 0, bs), s);
        if (pmd) decode_write_slots(table, seq, P, verify_writes(), vec(gb.verify_slots, 0, int64_t{bs} * verify_writes()), s);
      });
    }
  }
  if (pmd) clamp(seq, "batch.seq_lens", N, config_.context_len, 1, pmd->cache_seqlens);
  decode_slot_ = dmd;
  prefill_slot_ = pmd;
  step_bs_ = bs;
} catch (const Error& e) {
  prefill_slot_ = decode_slot_ = nullptr;  // a rejected step leaves no metadata
  step_bs_ = -1;
  rethrow_in_call(e, "MhaBackend.init_forward_metadata_replay_cuda_graph");
}

void MhaBackend::fill_block_decode_seq_lens(int bs, const TensorView& block_ends) try {
  const CallScope call("MhaBackend.fill_block_decode_seq_lens");
  if (!block_draft()) fail("config.draft_block_decode", "true with spec_num_tokens > 1", "a non-block backend");
  const int N = config_.spec_num_tokens;
  if (decode_slot_ == nullptr || decode_slot_->batch < int64_t{bs} * N || bs < 0) {
    fail("bs", "<= the block-draft rows of the current decode slot / N", str(bs));
  }
  if (bs == 0) return;
  if (!block_ends.defined() || block_ends.dtype != DType::int32 || block_ends.ndim != 1 || block_ends.size(0) < bs ||
      !(block_ends.device == config_.device)) {
    fail("block_ends", "int32 [>= " + str(bs) + "] on " + config_.device.str(),
         block_ends.defined() ? std::string(dtype_name(block_ends.dtype)) + " " + block_ends.shape_str() + " on " +
                                    block_ends.device.str()
                              : "undefined");
  }
  clamp(block_ends.slice(0, 0, bs), "block_ends", N, config_.context_len, N,
        decode_slot_->cache_seqlens.slice(0, 0, int64_t{bs} * N));
} catch (const Error& e) {
  rethrow_in_call(e, "MhaBackend.fill_block_decode_seq_lens");
}

}  // namespace pagedmha
