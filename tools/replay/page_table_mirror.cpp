#include "replay/page_table_mirror.h"

#include <algorithm>
#include <string>

#include "pagedmha/error.h"
#include "pagedmha/ops.h"

namespace pagedmha::tools {

PageTableMirror::PageTableMirror(Device device, int groups, int max_rows, int max_pages, int page_size,
                                 Stream stream)
    : device_(device), stream_(stream), groups_(groups), max_rows_(max_rows), max_pages_(max_pages),
      page_size_(page_size) {
  const int64_t entries = int64_t{groups} * (max_rows + 1) * max_pages;
  if (entries >= (int64_t{1} << 31))
    throw Error("replay: page tables of " + std::to_string(entries) + " entries exceed int32 indexing");
  tables_ = Buffer(static_cast<std::size_t>(entries) * 4, device);
  fill_bytes(tables_.data(), device, 0, tables_.bytes(), stream);
  slots_.resize(static_cast<std::size_t>(max_rows) + 1);
  for (int s = max_rows; s >= 1; --s) free_.push_back(s);
  for (Slot& s : slots_) s.cols.assign(groups, 0), s.rel.assign(groups, 0);
}

void PageTableMirror::sync(const StepPlan& plan, const std::vector<RequestState>& states, int padded_rows) {
  if (slot_of_.size() < states.size()) slot_of_.resize(states.size(), -1);
  // Slots of requests that finished or were preempted (a re-admission is a new epoch).
  for (int s = 1; s <= max_rows_; ++s) {
    Slot& slot = slots_[s];
    if (slot.request < 0) continue;
    const RequestState& st = states[slot.request];
    if (st.phase == RequestState::Phase::running && st.admitted_at == slot.epoch) continue;
    slot_of_[slot.request] = -1;
    slot.request = -1;
    free_.push_back(s);
  }
  const int bs = static_cast<int>(plan.rows.size());
  const int head = (padded_rows + 1) & ~1;  // keeps the pairs 8-byte aligned
  staging_.assign(static_cast<std::size_t>(head), 0);
  const int64_t group_stride = int64_t{max_rows_ + 1} * max_pages_;
  for (int i = 0; i < bs; ++i) {
    const int r = plan.rows[i].request;
    const RequestState& st = states[r];
    int s = slot_of_[r];
    if (s < 0) {
      if (free_.empty()) throw Error("replay: internal: more running requests than page-table slots");
      s = free_.back();
      free_.pop_back();
      slot_of_[r] = s;
      slots_[s].request = r;
      slots_[s].epoch = st.admitted_at;
      std::fill(slots_[s].cols.begin(), slots_[s].cols.end(), 0);
      std::fill(slots_[s].rel.begin(), slots_[s].rel.end(), 0);
    }
    staging_[i] = s;
    Slot& slot = slots_[s];
    for (int g = 0; g < groups_; ++g) {
      const std::vector<int32_t>& pages = st.pages[g];
      const int n = static_cast<int>(pages.size());
      if (n > max_pages_)
        throw Error("replay: internal: request " + std::to_string(r) + " holds " + std::to_string(n) +
                    " pages, the tables have " + std::to_string(max_pages_) + " columns");
      const int64_t base = g * group_stride + int64_t{s} * max_pages_;
      // Pages a window released since the last upload read as 0 (the dummy page).
      const int released = std::min(st.released[g], slot.cols[g]);
      for (int c = slot.rel[g]; c < released; ++c) staging_.insert(staging_.end(), {int32_t(base + c), 0});
      for (int c = slot.cols[g]; c < n; ++c) staging_.insert(staging_.end(), {int32_t(base + c), pages[c]});
      slot.rel[g] = std::max(slot.rel[g], released);
      slot.cols[g] = std::max(slot.cols[g], n);
    }
  }
  const int64_t pairs = (static_cast<int64_t>(staging_.size()) - head) / 2;
  last_uploaded_ = pairs;
  indices_rows_ = padded_rows;
  const std::size_t bytes = staging_.size() * 4;
  if (upload_.bytes() < bytes) upload_ = Buffer(std::max(bytes, 2 * upload_.bytes()), device_);  // rare growth
  int32_t* table = static_cast<int32_t*>(tables_.data());
  if (device_.is_cpu()) {
    std::copy(staging_.begin(), staging_.begin() + head, static_cast<int32_t*>(upload_.data()));
    for (std::size_t i = head; i < staging_.size(); i += 2) table[staging_[i]] = staging_[i + 1];
    return;
  }
  copy_bytes(upload_.data(), device_, staging_.data(), Device::cpu(), bytes, stream_);
  scatter_pairs_cuda(table, static_cast<const int32_t*>(upload_.data()) + head, pairs, stream_);
}

void PageTableMirror::gather(int group, const TensorView& seq_lens, const TensorView& out, int rows, int cols) const {
  if (rows > indices_rows_)
    throw Error("replay: internal: gather of " + std::to_string(rows) + " rows after a sync of " +
                std::to_string(indices_rows_));
  const TensorView table(static_cast<int32_t*>(tables_.data()) + int64_t{group} * (max_rows_ + 1) * max_pages_,
                         DType::int32, device_, {int64_t{max_rows_} + 1, max_pages_});
  const TensorView indices(upload_.data(), DType::int32, device_, {rows});
  gather_page_table_with_padding(table, indices, seq_lens, out, rows, cols, page_size_, stream_);
}

#if !defined(PAGEDMHA_WITH_CUDA)
void scatter_pairs_cuda(int32_t*, const int32_t*, int64_t, Stream) {
  throw Error("scatter_pairs_cuda: this build has no CUDA support");
}
#endif

}  // namespace pagedmha::tools
