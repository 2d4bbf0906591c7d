// One decode-context-parallel rank of the replay (make_dcp_rank_executor): it calls the
// ops directly, since a partial attention needs its lse and MhaBackend does not return it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/ops.h"
#include "replay/datagen.h"
#include "replay/graph.h"
#include "replay/kv_pool.h"
#include "replay/ranked_executor.h"
#include "replay/timer.h"

namespace pagedmha::tools {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Host metadata of one cache group for one step, and its device copy.
struct GroupStep {
  std::vector<int32_t> slots;  // [T] write slot of every step token on this rank
  std::vector<int32_t> table;  // [rows, cols]
  std::vector<int32_t> lens;   // [rows]
  int rows = 0, cols = 1;
  Buffer slots_dev, table_dev, lens_dev;

  // After the host arrays are filled: rows, and the device copies.
  void upload(Device dev, Stream stream) {
    rows = static_cast<int>(lens.size());
    copy_bytes(slots_dev.data(), dev, slots.data(), Device::cpu(), slots.size() * 4, stream);
    copy_bytes(table_dev.data(), dev, table.data(), Device::cpu(), table.size() * 4, stream);
    copy_bytes(lens_dev.data(), dev, lens.data(), Device::cpu(), lens.size() * 4, stream);
  }
  TensorView slots_view() const { return slots_dev.view({static_cast<int64_t>(slots.size())}, DType::int32); }
  TensorView table_view() const { return table_dev.view({rows, cols}, DType::int32); }
  TensorView lens_view() const { return lens_dev.view({rows}, DType::int32); }
};

class DcpRankExecutor final : public AttentionExecutor {
 public:
  DcpRankExecutor(const ExecutorConfig& c, int rank, int ranks, Collective& collective)
      : cfg_(c), dev_(c.device), rank_(rank), ranks_(ranks), layout_{ranks, c.page_size}, collective_(collective),
        owned_stream_(c.device), stream_(owned_stream_.get()), timer_(c.device, stream_),
        combine_timer_(c.device, stream_) {
    const ModelSpec& m = cfg_.model;
    const int Hq = m.num_q_heads, Hkv = m.num_kv_heads, D = m.head_dim, P = cfg_.page_size;
    const int64_t T = cfg_.max_tokens, rows = cfg_.max_rows;
    const int max_cols = static_cast<int>(ceil_div(std::max(cfg_.context_len, cfg_.spec_tokens), P));
    // The page after the pool takes the writes of positions other ranks hold.
    junk_slot_ = static_cast<int32_t>(cfg_.num_pages * P);
    for (int l = 0; l < m.num_layers; ++l) {
      for (std::vector<Buffer>* pool : {&k_cache_, &v_cache_}) {
        pool->push_back(Buffer::empty({cfg_.num_pages + 1, P, Hkv, D}, cfg_.kv_dtype, dev_));
        fill_bytes(pool->back().data(), dev_, 0, pool->back().bytes(), stream_);  // page 0 reads as zero
      }
      std::vector<float> host(Hq);
      for (int h = 0; h < Hq; ++h) host[h] = sink_value(cfg_.seed, l, h);
      sinks_.emplace_back(host.size() * 4, dev_);
      copy_bytes(sinks_.back().data(), dev_, host.data(), Device::cpu(), host.size() * 4, stream_);
    }
    q_ = Buffer::empty({T, Hq, D}, cfg_.q_dtype, dev_);
    k_ = Buffer::empty({T, Hkv, D}, cfg_.q_dtype, dev_);
    v_ = Buffer::empty({T, Hkv, D}, cfg_.q_dtype, dev_);
    out_ = Buffer::empty({T, Hq, D}, cfg_.q_dtype, dev_);
    parts_ = Buffer::empty({2, T, Hq, D}, cfg_.q_dtype, dev_);
    parts_lse_ = Buffer::empty({2, T, Hq}, DType::fp32, dev_);
    gathered_ = Buffer::empty({ranks, T, Hq, D}, cfg_.q_dtype, dev_);
    gathered_lse_ = Buffer::empty({ranks, T, Hq}, DType::fp32, dev_);
    if (dev_.is_cuda()) tokens_dev_ = Buffer(static_cast<size_t>(T) * sizeof(TokenRef), dev_);
    // Decode steps: one row per query token (verify: N per request).
    const int64_t table_rows = std::max(rows * cfg_.spec_tokens, rows);
    for (size_t g = 0; g < m.groups.size(); ++g) {
      GroupStep& gs = groups_.emplace_back();
      gs.slots_dev = Buffer::empty({T}, DType::int32, dev_);
      gs.table_dev = Buffer::empty({table_rows, max_cols}, DType::int32, dev_);
      gs.lens_dev = Buffer::empty({table_rows}, DType::int32, dev_);
    }
    cu_dev_ = Buffer::empty({rows + 1}, DType::int32, dev_);
    // Rank 0's scratch cache for the new tokens of extend steps: each row's from a fresh page.
    scratch_cols_ = static_cast<int>(ceil_div(T, P)) + 1;
    const int64_t scratch_pages = ceil_div(T, P) + rows + 1;
    if (rank_ == 0) {
      scratch_k_ = Buffer::empty({scratch_pages, P, Hkv, D}, cfg_.kv_dtype, dev_);
      scratch_v_ = Buffer::empty({scratch_pages, P, Hkv, D}, cfg_.kv_dtype, dev_);
      scratch_.slots_dev = Buffer::empty({T}, DType::int32, dev_);
      scratch_.table_dev = Buffer::empty({rows, scratch_cols_}, DType::int32, dev_);
      scratch_.lens_dev = Buffer::empty({rows}, DType::int32, dev_);
    }
    const size_t decode_ws = std::max(decode_workspace_size(dev_, table_rows, 1, Hq, Hkv, D),
                                      decode_workspace_size(dev_, rows, cfg_.spec_tokens, Hq, Hkv, D));
    if (decode_ws) decode_ws_ = Buffer(decode_ws, dev_);
    const size_t prefill_ws = prefill_workspace_size(dev_, rows, T);
    if (prefill_ws) prefill_ws_ = Buffer(prefill_ws, dev_);
    synchronize(stream_);
  }

