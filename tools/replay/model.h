// Attention geometry of the model presets the replay serves.
#pragma once

#include <string>
#include <vector>

namespace pagedmha::tools {

/// One cache group: layers that share a page table ("full_attention" or
/// "sliding_attention", docs/semantics.md section 6).
struct CacheGroupSpec {
  std::string name;
  int window_left = -1;  // -1: full attention; pages behind the window are released
};

struct ModelSpec {
  std::string name;
  int num_layers = 0;
  int num_q_heads = 0;   // per tensor-parallel rank
  int num_kv_heads = 0;  // per tensor-parallel rank
  int head_dim = 0;
  bool sinks = false;                  // one learned sink logit per query head
  std::vector<CacheGroupSpec> groups;  // 1 or 2 groups
  std::vector<int> layer_group;        // [num_layers] index into groups

  int window_left(int layer) const { return groups[layer_group[layer]].window_left; }
  /// "32 layers, Hq 32, Hkv 8, D 128".
  std::string describe() const;
};

/// Options for a custom model or overrides of a preset (negative / empty: keep).
struct ModelOverrides {
  int layers = -1;
  int q_heads = -1;
  int kv_heads = -1;
  int head_dim = -1;
  int window = -2;  // window_left on every layer; -1 disables; -2 keep the preset's
  int sinks = -1;   // 0 or 1
  int tp = 1;       // tensor-parallel ranks: one rank's heads
};

/// Preset names: llama3-8b, llama3-70b, qwen2.5-7b, gpt-oss-20b, custom.
std::vector<std::string> model_preset_names();

/// Builds the geometry: the preset, then the overrides, then tensor parallelism
/// (Hq / tp query heads; Hkv / tp KV heads, or 1 replicated head when tp > Hkv).
/// "custom" needs layers, q_heads, kv_heads and head_dim. Throws Error on bad values.
ModelSpec make_model(const std::string& preset, const ModelOverrides& overrides);

}  // namespace pagedmha::tools
