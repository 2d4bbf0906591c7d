// Bindings of include/pagedmha/{backend,registry}.h. The backend keeps TensorViews across
// calls (the decode slot aliases the caller's seq_lens; graph state keeps seq_lens_buf), so
// the Python object holds the arrays behind every view it may still read.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "array.h"
#include "pagedmha/error.h"
#include "pagedmha/registry.h"

namespace pagedmha::python {

namespace {

using ArrayMap = std::map<std::string, ArrayArg>;

/// ForwardBatch with the arrays it was built from (they outlive the views).
struct PyForwardBatch {
  ForwardMode forward_mode = ForwardMode::decode;
  int batch_size = 0;
  ArrayArg req_pool_indices, seq_lens, seq_lens_cpu, extend_seq_lens_cpu, extend_prefix_lens_cpu,
      out_cache_loc, req_to_page;
  ArrayMap group_tables;

  ForwardBatch view(const char* op) const {
    ForwardBatch b;
    b.forward_mode = forward_mode;
    b.batch_size = batch_size;
    b.req_pool_indices = to_view(req_pool_indices, op, "req_pool_indices", Access::read);
    b.seq_lens = to_view(seq_lens, op, "seq_lens", Access::read);
    b.seq_lens_cpu = to_view(seq_lens_cpu, op, "seq_lens_cpu", Access::read);
    b.extend_seq_lens_cpu = to_view(extend_seq_lens_cpu, op, "extend_seq_lens_cpu", Access::read);
    b.extend_prefix_lens_cpu = to_view(extend_prefix_lens_cpu, op, "extend_prefix_lens_cpu", Access::read);
    b.out_cache_loc = to_view(out_cache_loc, op, "out_cache_loc", Access::read);
    b.req_to_page = to_view(req_to_page, op, "req_to_page", Access::read);
    for (const auto& [id, table] : group_tables) {
      b.group_tables.push_back({id, to_view(table, op, "group_tables", Access::read)});
    }
    return b;
  }
};

/// LayerSpec with its sinks array.
struct PyLayerSpec {
  LayerSpec spec;
  ArrayArg sinks;

  LayerSpec view(const char* op) const {
    LayerSpec s = spec;
    s.sinks = to_view(sinks, op, "layer.sinks", Access::read);
    return s;
  }
};

/// A view of backend memory handed to Python (keeps `owner` alive): a NumPy array for CPU
/// memory, a DLPack capsule for CUDA memory (the Python layer makes it a torch tensor);
/// None when the backend returned the caller's own array `same` (the Python layer hands
/// that back).
nb::object export_view(const TensorView& t, const ArrayArg& same, nb::handle owner) {
  if (!t.defined() || (same.array.is_valid() && t.data == same.array.data())) return nb::none();
  static_assert(sizeof(size_t) == sizeof(int64_t));
  size_t shape[TensorView::kMaxDims];
  for (int d = 0; d < t.ndim; ++d) shape[d] = static_cast<size_t>(t.shape[d]);
  // Only int32 views (write slots) come back today; the dtype follows the view regardless.
  nb::dlpack::dtype dt{};
  switch (t.dtype) {
    case DType::int32: dt = nb::dtype<int32_t>(); break;
    case DType::int64: dt = nb::dtype<int64_t>(); break;
    case DType::fp32: dt = nb::dtype<float>(); break;
    default: dt = nb::dtype<uint8_t>(); dt.bits = static_cast<uint8_t>(8 * dtype_size(t.dtype));
  }
  if (t.device.is_cpu()) {
    nb::ndarray<nb::numpy> a(t.data, static_cast<size_t>(t.ndim), shape, owner, t.strides, dt,
                             nb::device::cpu::value, 0);
    return nb::cast(a, nb::rv_policy::reference);
  }
  nb::ndarray<> a(t.data, static_cast<size_t>(t.ndim), shape, owner, t.strides, dt, nb::device::cuda::value,
                  t.device.index);
  return nb::cast(a, nb::rv_policy::reference);
}

/// The Python MhaBackend: the C++ backend plus the arrays its views borrow.
class PyBackend {
 public:
  explicit PyBackend(std::unique_ptr<MhaBackend> impl) : impl_(std::move(impl)) {}

