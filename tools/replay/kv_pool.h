// Page pools (one per cache group, page 0 reserved) and the prefix cache keyed by
// Mooncake-style block hashes.
#pragma once

#include <cstdint>
#include <set>
#include <utility>
#include <unordered_map>
#include <vector>

namespace pagedmha::tools {

/// Page ids dealt to several owners (ranks), `owner_pages` usable pages each: owner o holds
/// [1 + o * owner_pages, 1 + (o + 1) * owner_pages), and on its rank, whose own pool has
/// page 0 as well, page `page` is page - o * owner_pages. Page 0 is every rank's dummy.
inline int page_owner(int32_t page, int64_t owner_pages) { return static_cast<int>((page - 1) / owner_pages); }
inline int32_t owner_local_page(int32_t page, int64_t owner_pages) {
  return page == 0 ? 0 : static_cast<int32_t>(page - int64_t{page_owner(page, owner_pages)} * owner_pages);
}

/// Refcounted pages of one cache group. Page 0 is the reserved dummy page: never
/// handed out, never freed. Pages are shared by reference (prefix cache, requests);
/// a page returns to the free list when its last reference is released.
///
/// Decode context parallelism (`owners` > 1): the pool is one pool of `num_pages` pages
/// per rank (each with its own page 0 there); owner o holds the ids
/// [1 + o * (num_pages - 1), 1 + (o + 1) * (num_pages - 1)), local id on its rank
/// id - o * (num_pages - 1), and a page is allocated from a given owner's share.
class PagePool {
 public:
  /// `num_pages` includes page 0, so `num_pages - 1` pages per owner are usable (>= 1).
  explicit PagePool(int64_t num_pages, int owners = 1);

  int64_t num_pages() const { return static_cast<int64_t>(refcount_.size()); }
  int64_t capacity() const { return num_pages() - 1; }
  int64_t free_pages() const { return free_total_; }
  int64_t used_pages() const { return capacity() - free_pages(); }
  int owners() const { return static_cast<int>(free_.size()); }
  /// Usable pages of one owner (capacity() / owners()).
  int64_t owner_capacity() const { return per_owner_; }
  int64_t free_pages(int owner) const { return static_cast<int64_t>(free_.at(owner).size()); }
  int64_t used_pages(int owner) const { return per_owner_ - free_pages(owner); }
  /// The owner (rank) of page `page` >= 1, and its id in that rank's own pool (page_owner).
  int owner_of(int32_t page) const { return page_owner(page, per_owner_); }
  int32_t local_id(int32_t page) const { return owner_local_page(page, per_owner_); }
  /// Used pages that only the prefix cache holds (no request references them).
  int64_t cache_only_pages() const { return cache_only_; }
  /// Used pages a request references (used_pages() - cache_only_pages()).
  int64_t live_pages() const { return used_pages() - cache_only_; }
  int32_t refcount(int32_t page) const { return refcount_.at(page); }

  /// A free page of `owner` with refcount 1, or 0 when that owner has none free.
  int32_t allocate(int owner = 0);
  /// Adds a reference; `by_cache`: the prefix cache's.
  void retain(int32_t page, bool by_cache = false);
  /// Drops one reference (`by_cache`: one the prefix cache took); throws Error for page 0
  /// or a page that is not held (by the cache, when by_cache).
  void release(int32_t page, bool by_cache = false);

 private:
  bool cache_only(int32_t page) const { return cache_refs_[page] > 0 && cache_refs_[page] == refcount_[page]; }

  std::vector<std::vector<int32_t>> free_;  // per owner: stack, lowest ids on top first
  int64_t free_total_ = 0;
  int64_t per_owner_ = 0;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> cache_refs_;  // the prefix cache's share of refcount_
  int64_t cache_only_ = 0;
};

/// Cached full prompt blocks (kHashBlockTokens tokens each), keyed by the chain of
/// leading hash ids, holding one reference on the block's pages in every group.
/// Entries form prefix-closed chains; eviction takes least recently used leaves
/// whose pages nobody else references. Lookups are exact: an entry stores its block id
/// and its parent entry, and a 64-bit key collision is a miss (pages of another
/// request's prompt are never handed out).
class PrefixCache {
 public:
  /// `page_size` must divide kHashBlockTokens.
  PrefixCache(std::vector<PagePool>* pools, int page_size);

  int pages_per_block() const { return pages_per_block_; }
  int64_t num_blocks() const { return static_cast<int64_t>(nodes_.size()); }

  /// Number of leading blocks of `hash_ids` in the cache (at most `max_blocks`). For each
  /// group, appends the matched pages to `pages[g]` and retains them for the caller.
  int match(const std::vector<int64_t>& hash_ids, int max_blocks,
            std::vector<std::vector<int32_t>>& pages, int64_t now);

  /// Caches block `block` of `hash_ids` (all earlier blocks must be cached; otherwise,
  /// or when it is already cached, does nothing and returns false). `pages[g]` is the
  /// owner's page list of group g; the block's pages are retained.
  bool insert(const std::vector<int64_t>& hash_ids, int block,
              const std::vector<std::vector<int32_t>>& pages, int64_t now);

  /// Evicts least recently used unreferenced leaves until group `group` has gained
  /// `wanted` free pages or nothing is evictable. Returns the pages freed in `group`.
  int64_t evict(int group, int64_t wanted);

  /// Adds one to refs[g][page] for every page reference the cache holds.
  void count_references(std::vector<std::vector<int64_t>>& refs) const;

  /// Map key of block `hash_id` after the entry keyed `parent` (0: the first block);
  /// never 0. Public so tests can build colliding chains.
  static uint64_t chain_key(uint64_t parent, int64_t hash_id);

 private:
  struct Node {
    uint64_t parent = 0;  // key of the parent entry; 0: none (first block)
    int64_t id = 0;       // the block's hash id
    int children = 0;
    int64_t last_used = 0;
    std::vector<std::vector<int32_t>> pages;  // [group][pages_per_block]
  };
  /// The key of the entry for block `hash_id` after `parent`, or 0 when absent (or
  /// only a colliding entry exists).
  uint64_t find(uint64_t parent, int64_t hash_id) const;
  bool evictable(const Node& n) const;
  void touch(uint64_t key, Node& n, int64_t now);

  // Leaves (children == 0) by (last_used, key): eviction walks them oldest first, so a
  // victim costs O(log n + leaves still in use), not a scan of every cached block.
  std::set<std::pair<int64_t, uint64_t>> leaves_;

  std::vector<PagePool>* pools_;
  int pages_per_block_;
  std::unordered_map<uint64_t, Node> nodes_;
};

}  // namespace pagedmha::tools