  std::string name() const override { return "DCP rank: the ops on " + dev_.str() + " (eager)"; }
  Stream stream() const override { return stream_; }
  StepHostTimes take_host_times() override {
    StepHostTimes t = times_;
    times_ = {};
    return t;
  }
  std::vector<RankTimes> take_rank_times() override { return {{attention_s_, combine_timer_.take_seconds()}}; }

  double run_step(const StepPlan& plan, const std::vector<RequestState>& states,
                  const std::vector<CapturePoint>& capture, std::vector<std::vector<float>>* captured) override {
    const auto t0 = std::chrono::steady_clock::now();
    const ModelSpec& m = cfg_.model;
    const int Hq = m.num_q_heads, Hkv = m.num_kv_heads, D = m.head_dim, P = cfg_.page_size;
    const int bs = static_cast<int>(plan.rows.size());
    const int64_t T = static_cast<int64_t>(plan.tokens.size());
    if (T > cfg_.max_tokens || bs > cfg_.max_rows)
      throw Error("replay: internal: step of " + std::to_string(T) + " tokens / " + std::to_string(bs) +
                  " rows exceeds the executor's buffers");
    const bool extend = plan.num_extend > 0;
    captured->assign(capture.size(), {});
    for (size_t g = 0; g < groups_.size(); ++g) prepare_group(plan, states, static_cast<int>(g), extend);
    int max_q = 1;
    std::vector<int32_t>& cu = cu_host_;
    cu.assign(bs + 1, 0);
    for (int i = 0; i < bs; ++i) {
      cu[i + 1] = cu[i] + plan.rows[i].q_len;
      max_q = std::max(max_q, plan.rows[i].q_len);
    }
    copy_bytes(cu_dev_.data(), dev_, cu.data(), Device::cpu(), cu.size() * 4, stream_);
    if (extend && rank_ == 0) prepare_scratch(plan);
    if (dev_.is_cuda())
      copy_bytes(tokens_dev_.data(), dev_, plan.tokens.data(), Device::cpu(), T * sizeof(TokenRef), stream_);
    times_.prepare_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    const TensorView q = q_.view({T, Hq, D}, cfg_.q_dtype);
    const TensorView k = k_.view({T, Hkv, D}, cfg_.q_dtype);
    const TensorView v = v_.view({T, Hkv, D}, cfg_.q_dtype);
    const TensorView out = out_.view({T, Hq, D}, cfg_.q_dtype);
    const TensorView cu_view = cu_dev_.view({bs + 1}, DType::int32);
    // Part 1 is what this rank sends: its keys' partial attention (rank 0: merged with part 0,
    // the new tokens among themselves). Strided views [2, T, ...] over buffers sized for max T.
    const int64_t Tmax = cfg_.max_tokens;
    const TensorView parts(parts_.data(), cfg_.q_dtype, dev_, {2, T, Hq, D}, {Tmax * Hq * D, int64_t{Hq} * D, D, 1});
    const TensorView parts_lse(parts_lse_.data(), DType::fp32, dev_, {2, T, Hq}, {Tmax * Hq, Hq, 1});
    const TensorView send(parts.slice(0, 1, 1).data, cfg_.q_dtype, dev_, {T, Hq, D});
    const TensorView send_lse(parts_lse.slice(0, 1, 1).data, DType::fp32, dev_, {T, Hq});
    const TensorView gathered = gathered_.view({ranks_, T, Hq, D}, cfg_.q_dtype);
    const TensorView gathered_lse = gathered_lse_.view({ranks_, T, Hq}, DType::fp32);
    for (int l = 0; l < m.num_layers; ++l) {
      generate(q, plan.tokens, l, TokenTensor::q);
      generate(k, plan.tokens, l, TokenTensor::k);
      generate(v, plan.tokens, l, TokenTensor::v);
      const int g = m.layer_group[l];
      const GroupStep& gs = groups_[g];
      const TensorView kc = cache_view(k_cache_[l]), vc = cache_view(v_cache_[l]);
      const TensorView slots = gs.slots_view(), table = gs.table_view(), lens = gs.lens_view();
      const TensorView sinks = m.sinks ? sinks_[l].view({Hq}, DType::fp32) : TensorView{};
      AttentionParams prm;
      prm.bmm1_scale = cfg_.k_scale / std::sqrt(static_cast<float>(D));
      prm.bmm2_scale = cfg_.v_scale;
      timer_.start();
      append_kv(k, v, kc, vc, slots, P, cfg_.k_scale, cfg_.v_scale, stream_);
      if (!sharded(g)) {
        // A sliding-window layer: this rank holds every key, so it attends alone.
        prm.window_left = m.window_left(l);
        prm.sinks = sinks;
        if (extend) batch_prefill(q, kc, vc, table, lens, cu_view, P, max_q, out, prm, {}, prefill_ws(), stream_);
        else batch_decode(q, kc, vc, table, lens, P, plan.decode_q_len, out, prm, {}, decode_ws(), stream_);
      } else {
        if (!extend) {
          // One row per query over this rank's keys up to the query (lens from prepare_group).
          batch_decode(q, kc, vc, table, lens, P, 1, send, prm, send_lse, decode_ws(), stream_);
        } else {
          // The cached prefix this rank holds: every new token sees all of it.
          AttentionParams prefix = prm;
          prefix.causal = false;
          batch_prefill(q, kc, vc, table, lens, cu_view, P, max_q, send, prefix, send_lse, prefill_ws(), stream_);
          if (rank_ == 0) {
            // The new tokens among themselves (causal), merged into part 1 in place.
            const TensorView sk = scratch_view(scratch_k_), sv = scratch_view(scratch_v_);
            append_kv(k, v, sk, sv, scratch_.slots_view(), P, cfg_.k_scale, cfg_.v_scale, stream_);
            batch_prefill(q, sk, sv, scratch_.table_view(), scratch_.lens_view(), cu_view, P, max_q,
                          TensorView(parts.data, cfg_.q_dtype, dev_, {T, Hq, D}), prm,
                          TensorView(parts_lse.data, DType::fp32, dev_, {T, Hq}), prefill_ws(), stream_);
            merge_attention_states(parts, parts_lse, send, send_lse, {}, stream_);  // in place into part 1
          }
        }
      }
      timer_.stop();
      if (sharded(g)) {
        combine_timer_.start();
        collective_.all_gather(rank_, {{send, gathered}, {send_lse, gathered_lse}}, stream_);
        merge_attention_states(gathered, gathered_lse, out, {}, sinks, stream_);
        combine_timer_.stop();
      }
      capture_rows(out, capture, l, captured, stream_);
    }
    attention_s_ = timer_.take_seconds();
    return attention_s_;
  }

