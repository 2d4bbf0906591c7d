#include "replay/kv_pool.h"

#include <limits>
#include <string>

#include "pagedmha/error.h"
#include "replay/trace.h"

namespace pagedmha::tools {

PagePool::PagePool(int64_t num_pages, int owners) {
  if (owners < 1) throw Error("PagePool: owners: expected >= 1, got " + std::to_string(owners));
  // 64-bit: every owner's ids must fit int32 together.
  if (num_pages < 2 || 1 + (num_pages - 1) * owners > std::numeric_limits<int32_t>::max())
    throw_invalid_argument("replay", "--pages",
                           "2..2^31-1 pages per cache group (page 0 is reserved)" +
                               (owners > 1 ? " on each of " + std::to_string(owners) + " ranks, 2^31-1 in all"
                                           : std::string()),
                           std::to_string(num_pages));
  per_owner_ = num_pages - 1;
  const int64_t total = 1 + per_owner_ * owners;
  refcount_.assign(total, 0);
  cache_refs_.assign(total, 0);
  refcount_[0] = 1;  // the dummy page is permanently held
  free_.resize(owners);
  for (int o = 0; o < owners; ++o) {
    free_[o].reserve(per_owner_);
    for (int64_t p = per_owner_ * (o + 1); p > per_owner_ * o; --p) free_[o].push_back(static_cast<int32_t>(p));
  }
  free_total_ = total - 1;
}

int32_t PagePool::allocate(int owner) {
  std::vector<int32_t>& free = free_.at(owner);
  if (free.empty()) return 0;
  const int32_t page = free.back();
  free.pop_back();
  --free_total_;
  refcount_[page] = 1;
  return page;
}

void PagePool::retain(int32_t page, bool by_cache) {
  if (page <= 0 || page >= num_pages() || refcount_[page] <= 0)
    throw Error("PagePool::retain: page: expected a held page in [1, " +
                std::to_string(num_pages()) + "), got " + std::to_string(page));
  const bool was = cache_only(page);
  ++refcount_[page];
  if (by_cache) ++cache_refs_[page];
  cache_only_ += int64_t{cache_only(page)} - int64_t{was};
}

void PagePool::release(int32_t page, bool by_cache) {
  if (page <= 0 || page >= num_pages() || refcount_[page] <= 0 || (by_cache && cache_refs_[page] <= 0))
    throw Error("PagePool::release: page: expected a page held" + std::string(by_cache ? " by the cache" : "") +
                " in [1, " + std::to_string(num_pages()) + "), got " + std::to_string(page));
  const bool was = cache_only(page);
  if (by_cache) --cache_refs_[page];
  if (--refcount_[page] == 0) {
    free_[owner_of(page)].push_back(page);
    ++free_total_;
  }
  cache_only_ += int64_t{cache_only(page)} - int64_t{was};
}

PrefixCache::PrefixCache(std::vector<PagePool>* pools, int page_size)
    : pools_(pools), pages_per_block_(page_size > 0 ? kHashBlockTokens / page_size : 0) {
  if (page_size <= 0 || kHashBlockTokens % page_size != 0)
    throw_invalid_argument("replay", "--page-size", "a divisor of 512 for the prefix cache",
                           std::to_string(page_size));
}

uint64_t PrefixCache::chain_key(uint64_t parent, int64_t hash_id) {
  // splitmix64 of the pair; 0 is reserved for "no parent".
  uint64_t x = parent * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(hash_id);
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x == 0 ? 1 : x;
}

uint64_t PrefixCache::find(uint64_t parent, int64_t hash_id) const {
  const uint64_t key = chain_key(parent, hash_id);
  const auto it = nodes_.find(key);
  // The key is only a hash: the entry must be this very block after this very parent.
  return it != nodes_.end() && it->second.parent == parent && it->second.id == hash_id ? key : 0;
}

int PrefixCache::match(const std::vector<int64_t>& hash_ids, int max_blocks,
                       std::vector<std::vector<int32_t>>& pages, int64_t now) {
  uint64_t key = 0;
  int blocks = 0;
  for (; blocks < max_blocks && blocks < static_cast<int>(hash_ids.size()); ++blocks) {
    key = find(key, hash_ids[blocks]);
    if (key == 0) break;
    Node& n = nodes_.at(key);
    touch(key, n, now);
    for (size_t g = 0; g < pools_->size(); ++g)
      for (int32_t page : n.pages[g]) {
        (*pools_)[g].retain(page);
        pages[g].push_back(page);
      }
  }
  return blocks;
}

bool PrefixCache::insert(const std::vector<int64_t>& hash_ids, int block,
                         const std::vector<std::vector<int32_t>>& pages, int64_t now) {
  uint64_t parent = 0;
  for (int b = 0; b < block; ++b)
    if ((parent = find(parent, hash_ids[b])) == 0) return false;  // an earlier block is not cached
  const uint64_t key = chain_key(parent, hash_ids[block]);
  // Cached already, or the key is taken by another chain (a collision): not cached.
  if (nodes_.count(key)) return false;
  Node n;
  n.parent = parent;
  n.id = hash_ids[block];
  n.last_used = now;
  n.pages.resize(pools_->size());
  for (size_t g = 0; g < pools_->size(); ++g) {
    for (int i = 0; i < pages_per_block_; ++i) {
      const int32_t page = pages[g].at(static_cast<size_t>(block) * pages_per_block_ + i);
      (*pools_)[g].retain(page, /*by_cache=*/true);  // throws for a released (0) page
      n.pages[g].push_back(page);
    }
  }
  if (block > 0 && nodes_.at(parent).children++ == 0) leaves_.erase({nodes_.at(parent).last_used, parent});
  nodes_.emplace(key, std::move(n));
  leaves_.insert({now, key});
  return true;
}

void PrefixCache::touch(uint64_t key, Node& n, int64_t now) {
  if (n.children == 0) {
    leaves_.erase({n.last_used, key});
    leaves_.insert({now, key});
  }
  n.last_used = now;
}

bool PrefixCache::evictable(const Node& n) const {
  if (n.children > 0) return false;
  for (size_t g = 0; g < pools_->size(); ++g)
    for (int32_t page : n.pages[g])
      if ((*pools_)[g].refcount(page) != 1) return false;
  return true;
}

int64_t PrefixCache::evict(int group, int64_t wanted) {
  int64_t freed = 0;
  while (freed < wanted) {
    // The least recently used leaf whose pages only the cache holds (ties: smallest key).
    auto leaf = leaves_.begin();
    while (leaf != leaves_.end() && !evictable(nodes_.at(leaf->second))) ++leaf;
    if (leaf == leaves_.end()) break;
    const auto victim = nodes_.find(leaf->second);
    leaves_.erase(leaf);
    for (size_t g = 0; g < pools_->size(); ++g)
      for (int32_t page : victim->second.pages[g]) (*pools_)[g].release(page, /*by_cache=*/true);
    freed += static_cast<int64_t>(victim->second.pages[group].size());
    if (victim->second.parent != 0) {
      Node& parent = nodes_.at(victim->second.parent);
      if (--parent.children == 0) leaves_.insert({parent.last_used, victim->second.parent});
    }
    nodes_.erase(victim);
  }
  return freed;
}

void PrefixCache::count_references(std::vector<std::vector<int64_t>>& refs) const {
  for (const auto& [key, n] : nodes_)
    for (size_t g = 0; g < n.pages.size(); ++g)
      for (int32_t page : n.pages[g]) ++refs[g][page];
}

}  // namespace pagedmha::tools