  /// The backend; an error (not a null dereference) once _adopt has moved it out.
  MhaBackend& get() {
    if (!impl_) throw Error("MhaBackend: expected a backend, got one moved into another object by _adopt");
    return *impl_;
  }

  void set_stream(std::optional<std::uintptr_t> stream) {
    if (stream) get().set_stream(Stream{reinterpret_cast<void*>(*stream)});
  }

  void init_forward_metadata(const PyForwardBatch& batch, std::optional<std::uintptr_t> stream) {
    set_stream(stream);
    const ForwardBatch b = batch.view("MhaBackend.init_forward_metadata");
    get().init_forward_metadata(b);
    step_batch_ = batch;  // the decode slot may alias batch.seq_lens until the next step
  }

  // forward_extend (Extend) and forward_decode share one signature and conversion.
  template <bool Extend>
  void forward(const ArrayArg& q, const ArrayArg& k, const ArrayArg& v, const PyLayerSpec& layer,
               const ArrayArg& k_cache, const ArrayArg& v_cache, const ArrayArg& out_cache_loc,
               int bs, const ArrayArg& out_arg, bool save_kv_cache,
               std::optional<std::uintptr_t> stream) {
    const char* op = Extend ? "MhaBackend.forward_extend" : "MhaBackend.forward_decode";
    set_stream(stream);
    // Only out and the caches are written: read-only arrays are fine for the rest.
    const TensorView q_ = to_view(q, op, "q", Access::read), k_ = to_view(k, op, "k", Access::read),
                     v_ = to_view(v, op, "v", Access::read),
                     loc = to_view(out_cache_loc, op, "out_cache_loc", Access::read),
                     o = to_view(out_arg, op, "out", Access::write);
    const KvCacheView kv{to_view(k_cache, op, "k_cache", Access::write),
                         to_view(v_cache, op, "v_cache", Access::write)};
    const LayerSpec spec = layer.view(op);
    // The result is `out` viewed as [T, Hq * D]; the Python layer returns that view.
    nb::gil_scoped_release release;
    if constexpr (Extend) {
      get().forward_extend(q_, k_, v_, spec, kv, loc, bs, o, save_kv_cache);
    } else {
      get().forward_decode(q_, k_, v_, spec, kv, loc, bs, o, save_kv_cache);
    }
  }

  nb::object select_out_cache_loc(nb::handle self, const PyLayerSpec& layer, ForwardMode mode,
                                  const ArrayArg& loc, std::optional<std::uintptr_t> stream) {
    set_stream(stream);  // a drafter's group slots are computed on it
    const TensorView t = get().select_out_cache_loc(
        layer.view("MhaBackend.select_out_cache_loc"), mode,
        to_view(loc, "MhaBackend.select_out_cache_loc", "out_cache_loc", Access::read));
    return export_view(t, loc, self);
  }

  void register_layers(const std::vector<PyLayerSpec>& layers) {
    std::vector<LayerSpec> specs;
    for (const PyLayerSpec& l : layers) specs.push_back(l.view("MhaBackend.register_layers"));
    get().register_layers(specs);
  }

  void init_cuda_graph_state(int max_bs, const ArrayArg& seq_lens_buf,
                             const std::vector<std::string>& cache_group_ids,
                             std::optional<std::uintptr_t> stream) {
    set_stream(stream);
    get().init_cuda_graph_state(
        max_bs, to_view(seq_lens_buf, "MhaBackend.init_cuda_graph_state", "seq_lens_buf", Access::read),
        cache_group_ids);
    seq_lens_buf_ = seq_lens_buf;  // aliased by every captured decode slot
  }

