// Device-resident request-to-page tables of the replay, one per cache group, kept in step
// with the scheduler by uploading only the entries that changed (new pages, pages a
// window released): O(rows + changed pages) host work per step instead of rebuilding
// and copying [rows, cols] tables. Each step's batch-ordered group tables are gathered on
// the device (gather_page_table_with_padding), as an engine does from its req_to_page.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedmha/memory.h"
#include "pagedmha/tensor.h"
#include "replay/scheduler.h"

namespace pagedmha::tools {

class PageTableMirror {
 public:
  /// max_rows: concurrent requests (slots 1..max_rows; row 0 stays all zeros for padded
  /// batch rows); max_pages: columns (ceil(context_len / page_size)).
  PageTableMirror(Device device, int groups, int max_rows, int max_pages, int page_size, Stream stream);

  /// Uploads the changed entries of the plan's requests and the step's slot indices
  /// (padded_rows >= plan rows; padded rows get slot 0). Asynchronous on the stream.
  void sync(const StepPlan& plan, const std::vector<RequestState>& states, int padded_rows);
  /// Gathers group g's batch table rows [0, rows) x cols into `out` (int32 [>= rows, >= cols])
  /// over the synced slots; seq_lens: device int32 [>= rows] (zero padding past each length).
  void gather(int group, const TensorView& seq_lens, const TensorView& out, int rows, int cols) const;
  /// Entries uploaded by the last sync (for tests and reports).
  int64_t last_uploaded() const { return last_uploaded_; }

 private:
  struct Slot {
    int request = -1;
    int64_t epoch = -1;              // admitted_at of the request when it took the slot
    std::vector<int32_t> cols, rel;  // per group: columns uploaded, leading columns zeroed
  };
  Device device_;
  Stream stream_;
  int groups_, max_rows_, max_pages_, page_size_;
  Buffer tables_;                    // int32 [groups, max_rows + 1, max_pages]
  std::vector<Slot> slots_;          // [max_rows + 1]
  std::vector<int> free_, slot_of_;  // free slot ids; request -> slot (-1)
  std::vector<int32_t> staging_;     // [slots of the padded rows, even length | (index, value) pairs]
  Buffer upload_;
  int64_t last_uploaded_ = 0;
  int indices_rows_ = 0;
};

/// out[idx] = val for the n (idx, val) int32 pairs at `pairs` (device, 8-byte aligned); CUDA builds.
void scatter_pairs_cuda(int32_t* out, const int32_t* pairs, int64_t n, Stream stream);

}  // namespace pagedmha::tools
