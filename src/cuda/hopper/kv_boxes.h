// The TMA box rule for paged K / V (plain C++: the launchers and tests/cpu/arch read it):
// how many rows one box holds and whether a page size allows boxes at all. The rest of
// the TMA test (alignment, strides, tensor-map limits) is paged_kv.cuh kv_tma_ok.
#pragma once

namespace pagedmha::cuda::sm90 {

/// Rows of one TMA box of K / V for tiles of block_n keys: a page, or where a page holds
/// more, the largest power of two that divides the tile (the tile itself when it is
/// one), so that no box straddles a page or a tile.
inline int kv_box_rows(int page_size, int block_n) {
  const int b = block_n & -block_n;
  return page_size < b ? page_size : b;
}

/// Whether pages of page_size rows can be loaded in kv_box_rows boxes: a multiple of 8
/// rows (every 16-bit box then starts on a 1024-byte swizzle boundary), with the box a
/// power of two (the producers map keys to boxes by shifts; it then divides the tile)
/// that divides the page. For tiles of a power of two this is: pages that divide the
/// tile or are a multiple of it.
inline bool kv_box_layout_ok(int page_size, int block_n) {
  if (page_size <= 0 || block_n <= 0 || page_size % 8 != 0) return false;
  const int box = kv_box_rows(page_size, block_n);
  return (box & (box - 1)) == 0 && page_size % box == 0;
}

/// Whether boxes of item_heads adjacent KV heads (one row of item_heads * head_dim
/// elements: the decode's items of two heads, decode_sm90/policy.h kItemHeads) fit the
/// cache: the heads a multiple of item_heads and each head's row right after the
/// previous one in K and in V (head stride head_dim elements: NHD, not head-major).
inline bool kv_heads_adjacent(int num_kv_heads, long long k_head_stride, long long v_head_stride, int head_dim,
                              int item_heads) {
  return item_heads == 1 || (item_heads > 1 && num_kv_heads % item_heads == 0 && k_head_stride == head_dim &&
                             v_head_stride == head_dim);
}

}  // namespace pagedmha::cuda::sm90
