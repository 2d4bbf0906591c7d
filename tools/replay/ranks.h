// Ranks of a multi-GPU replay (`--gpus N` with `--tp N` or `--dcp N`): which heads a
// tensor-parallel rank serves and which tokens a decode-context-parallel rank holds.
// Pure bookkeeping (no device), shared by the scheduler, the executors and the tests.
#pragma once

#include <cstdint>
#include <string>

namespace pagedmha::tools {

/// single: one device, today's replay (`--tp N` alone serves one rank's heads);
/// tp: `--gpus N --tp N`; dcp: `--gpus N --dcp N`.
enum class RankMode { single, tp, dcp };

struct RankSetup {
  RankMode mode = RankMode::single;
  int ranks = 1;
  /// "tp" / "dcp" / "single".
  const char* mode_name() const;
};

/// Largest --gpus.
inline constexpr int kMaxRanks = 64;

/// Heads of tensor-parallel rank `rank` of `tp`: query heads [q_begin, q_begin + q_heads)
/// and KV heads [kv_begin, kv_begin + kv_heads) of the whole model. Hkv >= tp: Hkv / tp KV
/// heads each; Hkv < tp (tp a multiple of Hkv): the one KV head its query heads read,
/// replicated on tp / Hkv ranks, as engines replicate it.
struct TpShard {
  int q_begin = 0, q_heads = 0;
  int kv_begin = 0, kv_heads = 0;
};

/// Throws Error naming --tp when tp does not divide num_q_heads, or is neither a divisor
/// nor a multiple of num_kv_heads, or rank is outside [0, tp). make_model's --tp takes
/// rank 0's heads from here.
TpShard tp_shard(int num_q_heads, int num_kv_heads, int tp, int rank);

/// Decode context parallelism: position p of a request lives on rank (p / page_size) %
/// ranks, whole pages dealt round-robin (vLLM's DCP interleave at page granularity), so
/// decode appends go to one rank per page and every rank's share stays within a page of
/// the others'. Rank r's positions, in order, form its local sequence: logical page c
/// (c % ranks == r) is its local page c / ranks and a position keeps its offset in the
/// page, so the positions of [0, L) that r holds are exactly its local positions
/// [0, local_len(r, L)).
struct DcpLayout {
  int ranks = 1;
  int page_size = 16;

  int owner_of_page(int64_t logical_page) const { return static_cast<int>(logical_page % ranks); }
  int owner(int64_t position) const { return owner_of_page(position / page_size); }
  /// Column of logical page `logical_page` in its owner's page table.
  int64_t local_page(int64_t logical_page) const { return logical_page / ranks; }
  /// Index of `position` in its owner's local sequence.
  int64_t local_position(int64_t position) const {
    return local_page(position / page_size) * page_size + position % page_size;
  }
  /// How many of the positions [0, L) rank `rank` holds.
  int64_t local_len(int rank, int64_t L) const;
  /// Pages of a request of KV length L that rank `rank` holds (ceil(local_len / page_size)).
  int64_t local_pages(int rank, int64_t L) const;
};

}  // namespace pagedmha::tools
