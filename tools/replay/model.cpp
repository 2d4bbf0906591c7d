#include "replay/model.h"

#include <string>
#include <utility>

#include "pagedmha/error.h"
#include "replay/ranks.h"

namespace pagedmha::tools {
namespace {

void require(bool ok, const char* arg, const std::string& expected, int value) {
  if (!ok) throw_invalid_argument("replay", arg, expected, std::to_string(value));
}

}  // namespace

std::string ModelSpec::describe() const {
  std::string s = name + ": " + std::to_string(num_layers) + " layers, Hq " +
                  std::to_string(num_q_heads) + ", Hkv " + std::to_string(num_kv_heads) + ", D " +
                  std::to_string(head_dim);
  for (const CacheGroupSpec& g : groups)
    if (g.window_left >= 0) s += ", window_left " + std::to_string(g.window_left);
  if (sinks) s += ", sinks";
  return s;
}

std::vector<std::string> model_preset_names() {
  return {"llama3-8b", "llama3-70b", "qwen2.5-7b", "gpt-oss-20b", "custom"};
}

ModelSpec make_model(const std::string& preset, const ModelOverrides& o) {
  ModelSpec m;
  m.name = preset;
  int window = -1;
  bool alternate = false;  // gpt-oss: even layers sliding, odd layers full
  if (preset == "llama3-8b") {
    m.num_layers = 32, m.num_q_heads = 32, m.num_kv_heads = 8, m.head_dim = 128;
  } else if (preset == "llama3-70b") {
    m.num_layers = 80, m.num_q_heads = 64, m.num_kv_heads = 8, m.head_dim = 128;
  } else if (preset == "qwen2.5-7b") {
    m.num_layers = 28, m.num_q_heads = 28, m.num_kv_heads = 4, m.head_dim = 128;
  } else if (preset == "gpt-oss-20b") {
    m.num_layers = 24, m.num_q_heads = 64, m.num_kv_heads = 8, m.head_dim = 64;
    m.sinks = true, window = 127, alternate = true;  // HF sliding_window 128
  } else if (preset == "custom") {
    // Name the flags still missing (a preset would supply them; custom has none).
    std::string missing;
    const std::pair<int, const char*> need[] = {
        {o.layers, "--layers"}, {o.q_heads, "--q-heads"}, {o.kv_heads, "--kv-heads"}, {o.head_dim, "--head-dim"}};
    for (const auto& [value, flag] : need)
      if (value < 0) missing += std::string(missing.empty() ? "" : ", ") + flag;
    if (!missing.empty())
      throw_invalid_argument("replay", "--model custom", "--layers, --q-heads, --kv-heads and --head-dim all given",
                             "missing " + missing);
  } else {
    throw_invalid_argument("replay", "--model",
                           "llama3-8b, llama3-70b, qwen2.5-7b, gpt-oss-20b or custom", preset);
  }
  if (o.layers >= 0) m.num_layers = o.layers;
  if (o.q_heads >= 0) m.num_q_heads = o.q_heads;
  if (o.kv_heads >= 0) m.num_kv_heads = o.kv_heads;
  if (o.head_dim >= 0) m.head_dim = o.head_dim;
  if (o.sinks >= 0) m.sinks = o.sinks != 0;
  if (o.window != -2) window = o.window, alternate = false;
  require(m.num_layers >= 1, "--layers", ">= 1", m.num_layers);
  require(m.num_q_heads >= 1, "--q-heads", ">= 1", m.num_q_heads);
  require(m.num_kv_heads >= 1 && m.num_q_heads % m.num_kv_heads == 0, "--kv-heads",
          ">= 1 and dividing --q-heads (" + std::to_string(m.num_q_heads) + ")", m.num_kv_heads);
  require(m.head_dim == 64 || m.head_dim == 128 || m.head_dim == 256, "--head-dim",
          "64, 128 or 256", m.head_dim);
  require(window >= -1, "--window", "window_left >= 0, or -1 for none", window);
  // One rank's heads, by the rules of the multi-rank replay's shards (errors name --tp).
  const TpShard rank0 = tp_shard(m.num_q_heads, m.num_kv_heads, o.tp, 0);
  if (o.tp > 1) {
    m.num_q_heads = rank0.q_heads;
    m.num_kv_heads = rank0.kv_heads;
    m.name += "-tp" + std::to_string(o.tp);
  }
  m.groups = {{"full_attention", -1}};
  m.layer_group.assign(m.num_layers, 0);
  if (window >= 0) {
    if (alternate) {
      m.groups.push_back({"sliding_attention", window});
      for (int l = 0; l < m.num_layers; l += 2) m.layer_group[l] = 1;
    } else {
      m.groups = {{"sliding_attention", window}};
    }
  }
  return m;
}

}  // namespace pagedmha::tools