 private:
  bool sharded(int group) const { return cfg_.model.groups[group].window_left < 0; }
  TensorView cache_view(const Buffer& b) const {
    return b.view({(cfg_.num_pages + 1) * cfg_.page_size, cfg_.model.num_kv_heads, cfg_.model.head_dim}, cfg_.kv_dtype);
  }
  TensorView scratch_view(const Buffer& b) const {
    const int64_t slots = static_cast<int64_t>(b.bytes() / dtype_size(cfg_.kv_dtype)) /
                          (int64_t{cfg_.model.num_kv_heads} * cfg_.model.head_dim);
    return b.view({slots, cfg_.model.num_kv_heads, cfg_.model.head_dim}, cfg_.kv_dtype);
  }
  TensorView decode_ws() const { return decode_ws_.data() ? decode_ws_.bytes_view() : TensorView{}; }
  TensorView prefill_ws() const { return prefill_ws_.data() ? prefill_ws_.bytes_view() : TensorView{}; }

  // This rank's id of a page of group g (its own pool's, page 0 included): the scheduler's
  // pool deals a sharded group's ids to the ranks (PagePool with owners).
  int32_t local_id(int g, int32_t page) const {
    return sharded(g) ? owner_local_page(page, cfg_.num_pages - 1) : page;
  }

