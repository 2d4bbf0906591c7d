// MhaBackend's forward calls (docs/semantics.md sections 3 and 5): the metadata slot and
// write slots of a layer's step, its arguments checked before anything is written, then
// append_kv and the one attention op the step's mode takes (ops.h).
#include <cmath>
#include <string>

#include "backend/buffers.h"
#include "core/checks.h"
#include "core/side_stream.h"
#include "core/validate.h"
#include "pagedmha/backend.h"
#include "pagedmha/error.h"

namespace pagedmha {

using namespace backend_detail;

namespace {
// What a forward call without metadata passes on (an lvalue, so that a slot is passed by
// reference, not copied with its group vector, on every layer's call).
const AttentionMetadata kNoMetadata{};
}  // namespace

const AttentionMetadata* MhaBackend::select_slot(ForwardMode mode) const {
  if (is_extend_or_mixed(mode)) return prefill_slot_;
  if (block_draft()) return decode_slot_;
  if (config_.spec_num_tokens > 1 && !config_.is_draft) return prefill_slot_;
  return decode_slot_;
}

TensorView MhaBackend::select_loc(const LayerSpec& layer, const AttentionMetadata* md,
                                  const TensorView& out_cache_loc) const {
  if (md == nullptr) return out_cache_loc;
  if (md->groups.empty()) {
    check_no_group(layer);
    return out_cache_loc;
  }
  if (config_.is_draft && out_cache_loc.defined()) return out_cache_loc;  // draft chains own their slots
  const GroupMetadata& g = layer_group(layer, *md);
  if (config_.is_draft && !md->ragged && md->max_seq_len_q == 1 && g.out_cache_loc.defined()) {
    // A drafter's seq_lens advance in place between its steps (the decode slot aliases
    // them): its group slots (pos = seq_len - 1) are computed from them now, not kept
    // from init_forward_metadata, which would write every step's K/V to the first one's.
    with_user_args("decode_write_slots",
                   {{"page_table", "batch.group_tables['" + g.group_id + "']"}, {"seq_lens", "batch.seq_lens"}},
                   [&] { decode_write_slots(g.page_table, md->cache_seqlens, config_.page_size, 1, g.out_cache_loc,
                                            config_.stream); });
  }
  return g.out_cache_loc.defined() ? g.out_cache_loc : out_cache_loc;
}

TensorView MhaBackend::select_out_cache_loc(const LayerSpec& layer, ForwardMode mode,
                                            const TensorView& out_cache_loc) const try {
  const CallScope call("MhaBackend.select_out_cache_loc");
  const AttentionMetadata* md = select_slot(mode);
  if (md == nullptr && step_bs_ != 0) {  // an idle step writes nothing: the caller's slots
    if (prefill_slot_ != nullptr || decode_slot_ != nullptr) {
      fail("forward_mode", std::string("the mode of this step's metadata (") +
                               (prefill_slot_ != nullptr ? "extend, mixed or verify" : "decode") + ")",
           forward_mode_name(mode));
    }
    if (!layer.group_id.empty()) {
      fail("metadata", "init_forward_metadata for this step first (layer.group_id '" + layer.group_id +
                           "' writes through its group's slots)", "no metadata");
    }
  }
  return select_loc(layer, md, out_cache_loc);
} catch (const Error& e) {
  rethrow_in_call(e, "MhaBackend.select_out_cache_loc");
}

TensorView MhaBackend::forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const LayerSpec& layer, const KvCacheView& kv,
                                      const TensorView& out_cache_loc, int bs, const TensorView& out,
                                      bool save_kv_cache) try {
  const CallScope call("MhaBackend.forward_extend");
  check_step_bs(bs);
  if (prefill_slot_ == nullptr && decode_slot_ != nullptr) {
    fail("metadata", "an extend step's (init_forward_metadata with an extend batch)",
         "a decode step's metadata (call forward_decode, or init_forward_metadata for this extend step)");
  }
  return run_attention(q, k, v, layer, kv, out_cache_loc, prefill_slot_ ? *prefill_slot_ : kNoMetadata,
                       out, save_kv_cache, prefill_slot_ != nullptr);
} catch (const Error& e) {
  rethrow_in_call(e, "MhaBackend.forward_extend");
}

