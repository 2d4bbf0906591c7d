// The small CPU replay the tools tests start from: a custom llama-like geometry (2 layers,
// Hq 8, Hkv 2, D 64), 4 built-in requests, every step checked.
#pragma once

#include "replay/replay.h"

namespace testutil {

inline pagedmha::tools::ReplayOptions small_cpu_replay() {
  pagedmha::tools::ReplayOptions o;
  o.device = "cpu";
  o.requests = 4;
  o.model = "custom";
  o.overrides.layers = 2, o.overrides.q_heads = 8, o.overrides.kv_heads = 2, o.overrides.head_dim = 64;
  o.pages = 512;
  o.token_budget = 1024;
  o.max_running = 4;
  o.check_every = 1;
  o.check_rows = 3;
  o.progress = false;
  return o;
}

}  // namespace testutil
