// The validating front end of the metadata ops (page-table gather, cumulative lengths,
// length clamps, write slots): every argument checked, then the CPU or CUDA kernel
// (cpu/metadata.cpp, cuda/metadata/). The attention, append and merge ops are in ops.cpp.
#include "pagedmha/ops.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "core/problem.h"
#include "core/validate.h"
#include "cpu/cpu_ops.h"
#if PAGEDMHA_WITH_CUDA
#include "cuda/cuda_ops.h"
#endif

namespace pagedmha {

using detail::ArgCheck;
using detail::ceil_div;
using detail::int32_matrix;
using detail::kMaxInt32;
using detail::str;

void gather_page_table_with_padding(const TensorView& req_to_page, const TensorView& req_pool_indices,
                                    const TensorView& seq_lens, const TensorView& out, int bs, int cols,
                                    int page_size, Stream stream) {
  const ArgCheck chk("gather_page_table_with_padding");
  chk.int32_matrix(req_to_page, "req_to_page", req_to_page.device);
  const Device dev = req_to_page.device;
  chk.device_supported(dev);
  chk.int32_vector(req_pool_indices, "req_pool_indices", dev, -1);
  chk.int32_vector(seq_lens, "seq_lens", dev, -1);
  chk.int32_matrix(out, "out", dev);
  chk.no_self_overlap(out, "out");
  chk.int_at_least(page_size, "page_size", 1);
  chk.int_at_least(bs, "bs", 0);
  chk.int_at_least(cols, "cols", 0);
  if (cols > req_to_page.size(1)) {
    chk.fail("cols", "<= " + str(req_to_page.size(1)) + " (req_to_page capacity, max_pages)", str(cols));
  }
  chk.size_at_least(req_pool_indices, "req_pool_indices", 0, bs);
  chk.size_at_least(seq_lens, "seq_lens", 0, bs);
  chk.size_at_least(out, "out", 0, bs);
  chk.size_at_least(out, "out", 1, cols);
  chk.disjoint_from_inputs(
      out, "out", {{&req_to_page, "req_to_page"}, {&req_pool_indices, "req_pool_indices"}, {&seq_lens, "seq_lens"}});

  detail::GatherPageTableProblem p;
  p.req_to_page = int32_matrix(req_to_page);
  p.req_pool_indices = req_pool_indices.ptr<const int32_t>();
  p.seq_lens = seq_lens.ptr<const int32_t>();
  p.out = int32_matrix(out);
  p.bs = bs;
  p.cols = cols;
  p.page_size = page_size;
  p.device = dev;
  p.stream = stream.handle;
  if (bs == 0) return;

  if (dev.is_cpu()) {
    chk.non_negative(p.seq_lens, bs, "seq_lens");
    for (int r = 0; r < bs; ++r) {
      const int32_t idx = p.req_pool_indices[r];
      if (idx < 0 || idx >= p.req_to_page.rows) {
        chk.fail("req_pool_indices", "rows of req_to_page in [0, " + str(p.req_to_page.rows) + ")",
                 str(idx) + " at index " + str(r));
      }
      if (ceil_div(p.seq_lens[r], page_size) > cols) {
        chk.fail("seq_lens", "ceil(seq_lens[r] / page_size) <= cols " + str(cols),
                 str(p.seq_lens[r]) + " at index " + str(r));
      }
    }
    if (cols > 0) cpu::gather_page_table(p);
    return;
  }
#if PAGEDMHA_WITH_CUDA
  if (cols > 0) cuda::gather_page_table(p);
#endif
}

namespace {

void run_metadata(const detail::MetadataProblem& p) {
  if (p.device.is_cpu()) {
    cpu::metadata(p);
    return;
  }
#if PAGEDMHA_WITH_CUDA
  cuda::metadata(p);
#endif
}

// Positions [pos_begin, pos_end] of request r must lie inside the page table and map
// to int32 slots: every page column they touch holds an id with id * P + P - 1 < 2^31.
void check_positions(const ArgCheck& chk, const detail::MetadataProblem& p, int64_t r, int64_t pos_begin,
                     int64_t pos_end, const char* arg) {
  const int64_t P = p.page_size;
  if (pos_end / P >= p.page_table.cols) {
    chk.fail(arg, "positions inside the page table (" + str(p.page_table.cols) + " columns of " + str(P) + " tokens)",
             "position " + str(pos_end) + " for request " + str(r));
  }
  for (int64_t c = pos_begin / P; c <= pos_end / P; ++c) {
    const int64_t page = p.page_table.data[r * p.page_table.row_stride + c];
    if (page < 0 || page * P + P - 1 > kMaxInt32) {
      chk.fail("page_table", "page ids giving int32 slots in [0, 2^31)",
               str(page) + " at [" + str(r) + ", " + str(c) + "]");
    }
  }
}

}  // namespace

void cumsum_lengths(const TensorView& lengths, const TensorView& out, Stream stream) {
  const ArgCheck chk("cumsum_lengths");
  chk.int32_vector(lengths, "lengths", lengths.device, -1);
  chk.device_supported(lengths.device);
  chk.int32_vector(out, "out", lengths.device, lengths.size(0) + 1);
  chk.disjoint_from_input(out, "out", lengths, "lengths");
  detail::MetadataProblem p;
  p.op = detail::MetadataOp::cumsum_lengths;
  p.in = lengths.ptr<const int32_t>();
  p.out = out.ptr<int32_t>();
  p.n = lengths.size(0);
  p.device = lengths.device;
  p.stream = stream.handle;
  if (p.device.is_cpu()) {
    chk.non_negative(p.in, p.n, "lengths");
    int64_t total = 0;
    for (int64_t i = 0; i < p.n; ++i) total += p.in[i];
    if (total > kMaxInt32) chk.fail("lengths", "a total below 2^31", str(total));
  }
  run_metadata(p);
}

void clamp_seq_lens(const TensorView& seq_lens, int min_len, const TensorView& out, Stream stream) {
  clamp_seq_lens(seq_lens, min_len, std::numeric_limits<int32_t>::max(), 1, out, stream);
}

void clamp_seq_lens(const TensorView& seq_lens, int min_len, int max_len, int repeat, const TensorView& out,
                    Stream stream) {
  const ArgCheck chk("clamp_seq_lens");
  chk.int32_vector(seq_lens, "seq_lens", seq_lens.device, -1);
  chk.device_supported(seq_lens.device);
  chk.int_at_least(min_len, "min_len", 0);
  chk.int_at_least(max_len, "max_len", min_len);
  chk.int_at_least(repeat, "repeat", 1);
  chk.int32_vector(out, "out", seq_lens.device, seq_lens.size(0) * repeat);
  // In place: out starting where seq_lens does (the CPU writes backwards, so repeat > 1
  // works there; CUDA element-wise only). Any other overlap is an error.
  const bool in_place = out.data == seq_lens.data && (repeat == 1 || seq_lens.device.is_cpu());
  if (!in_place) chk.disjoint_from_input(out, "out", seq_lens, "seq_lens");
  detail::MetadataProblem p;
  p.op = detail::MetadataOp::clamp_seq_lens;
  p.in = seq_lens.ptr<const int32_t>();
  p.out = out.ptr<int32_t>();
  p.n = seq_lens.size(0);
  p.value = min_len;
  p.max_value = max_len;
  p.repeat = repeat;
  p.device = seq_lens.device;
  p.stream = stream.handle;
  if (p.n == 0) return;
  if (p.device.is_cpu()) chk.non_negative(p.in, p.n, "seq_lens");
  run_metadata(p);
}

void decode_write_slots(const TensorView& page_table, const TensorView& seq_lens, int page_size, int q_len_per_req,
                        const TensorView& out, Stream stream) {
  const ArgCheck chk("decode_write_slots");
  chk.int32_vector(seq_lens, "seq_lens", seq_lens.device, -1);
  const Device dev = seq_lens.device;
  chk.device_supported(dev);
  const int64_t bs = seq_lens.size(0);
  chk.int32_matrix(page_table, "page_table", dev);
  if (page_table.size(0) != bs) {
    chk.fail("page_table", "shape [" + str(bs) + ", *] (one row per seq_lens entry)", page_table.shape_str());
  }
  chk.int_at_least(page_size, "page_size", 1);
  chk.int_at_least(q_len_per_req, "q_len_per_req", 1);
  chk.int32_vector(out, "out", dev, bs * q_len_per_req);
  chk.disjoint_from_inputs(out, "out", {{&page_table, "page_table"}, {&seq_lens, "seq_lens"}});
  detail::MetadataProblem p;
  p.op = detail::MetadataOp::decode_write_slots;
  p.page_table = int32_matrix(page_table);
  p.in = seq_lens.ptr<const int32_t>();
  p.out = out.ptr<int32_t>();
  p.n = bs;
  p.page_size = page_size;
  p.value = q_len_per_req;
  p.device = dev;
  p.stream = stream.handle;
  if (bs == 0) return;
  if (dev.is_cpu()) {
    chk.non_negative(p.in, bs, "seq_lens");
    for (int64_t r = 0; r < bs; ++r) {
      const int64_t L = p.in[r];
      check_positions(chk, p, r, std::max<int64_t>(L - q_len_per_req, 0), std::max<int64_t>(L - 1, 0), "seq_lens");
    }
  }
  run_metadata(p);
}

void extend_write_slots(const TensorView& page_table, const TensorView& prefix_lens, const TensorView& cu_seqlens_q,
                        int page_size, const TensorView& out, Stream stream) {
  const ArgCheck chk("extend_write_slots");
  chk.int32_vector(prefix_lens, "prefix_lens", prefix_lens.device, -1);
  const Device dev = prefix_lens.device;
  chk.device_supported(dev);
  const int64_t bs = prefix_lens.size(0);
  chk.int32_matrix(page_table, "page_table", dev);
  if (page_table.size(0) != bs) {
    chk.fail("page_table", "shape [" + str(bs) + ", *] (one row per prefix_lens entry)", page_table.shape_str());
  }
  chk.int32_vector(cu_seqlens_q, "cu_seqlens_q", dev, bs + 1);
  chk.int32_vector(out, "out", dev, -1);
  chk.disjoint_from_inputs(
      out, "out", {{&page_table, "page_table"}, {&prefix_lens, "prefix_lens"}, {&cu_seqlens_q, "cu_seqlens_q"}});
  chk.int_at_least(page_size, "page_size", 1);
  detail::MetadataProblem p;
  p.op = detail::MetadataOp::extend_write_slots;
  p.page_table = int32_matrix(page_table);
  p.in = prefix_lens.ptr<const int32_t>();
  p.cu_seqlens_q = cu_seqlens_q.ptr<const int32_t>();
  p.out = out.ptr<int32_t>();
  p.n = bs;
  p.page_size = page_size;
  p.device = dev;
  p.stream = stream.handle;
  if (bs == 0) return;
  if (dev.is_cpu()) {
    chk.non_negative(p.in, bs, "prefix_lens");
    const int64_t total = p.cu_seqlens_q[bs];
    if (total > out.size(0)) chk.fail("out", "at least cu_seqlens_q[bs] = " + str(total) + " slots", out.shape_str());
    chk.prefix_sums(p.cu_seqlens_q, bs, total, "cu_seqlens_q");
    for (int64_t r = 0; r < bs; ++r) {
      const int64_t n = p.cu_seqlens_q[r + 1] - p.cu_seqlens_q[r];
      if (n > 0) check_positions(chk, p, r, p.in[r], int64_t{p.in[r]} + n - 1, "prefix_lens");
    }
  }
  run_metadata(p);
}

}  // namespace pagedmha