TensorView MhaBackend::forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const LayerSpec& layer, const KvCacheView& kv,
                                      const TensorView& out_cache_loc, int bs, const TensorView& out,
                                      bool save_kv_cache) try {
  const CallScope call("MhaBackend.forward_decode");
  check_step_bs(bs);
  const AttentionMetadata* md = nullptr;
  if (block_draft()) {
    md = decode_slot_;  // bs * N rows of one query each; q rows / bs would read N
  } else {
    const int64_t q_len = bs > 0 && q.defined() ? q.size(0) / bs : 1;
    md = q_len > 1 ? prefill_slot_ : decode_slot_;
    // The rows of q chose a slot this step has no metadata for: the rows are what is
    // wrong (or the step's metadata), not a missing init_forward_metadata.
    const AttentionMetadata* other = q_len > 1 ? decode_slot_ : prefill_slot_;
    if (md == nullptr && other != nullptr) {
      fail("q", std::to_string(other->num_tokens) + " rows (this step's " +
                    (other->ragged ? "extend tokens" : "query rows") + ")",
           std::to_string(q.size(0)) + " rows for bs " + std::to_string(bs));
    }
  }
  return run_attention(q, k, v, layer, kv, out_cache_loc, md ? *md : kNoMetadata, out, save_kv_cache,
                       md != nullptr);
} catch (const Error& e) {
  rethrow_in_call(e, "MhaBackend.forward_decode");
}