  // Write slots, tables and lengths of group g for this step, uploaded to the device.
  void prepare_group(const StepPlan& plan, const std::vector<RequestState>& states, int g, bool extend) {
    GroupStep& gs = groups_[g];
    const int P = cfg_.page_size;
    gs.slots.clear(), gs.table.clear(), gs.lens.clear();
    const bool split = sharded(g);
    // Columns: this rank's pages of the longest row (all pages for a group it holds whole).
    gs.cols = 1;
    for (const RowPlan& row : plan.rows)
      gs.cols = std::max<int>(gs.cols, static_cast<int>(split ? layout_.local_pages(rank_, row.seq_len)
                                                              : ceil_div(row.seq_len, P)));
    std::vector<int32_t> row_table(gs.cols);
    for (const RowPlan& row : plan.rows) {
      const std::vector<int32_t>& pages = states[row.request].pages[g];
      std::fill(row_table.begin(), row_table.end(), 0);
      if (split) {
        const int64_t n = layout_.local_pages(rank_, row.seq_len);
        for (int64_t c = 0; c < n; ++c) row_table[c] = local_id(g, pages[c * ranks_ + rank_]);
      } else {
        const int64_t n = ceil_div(row.seq_len, P);
        for (int64_t c = 0; c < n; ++c) row_table[c] = pages[c];
      }
      for (int pos = row.prefix_len; pos < row.seq_len; ++pos) {
        const int64_t c = pos / P;
        if (split && layout_.owner_of_page(c) != rank_) {
          gs.slots.push_back(junk_slot_);
          continue;
        }
        const int32_t page = local_id(g, pages[c]);
        if (page == 0)
          throw Error("replay: internal: write of request " + std::to_string(row.request) + " position " +
                      std::to_string(pos) + " targets the dummy page");
        gs.slots.push_back(static_cast<int32_t>(int64_t{page} * P + pos % P));
      }
      if (split && !extend) {
        // One row per query: the keys this rank holds up to the query's own position.
        for (int pos = row.prefix_len; pos < row.seq_len; ++pos) {
          gs.table.insert(gs.table.end(), row_table.begin(), row_table.end());
          gs.lens.push_back(static_cast<int32_t>(layout_.local_len(rank_, int64_t{pos} + 1)));
        }
      } else {
        gs.table.insert(gs.table.end(), row_table.begin(), row_table.end());
        gs.lens.push_back(split ? static_cast<int32_t>(layout_.local_len(rank_, row.prefix_len)) : row.seq_len);
      }
    }
    gs.upload(dev_, stream_);
  }

