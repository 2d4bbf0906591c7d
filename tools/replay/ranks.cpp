#include "replay/ranks.h"

#include <string>

#include "pagedmha/error.h"

namespace pagedmha::tools {

const char* RankSetup::mode_name() const {
  switch (mode) {
    case RankMode::tp: return "tp";
    case RankMode::dcp: return "dcp";
    default: return "single";
  }
}

TpShard tp_shard(int num_q_heads, int num_kv_heads, int tp, int rank) {
  const auto bad = [&](const std::string& expected) {
    throw_invalid_argument("replay", "--tp", expected, std::to_string(tp));
  };
  if (tp < 1 || num_q_heads % tp != 0) bad(">= 1 and dividing the query heads (" + std::to_string(num_q_heads) + ")");
  if (num_kv_heads < 1 || (num_kv_heads % tp != 0 && tp % num_kv_heads != 0))
    bad("a divisor or multiple of the KV heads (" + std::to_string(num_kv_heads) + ")");
  if (rank < 0 || rank >= tp)
    throw Error("replay: internal: tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(tp));
  TpShard s;
  s.q_heads = num_q_heads / tp;
  s.q_begin = rank * s.q_heads;
  if (num_kv_heads >= tp) {
    s.kv_heads = num_kv_heads / tp;
    s.kv_begin = rank * s.kv_heads;
  } else {
    // The KV head of this rank's query heads (a group of Hq / Hkv >= Hq / tp heads holds them all).
    s.kv_heads = 1;
    s.kv_begin = s.q_begin / (num_q_heads / num_kv_heads);
  }
  return s;
}

int64_t DcpLayout::local_len(int rank, int64_t L) const {
  if (L <= 0) return 0;
  const int64_t full = L / page_size, rem = L % page_size;
  // Whole pages c < full with c % ranks == rank, then the partial page when it is ours.
  const int64_t pages = full > rank ? (full - rank + ranks - 1) / ranks : 0;
  return pages * page_size + (rem > 0 && owner_of_page(full) == rank ? rem : 0);
}

int64_t DcpLayout::local_pages(int rank, int64_t L) const {
  if (L <= 0) return 0;
  const int64_t pages = (L + page_size - 1) / page_size;
  return pages > rank ? (pages - rank + ranks - 1) / ranks : 0;
}

}  // namespace pagedmha::tools