TensorView MhaBackend::run_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const LayerSpec& layer, const KvCacheView& kv,
                                     const TensorView& out_cache_loc, const AttentionMetadata& md,
                                     const TensorView& out, bool save_kv_cache, bool has_metadata) {
  if (!has_metadata) {
    fail("metadata", "init_forward_metadata (or a graph replay) for this step's slot first", "no metadata");
  }
  if (md.groups.empty()) check_no_group(layer);
  const int Hq = layer.num_q_heads, Hkv = layer.num_kv_heads, D = layer.head_dim;
  check_geometry(Hq, Hkv, D, "layer.");
  // Checked before any K/V write; 0, the LayerSpec default, means the usual D^-0.5.
  if (!std::isfinite(layer.scaling)) fail("layer.scaling", "a finite sm_scale (0: head_dim^-0.5)", std::to_string(layer.scaling));
  const float scaling = layer.scaling != 0.0f ? layer.scaling : 1.0f / std::sqrt(static_cast<float>(D));
  const TensorView q3 = rows3(q, Hq, D, "q");
  const TensorView out3 = rows3(out, Hq, D, "out");
  const int64_t T = q3.size(0);
  if (T != md.num_tokens) {
    fail("q", str(md.num_tokens) + " rows (this step's " + std::string(md.ragged ? "extend tokens" : "query rows") +
         ")", q.shape_str());
  }
  if (out3.size(0) != T) fail("out", str(T) + " rows", out.shape_str());
  const TensorView out2 = out3.stride(1) == D
                              ? TensorView(out.data, out.dtype, out.device, {T, int64_t{Hq} * D}, {out3.stride(0), 1})
                              : out;
  const Stream s = config_.stream;
  const bool fp8 = config_.kv_cache_dtype == DType::fp8_e4m3;
  // The scales follow the configured cache dtype: a cache of another dtype would be read
  // with the wrong ones (an fp8 config over a 16-bit cache scales its output by v_scale).
  for (const auto& [c, name] : {std::pair{&kv.k_cache, "k_cache"}, std::pair{&kv.v_cache, "v_cache"}}) {
    if (c->defined() && c->dtype != config_.kv_cache_dtype) {
      fail(name, std::string(dtype_name(config_.kv_cache_dtype)) + " (config.kv_cache_dtype)",
           std::string(dtype_name(c->dtype)) + " " + c->shape_str());
    }
  }
  const float k_scale = fp8 ? layer.k_scale : 1.0f;
  const float v_scale = fp8 ? layer.v_scale : 1.0f;
  // The layer's attention fields, named as the engine set them (the ops would name their
  // own parameters), before anything is written.
  if (layer.window_left < -1) fail("layer.window_left", ">= -1 (-1: no window)", str(layer.window_left));
  if (!std::isfinite(layer.logits_soft_cap) || layer.logits_soft_cap < 0.0f) {
    fail("layer.logits_soft_cap", "a finite value >= 0 (0: off)", std::to_string(layer.logits_soft_cap));
  }
  // Checked for every cache dtype: a 16-bit cache ignores the scales, but 0, a negative
  // or a non-finite scale is a mistake wherever it is set (docs/semantics.md section 8.5).
  for (const auto& [x, name] : {std::pair{layer.k_scale, "layer.k_scale"}, std::pair{layer.v_scale, "layer.v_scale"}}) {
    if (!std::isfinite(x) || x <= 0.0f) fail(name, "a finite value > 0", float_str(x));
  }
  if (layer.sinks.defined()) {
    const TensorView& sk = layer.sinks;
    if (sk.dtype != DType::fp32 || sk.ndim != 1 || sk.size(0) != Hq || sk.device != config_.device) {
      fail("layer.sinks", "fp32 [" + str(Hq) + "] (one per query head) on " + config_.device.str(),
           std::string(dtype_name(sk.dtype)) + " " + sk.shape_str() + " on " + sk.device.str());
    }
    if (sk.device.is_cpu()) {
      for (int64_t h = 0; h < Hq; ++h) {
        const float x = static_cast<const float*>(sk.data)[h * sk.stride(0)];
        if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) {
          fail("layer.sinks", "finite values or -inf", std::to_string(x) + " at index " + str(h));
        }
      }
    }
  }

  TensorView loc, k3, v3;
  const bool save = save_kv_cache && k.defined();
  if (save) {
    loc = select_loc(layer, &md, out_cache_loc);
    if (!loc.defined()) fail("out_cache_loc", "int32 write slots when saving K/V", "undefined");
    k3 = rows3(k, Hkv, D, "k");
    v3 = rows3(v, Hkv, D, "v");
    // Exactly the step's T tokens: a short k or slot list would silently drop KV entries.
    if (k3.size(0) != T) fail("k", str(T) + " rows (the step's tokens)", k.shape_str());
    if (v3.size(0) != T) fail("v", str(T) + " rows (the step's tokens)", v.shape_str());
    if (loc.ndim != 1 || loc.size(0) < T) {
      fail("out_cache_loc", "int32 [>= " + str(T) + "] write slots (the step's tokens)", loc.shape_str());
    }
  }

  const TensorView table = T == 0 ? TensorView{}
                                  : (md.groups.empty() ? md.page_table : layer_group(layer, md).page_table);
  AttentionParams params;
  params.bmm1_scale = scaling * k_scale;
  // With an fp8 cache the scale is a product of two finite factors, which may still round
  // to 0 (a uniform softmax) or overflow.
  if (fp8 && (params.bmm1_scale == 0.0f || !std::isfinite(params.bmm1_scale))) {
    fail("layer.scaling", "a value whose product with layer.k_scale float32 holds (neither 0 nor inf)",
         float_str(scaling) + " * " + float_str(k_scale) + " = " + float_str(params.bmm1_scale));
  }
  params.bmm2_scale = v_scale;  // upstream leaves this at 1: v_scale never reaches the reads
  params.window_left = layer.window_left;
  params.logits_soft_cap = layer.logits_soft_cap;
  params.sinks = layer.sinks;
  params.sm_margin = config_.sm_margin;
  const Device dev = config_.device;
  const TensorView workspace = workspace_.bytes() > 0 ? workspace_.bytes_view() : TensorView{};
  const TensorView plan_ws = prefill_workspace_.bytes() > 0 ? prefill_workspace_.bytes_view() : TensorView{};

  // The step's attention as at most two op calls: a prefill over the leading extend rows
  // and a decode over the trailing one-query rows (all of them for decode steps).
  struct Plan {
    int64_t t_pre = 0, n_pre = 0, n_dec = 0;  // prefill tokens / rows, decode rows
    int dec_q_len = 1;
  } plan;
  if (T > 0) {
    if (md.ragged) {
      // Trailing 1-query rows go to batch_decode when its workspace fits (it always does
      // once the geometry is registered); the prefill tiles then cover only the extend rows.
      const int64_t n_dec = md.decode_rows;
      const bool split = n_dec > 0 && decode_workspace_size(dev, n_dec, 1, Hq, Hkv, D) <= workspace_.bytes();
      plan.n_dec = split ? n_dec : 0;
      plan.n_pre = md.batch - plan.n_dec;
      plan.t_pre = T - plan.n_dec;
    } else {
      const std::size_t need = decode_workspace_size(dev, md.batch, md.max_seq_len_q, Hq, Hkv, D);
      if (need > workspace_.bytes()) {  // never allocated here: this may run under graph capture
        const std::string geometry = "Hq " + str(Hq) + ", Hkv " + str(Hkv) + ", D " + str(D);
        if (config_.workspace_bytes > 0) {
          fail("config.workspace_bytes", ">= " + std::to_string(need) + " for this layer's decode (" + geometry + ")",
               std::to_string(config_.workspace_bytes));
        }
        fail("layer", "a geometry the decode workspace was sized for (config.num_q_heads / num_kv_heads / "
             "head_dim, or register_layers before the first step)", geometry);
      }
      plan.n_dec = md.batch;
      plan.dec_q_len = md.max_seq_len_q;
    }
  }
  const int64_t r_dec = plan.t_pre;  // first q row of the decode call
  auto prefill_rows = [&](auto&& f) {
    f(q3.slice(0, 0, plan.t_pre), table.slice(0, 0, plan.n_pre), md.cache_seqlens.slice(0, 0, plan.n_pre),
      md.cu_seqlens_q.slice(0, 0, plan.n_pre + 1), plan.n_dec > 0 ? md.prefill_max_seq_len_q : md.max_seq_len_q,
      out3.slice(0, 0, plan.t_pre));
  };
  auto decode_rows = [&](auto&& f) {
    if (!md.ragged) return f(q3, table, md.cache_seqlens, out3);
    f(q3.slice(0, r_dec, T - r_dec), table.slice(0, plan.n_pre, plan.n_dec),
      md.cache_seqlens.slice(0, plan.n_pre, plan.n_dec), out3.slice(0, r_dec, T - r_dec));
  };

  // Everything is checked before anything is written: a rejected call leaves the cache,
  // the outputs and this backend as they were. The ops' metadata are the step's: their
  // errors name the batch fields they came from (the cache is only known here).
  const std::string table_arg = T == 0 || md.groups.empty()
                                    ? "batch.req_to_page (this step's page-table rows)"
                                    : "batch.group_tables['" + layer_group(layer, md).group_id + "']";
  auto as_user_args = [&](const char* op, auto&& check, RowOrigin origin = {}) {
    with_user_args(op,
                   {{"q", "q"}, {"out", "out"}, {"k_cache", "k_cache"}, {"v_cache", "v_cache"},
                    {"page_table", table_arg}, {"seq_lens", "batch.seq_lens"},
                    {"cu_seqlens_q", "batch.extend_seq_lens_cpu"}, {"sinks", "layer.sinks"}},
                   check, origin);
  };
  // The caches append_kv writes are read by the attention after it, as are its inputs:
  // a cache laid over the step's q, lengths, tables or sinks would change them in between.
  if (save) {
    const detail::ArgCheck chk(CallScope::name());
    for (const auto& [c, name] : {detail::Named{&kv.k_cache, "k_cache"}, detail::Named{&kv.v_cache, "v_cache"}}) {
      chk.disjoint_from_inputs(*c, name,
                               {{&q3, "q"}, {&table, table_arg.c_str()}, {&md.cache_seqlens, "batch.seq_lens"},
                                {&md.cu_seqlens_q, "batch.extend_seq_lens_cpu"}, {&params.sinks, "layer.sinks"}});
    }
  }
  // With debug validation the value checks run here too, on the keys as they will be after
  // this step's write (append_kv's rows for the slots it fills).
  const detail::PendingWrite written =
      save ? detail::PendingWrite{loc.slice(0, 0, T), k3, v3} : detail::PendingWrite{};
  if (plan.t_pre > 0) {
    prefill_rows([&](const TensorView& qr, const TensorView& tr, const TensorView& sl, const TensorView& cu, int mq,
                     const TensorView& orr) {
      as_user_args("batch_prefill", [&] {
        detail::check_batch_prefill("batch_prefill", qr, kv.k_cache, kv.v_cache, tr, sl, cu, config_.page_size, mq,
                                    orr, params, {}, plan_ws, written, s);
      });
    });
  }
  if (plan.n_dec > 0) {
    decode_rows([&](const TensorView& qr, const TensorView& tr, const TensorView& sl, const TensorView& orr) {
      // A mixed step's decode rows are checked as their own batch: errors say where it
      // starts (the step's new tokens, which the pending write holds whole, keep theirs).
      as_user_args(
          "batch_decode",
          [&] {
            detail::check_batch_decode("batch_decode", qr, kv.k_cache, kv.v_cache, tr, sl, config_.page_size,
                                       plan.dec_q_len, orr, params, {}, workspace, written, s);
          },
          md.ragged ? RowOrigin{plan.n_pre, r_dec} : RowOrigin{});
    });
  }
  if (save) {
    with_user_args("append_kv",
                   {{"k", "k"}, {"v", "v"}, {"k_cache", "k_cache"}, {"v_cache", "v_cache"},
                    {"out_cache_loc", "out_cache_loc"}, {"k_scale", "layer.k_scale"}, {"v_scale", "layer.v_scale"}},
                   [&] {
                     append_kv(k3, v3, kv.k_cache, kv.v_cache, loc.slice(0, 0, T), config_.page_size, k_scale,
                               v_scale, s);
                   });
  }
  if (T == 0) return out2;

  auto run_prefill = [&](Stream stream) {
    prefill_rows([&](const TensorView& qr, const TensorView& tr, const TensorView& sl, const TensorView& cu, int mq,
                     const TensorView& orr) {
      batch_prefill(qr, kv.k_cache, kv.v_cache, tr, sl, cu, config_.page_size, mq, orr, params, {}, plan_ws, stream);
    });
  };
  auto run_decode = [&](Stream stream) {
    decode_rows([&](const TensorView& qr, const TensorView& tr, const TensorView& sl, const TensorView& orr) {
      batch_decode(qr, kv.k_cache, kv.v_cache, tr, sl, config_.page_size, plan.dec_q_len, orr, params, {}, workspace,
                   stream);
    });
  };
  if (plan.n_dec == 0) {
    run_prefill(s);
    return out2;
  }
  if (plan.t_pre == 0) {
    run_decode(s);
    return out2;
  }
  // On CUDA the two kernels share the GPU: the compute-bound prefill tiles go first, the
  // memory-bound decode rows follow on a higher-priority side stream and take SMs as
  // prefill tiles retire (they read the same cache and write disjoint output rows).
  // A throw between fork and join still joins (an unjoined fork would break a capture).
  struct JoinOnThrow {
    detail::SideStream* side;
    Stream main;
    ~JoinOnThrow() {
      if (!side) return;
      try {
        side->join(main);
      } catch (...) {  // already unwinding from the first error
      }
    }
  } guard{side_.get(), s};
  const Stream aux = side_->fork(s);
  run_prefill(s);
  run_decode(aux);
  guard.side = nullptr;
  side_->join(s);
  return out2;
}

}  // namespace pagedmha