  // Rank 0, extend steps: row i's new tokens at scratch positions [0, q_len) from a fresh page.
  void prepare_scratch(const StepPlan& plan) {
    const int P = cfg_.page_size;
    GroupStep& s = scratch_;
    s.slots.clear(), s.table.clear(), s.lens.clear();
    s.cols = scratch_cols_;
    int32_t next = 1;  // page 0 stays the dummy
    for (const RowPlan& row : plan.rows) {
      const int32_t first = next;
      const int64_t pages = ceil_div(row.q_len, P);
      for (int c = 0; c < s.cols; ++c) s.table.push_back(c < pages ? first + c : 0);
      for (int j = 0; j < row.q_len; ++j) s.slots.push_back(static_cast<int32_t>((first + j / P) * int64_t{P} + j % P));
      s.lens.push_back(row.q_len);
      next = static_cast<int32_t>(first + pages);
    }
    s.upload(dev_, stream_);
  }

  void generate(const TensorView& t, const std::vector<TokenRef>& tokens, int layer, TokenTensor which) {
    const int64_t T = static_cast<int64_t>(tokens.size());
    if (dev_.is_cpu()) fill_tokens_host(t, tokens.data(), T, cfg_.seed, layer, which);
    else fill_tokens_cuda(t, static_cast<TokenRef*>(tokens_dev_.data()), T, cfg_.seed, layer, which, stream_);
  }

  ExecutorConfig cfg_;
  Device dev_;
  int rank_, ranks_;
  DcpLayout layout_;
  Collective& collective_;
  CudaStream owned_stream_;
  Stream stream_;
  IntervalTimer timer_, combine_timer_;
  int scratch_cols_ = 1;
  int32_t junk_slot_ = 0;
  std::vector<Buffer> k_cache_, v_cache_, sinks_;
  Buffer q_, k_, v_, out_, parts_, parts_lse_, gathered_, gathered_lse_, tokens_dev_, cu_dev_;
  Buffer scratch_k_, scratch_v_, decode_ws_, prefill_ws_;
  std::vector<GroupStep> groups_;
  GroupStep scratch_;
  std::vector<int32_t> cu_host_;
  StepHostTimes times_;
  double attention_s_ = 0.0;
};

}  // namespace

std::unique_ptr<AttentionExecutor> make_dcp_rank_executor(const ExecutorConfig& config, int rank, int ranks,
                                                          Collective& collective) {
  return std::make_unique<DcpRankExecutor>(config, rank, ranks, collective);
}

}  // namespace pagedmha::tools