  void capture(int bs, ForwardMode mode, const std::vector<std::string>& cache_group_ids,
               std::optional<std::uintptr_t> stream) {
    set_stream(stream);
    get().init_forward_metadata_capture_cuda_graph(bs, mode, cache_group_ids);
  }

  void replay(const PyForwardBatch& batch, std::optional<std::uintptr_t> stream) {
    set_stream(stream);
    get().init_forward_metadata_replay_cuda_graph(
        batch.view("MhaBackend.init_forward_metadata_replay_cuda_graph"));
    step_batch_ = batch;
  }

  void fill_block_decode_seq_lens(int bs, const ArrayArg& block_ends,
                                  std::optional<std::uintptr_t> stream) {
    set_stream(stream);
    get().fill_block_decode_seq_lens(bs,
                                      to_view(block_ends, "MhaBackend.fill_block_decode_seq_lens",
                                              "block_ends", Access::read));
  }

 private:
  std::unique_ptr<MhaBackend> impl_;
  PyForwardBatch step_batch_;
  ArrayArg seq_lens_buf_;
};

BackendConfig make_config(const char* call, int page_size, int context_len, DType kv_cache_dtype, DType out_dtype,
                          int max_bs, nb::handle device, int spec_num_tokens, bool is_draft,
                          bool draft_block_decode, std::size_t workspace_bytes, int num_q_heads,
                          int num_kv_heads, int head_dim,
                          std::vector<std::string> state_cache_groups,
                          std::optional<std::uintptr_t> stream, int sm_margin) {
  BackendConfig c;
  c.page_size = page_size;
  c.context_len = context_len;
  c.kv_cache_dtype = kv_cache_dtype;
  c.out_dtype = out_dtype;
  c.max_bs = max_bs;
  c.device = parse_device(device, call, "device");
  c.spec_num_tokens = spec_num_tokens;
  c.is_draft = is_draft;
  c.draft_block_decode = draft_block_decode;
  c.workspace_bytes = workspace_bytes;
  c.num_q_heads = num_q_heads;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.state_cache_groups = std::move(state_cache_groups);
  c.stream = Stream{reinterpret_cast<void*>(stream.value_or(0))};
  c.sm_margin = sm_margin;
  return c;
}

// The binding signature of every config-taking entry point (`call`, the name the user
// calls): leading arguments, then the config fields of PAGEDMHA_CONFIG_ARGS;
// f(lead..., config) does the rest. Config errors name the keyword the user passed
// ("create_backend: head_dim: ..."), not the C++ field ("config.head_dim").
template <class... Lead, class F>
auto with_config(const char* call, F f) {
  return [call, f](Lead... lead, int page_size, int context_len, DType kv_cache_dtype, DType out_dtype,
                   int max_bs, nb::handle device, int spec_num_tokens, bool is_draft,
                   bool draft_block_decode, std::size_t workspace_bytes, int num_q_heads,
                   int num_kv_heads, int head_dim, std::vector<std::string> state_cache_groups,
                   std::optional<std::uintptr_t> stream, int sm_margin) {
    try {
      return f(lead..., make_config(call, page_size, context_len, kv_cache_dtype, out_dtype, max_bs,
                                    device, spec_num_tokens, is_draft, draft_block_decode,
                                    workspace_bytes, num_q_heads, num_kv_heads, head_dim,
                                    std::move(state_cache_groups), stream, sm_margin));
    } catch (const Error& e) {
      std::string m = e.what();
      const std::string field = std::string(call) + ": config.";
      if (m.compare(0, field.size(), field) == 0) m.erase(field.size() - 7, 7);
      throw Error(m);
    }
  };
}

#define PAGEDMHA_CONFIG_ARGS                                                                    \
  nb::arg("page_size"), nb::arg("context_len"), nb::arg("kv_cache_dtype") = DType::bf16,        \
      nb::arg("out_dtype") = DType::bf16, nb::arg("max_bs") = 1, nb::arg("device") = "cpu",     \
      nb::arg("spec_num_tokens") = 1, nb::arg("is_draft") = false,                              \
      nb::arg("draft_block_decode") = false, nb::arg("workspace_bytes") = 0,                    \
      nb::arg("num_q_heads") = 0, nb::arg("num_kv_heads") = 0, nb::arg("head_dim") = 0,         \
      nb::arg("state_cache_groups") = std::vector<std::string>{},                               \
      nb::arg("stream").none() = nb::none(), nb::arg("sm_margin") = 0

#define PAGEDMHA_FORWARD_ARGS                                                                  \
  nb::arg("q"), nb::arg("k").none(), nb::arg("v").none(), nb::arg("layer"), nb::arg("k_cache"), \
      nb::arg("v_cache"), nb::arg("out_cache_loc").none(), nb::arg("bs"), nb::arg("out"),       \
      nb::arg("save_kv_cache") = true, nb::kw_only(), nb::arg("stream").none() = nb::none()

constexpr const char* kConfigDoc = R"(
Config (keyword arguments, fixed for the backend's lifetime):
    page_size: tokens per page. context_len: longest KV length of a request (tokens).
    kv_cache_dtype: DType.bf16, fp16 or fp8_e4m3. out_dtype: bf16 or fp16 (the query dtype).
    max_bs: most requests in one step. device: "cpu" or "cuda:N".
    spec_num_tokens: speculative tokens per request N (1: off). is_draft: drafter backend.
    draft_block_decode: block-diffusion (DFLASH) drafter. workspace_bytes: decode workspace
    (0: sized from num_q_heads, num_kv_heads, head_dim of the largest layer, or by
    register_layers). state_cache_groups: recurrent cache
    groups to ignore (distinct ids). stream: cudaStream_t as int for the backend's ops (set_stream changes it).
    sm_margin: SMs every attention launch leaves free for a kernel beside it on another
    stream, such as a collective (>= 0; see batch_decode).

Raises:
    pagedmha.Error: invalid config values (and, for create_backend, an unknown name).)";

}  // namespace

void bind_backend(nb::module_& m) {
  using nb::arg;
  // nanobind keeps the docstring pointers: static storage.
  static const std::string init_doc = std::string("Allocates every persistent buffer.\n") + kConfigDoc;
  static const std::string create_doc =
      std::string("The backend registered under `name` (\"pagedmha\", or its alias \"trtllm\").\n") +
      kConfigDoc;

  nb::enum_<ForwardMode>(m, "ForwardMode", "The engine's forward modes.")
      .value("extend", ForwardMode::extend)
      .value("decode", ForwardMode::decode)
      .value("mixed", ForwardMode::mixed)
      .value("idle", ForwardMode::idle)
      .value("target_verify", ForwardMode::target_verify)
      .value("draft_extend", ForwardMode::draft_extend);

  nb::class_<PyLayerSpec>(m, "LayerSpec", "Per-layer attention parameters.")
      .def(
          "__init__",
          [](PyLayerSpec* self, int layer_id, int num_q_heads, int num_kv_heads, int head_dim,
             std::optional<double> scaling, int window_left, double k_scale, double v_scale, double logits_soft_cap,
             std::string group_id, const ArrayArg& sinks) {
            new (self) PyLayerSpec{};
            LayerSpec& s = self->spec;
            s.layer_id = layer_id;
            s.num_q_heads = num_q_heads;
            s.num_kv_heads = num_kv_heads;
            s.head_dim = head_dim;
            s.scaling = to_float32(scaling.value_or(0.0), "LayerSpec", "scaling");  // 0: head_dim^-0.5 (backend.h)
            s.window_left = window_left;
            s.k_scale = to_float32(k_scale, "LayerSpec", "k_scale");
            s.v_scale = to_float32(v_scale, "LayerSpec", "v_scale");
            s.logits_soft_cap = to_float32(logits_soft_cap, "LayerSpec", "logits_soft_cap");
            s.group_id = std::move(group_id);
            self->sinks = sinks;
          },
          nb::kw_only(), arg("layer_id"), arg("num_q_heads"), arg("num_kv_heads"), arg("head_dim"),
          arg("scaling").none() = nb::none(), arg("window_left") = -1, arg("k_scale") = 1.0, arg("v_scale") = 1.0,
          arg("logits_soft_cap") = 0.0, arg("group_id") = "", arg("sinks").none() = nb::none(),
          "layer_id; num_q_heads Hq; num_kv_heads Hkv (Hq % Hkv == 0); head_dim D (64, 128,\n"
          "256); scaling: sm_scale, None (the default) or 0: D**-0.5; window_left: W (-1: none; HF sliding_window\n"
          "S -> S - 1); k_scale, v_scale: fp8 cache scales (stored = x / scale; ignored for\n"
          "16-bit caches; finite and > 0 for every cache); logits_soft_cap: 0 disables; group_id: cache group whose table this\n"
          "layer uses; sinks: optional fp32 [Hq] sink logits.")
      .def_prop_ro("layer_id", [](const PyLayerSpec& l) { return l.spec.layer_id; })
      .def_prop_ro("num_q_heads", [](const PyLayerSpec& l) { return l.spec.num_q_heads; })
      .def_prop_ro("num_kv_heads", [](const PyLayerSpec& l) { return l.spec.num_kv_heads; })
      .def_prop_ro("head_dim", [](const PyLayerSpec& l) { return l.spec.head_dim; })
      .def_prop_ro("group_id", [](const PyLayerSpec& l) { return l.spec.group_id; });

  nb::class_<PyForwardBatch>(m, "ForwardBatch", "What the engine passes every step.")
      .def(
          "__init__",
          [](PyForwardBatch* self, ForwardMode forward_mode, int batch_size,
             const ArrayArg& req_pool_indices, const ArrayArg& seq_lens, const ArrayArg& req_to_page,
             const ArrayArg& out_cache_loc, const ArrayArg& seq_lens_cpu,
             const ArrayArg& extend_seq_lens_cpu, const ArrayArg& extend_prefix_lens_cpu,
             ArrayMap group_tables) {
            new (self) PyForwardBatch{forward_mode,        batch_size,         req_pool_indices,
                                      seq_lens,            seq_lens_cpu,       extend_seq_lens_cpu,
                                      extend_prefix_lens_cpu, out_cache_loc,   req_to_page,
                                      std::move(group_tables)};
          },
          nb::kw_only(), arg("forward_mode"), arg("batch_size"),
          arg("req_pool_indices").none() = nb::none(), arg("seq_lens").none() = nb::none(),
          arg("req_to_page").none() = nb::none(), arg("out_cache_loc").none() = nb::none(),
          arg("seq_lens_cpu").none() = nb::none(), arg("extend_seq_lens_cpu").none() = nb::none(),
          arg("extend_prefix_lens_cpu").none() = nb::none(), arg("group_tables") = ArrayMap{},
          "forward_mode: ForwardMode; batch_size: bs requests.\n"
          "req_pool_indices: int32 [>= bs] (padded rows 0); seq_lens: int32 [>= bs], KV length\n"
          "after this step (tokens); req_to_page: int32 [max_requests + 1, max_pages] (row 0 all\n"
          "zeros); out_cache_loc: int32 [T] slots of the new tokens; seq_lens_cpu,\n"
          "extend_seq_lens_cpu, extend_prefix_lens_cpu: host int32 [>= bs] (extend / mixed need\n"
          "extend_seq_lens_cpu); group_tables: {group_id: int32 [>= bs, cols]} for hybrid models.\n"
          "Device tensors live on the backend's device.")
      .def_rw("forward_mode", &PyForwardBatch::forward_mode)
      .def_rw("batch_size", &PyForwardBatch::batch_size);

  nb::class_<PyBackend>(m, "MhaBackend",
                        "The paged-KV attention backend of a serving engine (one per model, one\n"
                        "more per drafter). Not thread-safe. Create it with create_backend.")
      .def(
          "__init__",
          with_config<PyBackend*>("MhaBackend", [](PyBackend* self, const BackendConfig& c) {
            new (self) PyBackend(std::make_unique<MhaBackend>(c));
          }),
          nb::kw_only(), PAGEDMHA_CONFIG_ARGS,
          init_doc.c_str())
      .def_prop_ro("page_size", [](PyBackend& b) { return b.get().config().page_size; })
      .def_prop_ro("max_bs", [](PyBackend& b) { return b.get().config().max_bs; })
      .def_prop_ro("device", [](PyBackend& b) { return b.get().config().device.str(); })
      .def_prop_ro("max_num_pages", [](PyBackend& b) { return b.get().max_num_pages(); },
                   "Pages per request row: ceil(context_len / page_size).")
      .def("support_kv_cache_prewrite", [](PyBackend& b) { return b.get().support_kv_cache_prewrite(); })
      .def_prop_ro("stream",
                   [](PyBackend& b) { return reinterpret_cast<std::uintptr_t>(b.get().config().stream.handle); },
                   "The cudaStream_t (an int; 0 the legacy default) the backend issues its ops on: the\n"
                   "last one a call's stream= or set_stream gave.")
      .def("set_stream", [](PyBackend& b, std::uintptr_t s) { b.set_stream(s); }, arg("stream"),
           "Issues the backend's later ops on this cudaStream_t (an int).")
      .def("register_layers", &PyBackend::register_layers, arg("layers"),
           "Declares the model's LayerSpecs before the first step (and any capture): grows the\n"
           "backend-owned decode workspace to the largest need among them, or checks a given\n"
           "workspace_bytes. Optional when the config gives the largest geometry.\n\n"
           "Raises:\n    pagedmha.Error: invalid head counts / head dims; workspace_bytes too small.")
      .def("init_forward_metadata", &PyBackend::init_forward_metadata, arg("forward_batch"),
           nb::kw_only(), arg("stream").none() = nb::none(),
           "Builds the metadata of one eager step (docs/semantics.md section 3) on the device. The\n"
           "decode slot reads forward_batch.seq_lens in place until the next step.\n\n"
           "Raises:\n    pagedmha.Error: dtypes, devices, bs > max_bs, missing host lengths, "
           "unknown group ids.")
      .def("forward_extend", &PyBackend::forward<true>, PAGEDMHA_FORWARD_ARGS,
          "Extend / mixed attention through the prefill slot.\n\n"
          "q: [T, Hq * D] or [T, Hq, D]; k, v: [T, Hkv * D] or [T, Hkv, D], or None;\n"
          "k_cache, v_cache: this layer's paged cache; out_cache_loc: int32 [T] slots;\n"
          "bs: requests; out: [T, Hq * D] or [T, Hq, D] of the query dtype. Writes K/V first\n"
          "when save_kv_cache and k is given.\n\nReturns:\n    out as [T, Hq * D] (pagedmha.MhaBackend; the raw extension returns None).")
      .def("forward_decode", &PyBackend::forward<false>, PAGEDMHA_FORWARD_ARGS,
          "Decode-mode attention (decode, verify, draft, block draft). Arguments as\n"
          "forward_extend; routing: block draft -> decode slot; q rows / bs > 1 -> prefill\n"
          "slot; else decode slot.\n\nReturns:\n    out as [T, Hq * D] (as forward_extend).")
      .def(
          "select_out_cache_loc",
          [](nb::handle self, const PyLayerSpec& layer, ForwardMode forward_mode,
             const ArrayArg& out_cache_loc, std::optional<std::uintptr_t> stream) {
            return nb::inst_ptr<PyBackend>(self)->select_out_cache_loc(self, layer, forward_mode,
                                                                       out_cache_loc, stream);
          },
          arg("layer"), arg("forward_mode"), arg("out_cache_loc").none(), nb::kw_only(),
          arg("stream").none() = nb::none(),
          "Write slots for a KV prewrite of `layer` in this step: the layer's cache-group slots\n"
          "(int32 backend memory: a NumPy array on the CPU; on CUDA a DLPack capsule, a torch tensor\n"
          "when out_cache_loc is one; rewritten by the next step's metadata, and for a drafter\n"
          "by its next call, so copy it to keep it) when groups are active, else out_cache_loc\n"
          "itself (the raw extension returns None for that case). A drafter's group slots are\n"
          "computed from seq_lens on `stream` (default: the device's current one). Errors: a\n"
          "forward_mode other than the step's metadata's, or a grouped layer before any metadata.")
      .def("init_cuda_graph_state", &PyBackend::init_cuda_graph_state, arg("max_bs"),
           arg("seq_lens_buf"), arg("cache_group_ids") = std::vector<std::string>{}, nb::kw_only(),
           arg("stream").none() = nb::none(),
           "Allocates the graph buffers for up to max_bs requests. seq_lens_buf: the engine's\n"
           "int32 [>= max_bs] lengths buffer, aliased (never written) by captured decode slots;\n"
           "the backend keeps a reference to it. cache_group_ids: groups a graph may read.")
      .def("init_forward_metadata_capture_cuda_graph", &PyBackend::capture, arg("bs"),
           arg("forward_mode"), arg("cache_group_ids") = std::vector<std::string>{}, nb::kw_only(),
           arg("stream").none() = nb::none(),
           "Records the metadata slots of padded batch size bs over the graph buffers. Call\n"
           "before capture begins (decode-mode steps only).")
      .def("init_forward_metadata_replay_cuda_graph", &PyBackend::replay, arg("forward_batch"),
           nb::kw_only(), arg("stream").none() = nb::none(),
           "Before each replay, outside the graph: gathers page tables into the graph buffers,\n"
           "recomputes clamps and write slots. forward_batch.seq_lens must be seq_lens_buf.\n\n"
           "Raises:\n    pagedmha.Error: bs not captured; a captured group's table missing.")
      .def("fill_block_decode_seq_lens", &PyBackend::fill_block_decode_seq_lens, arg("bs"),
           arg("block_ends"), nb::kw_only(), arg("stream").none() = nb::none(),
           "Block draft, inside the graph: the N rows of request r get KV length\n"
           "clamp(block_ends[r], N, context_len). block_ends: int32 [>= bs] on the device.");

  m.def(
      "create_backend",
      with_config<const std::string&>("create_backend", [](const std::string& name, const BackendConfig& c) {
        return PyBackend(create_backend(name, c));
      }),
      arg("name"), nb::kw_only(), PAGEDMHA_CONFIG_ARGS,
      create_doc.c_str());
  m.def("registered_backends", &registered_backends, "Registered backend names, sorted.");
  // pagedmha.MhaBackend is a Python subclass (its constructor reports wrong argument types as
  // pagedmha.Error; nanobind never calls a replaced __init__ of its own types). create_backend
  // builds the extension's class, so this moves the backend into an instance of the subclass.
  m.def(
      "_adopt",
      [](nb::type_object cls, PyBackend& backend) {
        if (!PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()),
                              reinterpret_cast<PyTypeObject*>(nb::type<PyBackend>().ptr()))) {
          throw Error("_adopt: cls: expected a subclass of MhaBackend");
        }
        nb::object obj = nb::inst_alloc(cls);
        new (nb::inst_ptr<PyBackend>(obj)) PyBackend(std::move(backend));
        nb::inst_mark_ready(obj);
        return obj;
      },
      arg("cls"), arg("backend"));
}

}  // namespace pagedmha::python
