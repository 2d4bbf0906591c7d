"""pagedmha: paged-KV multi-head attention for LLM serving (Hopper CUDA kernels and an
exact multi-threaded CPU path).

Every op takes its tensors zero-copy from NumPy, PyTorch (CPU and CUDA), CuPy or any other
DLPack producer, writes its outputs in place and returns None. NumPy has no bf16 or fp8
dtype: pass raw uint16 / uint8 bits through ``view_as(array, "bf16")`` /
``view_as(array, "fp8_e4m3")``.

Streams: every op takes ``stream=`` (a ``cudaStream_t`` as an int). When it is None the op
runs on the current stream of the first torch (or CuPy) CUDA input, else on the legacy
default stream; CPU calls ignore it and return when done.

Errors: invalid arguments raise :class:`Error` (a ``ValueError``) whose message names the
op, the argument, the expectation and the value given; so do arguments of the wrong type
(None for a required array, a float page size, a str for an int, a missing argument),
which the extension alone would report as a ``TypeError``, and a bool where an int or a
float is expected (``page_size=True``), which the extension alone would take as 1.

Softmax scale: ``bmm1_scale=None`` (the default of batch_decode and batch_prefill) means
``head_dim ** -0.5`` with head_dim = ``q.shape[-1]``, as in FlashAttention and FlashInfer;
a value given is used as is (with an fp8 cache it must include ``k_scale``).

``pagedmha.torch`` registers the ops as ``torch.library`` custom ops (torch.compile, CUDA
graphs).
"""

from __future__ import annotations

import functools as _functools
import itertools as _itertools
import sys as _sys

from . import _arguments, _pagedmha
from ._pagedmha import (
    DType,
    Error,
    ForwardMode,
    TypedArray,
    built_with_cuda,
    cuda_available,
    debug_validation,
    decode_workspace_size,
    prefill_workspace_size,
    registered_backends,
    set_debug_validation,
    visible_pairs,
)

Error.__module__ = __name__

__version__ = "0.1.0"


def view_as(array, dtype) -> TypedArray:
    """Reads ``array``'s elements as ``dtype`` without copying.

    Args:
        array: any DLPack-capable array (NumPy, torch, CuPy), read-only ones included
            (an op refuses a read-only view only where it writes), or a TypedArray
            (its array is viewed again).
        dtype: a :class:`DType` or its name ("bf16", "fp16", "fp32", "int32", "int64",
            "uint8", "fp8_e4m3"); its element size must equal the array's
            (bf16/fp16: 2 bytes, fp8_e4m3/uint8: 1 byte).

    Returns:
        TypedArray, accepted by every op wherever an array is.

    Raises:
        pagedmha.Error: element size mismatch, unknown dtype name, an argument of the wrong type.
    """
    return _view_as(_export(array), _arguments.dtype(dtype, "view_as", "dtype"))


_view_as = _arguments.checked("view_as", _pagedmha.view_as)


def _current_stream(values) -> int:
    """The current stream of the first torch / CuPy CUDA array among ``values`` (0: none).

    Looks frameworks up in sys.modules only, so a process that never imported torch
    never imports it here.
    """
    torch = _sys.modules.get("torch")
    cupy = _sys.modules.get("cupy")
    for x in values:
        if torch is not None and isinstance(x, torch.Tensor):
            if x.is_cuda:
                return torch.cuda.current_stream(x.device).cuda_stream
        elif cupy is not None and isinstance(x, cupy.ndarray):
            return cupy.cuda.get_current_stream().ptr
    return 0


def _export(x):
    """A torch tensor as a DLPack capsule, anything else unchanged.

    nanobind imports arrays through ``__dlpack__()``, which for a torch CUDA tensor and no
    stream makes the legacy default stream wait on the current one: an extra dependency in
    eager mode and an error under CUDA-graph capture. ``to_dlpack`` exports with no stream
    handshake; the op itself runs on the resolved stream. float8_e4m3fn goes as its uint8
    bits (not every torch exports fp8 through DLPack).
    """
    torch = _sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return x
    x = x.detach()
    if x.dtype == getattr(torch, "float8_e4m3fn", None):
        return _pagedmha.view_as(torch.utils.dlpack.to_dlpack(x.view(torch.uint8)), DType.fp8_e4m3)
    return torch.utils.dlpack.to_dlpack(x)


def _export_all(args, kwargs):
    args = tuple(_export(a) for a in args)
    kwargs = {k: ({g: _export(t) for g, t in v.items()} if isinstance(v, dict) else _export(v))
              for k, v in kwargs.items()}
    return args, kwargs


def _stream_defaulted(op):
    """Wraps an extension op: ``stream=None`` resolves to the inputs' current stream and
    torch tensors are exported without a stream handshake (see _export)."""

    @_functools.wraps(op)
    def call(*args, stream: int | None = None, **kwargs):
        if stream is None:
            stream = _current_stream(_itertools.chain(args, kwargs.values()))
        args, kwargs = _export_all(args, kwargs)
        return op(*args, stream=stream, **kwargs)

    return _arguments.checked(op.__name__, op, call)


append_kv = _stream_defaulted(_pagedmha.append_kv)
batch_decode = _stream_defaulted(_pagedmha.batch_decode)
batch_prefill = _stream_defaulted(_pagedmha.batch_prefill)
gather_page_table_with_padding = _stream_defaulted(_pagedmha.gather_page_table_with_padding)
cumsum_lengths = _stream_defaulted(_pagedmha.cumsum_lengths)
clamp_seq_lens = _stream_defaulted(_pagedmha.clamp_seq_lens)
decode_write_slots = _stream_defaulted(_pagedmha.decode_write_slots)
extend_write_slots = _stream_defaulted(_pagedmha.extend_write_slots)
merge_attention_states = _stream_defaulted(_pagedmha.merge_attention_states)
decode_workspace_size = _arguments.checked("decode_workspace_size", decode_workspace_size)
prefill_workspace_size = _arguments.checked("prefill_workspace_size", prefill_workspace_size)
visible_pairs = _arguments.checked("visible_pairs", visible_pairs)
set_debug_validation = _arguments.checked("set_debug_validation", set_debug_validation)


def _device_stream(device: str) -> int | None:
    """The current torch / CuPy stream of a "cuda:N" device (None: keep the backend's)."""
    if not device.startswith("cuda"):
        return None
    torch = _sys.modules.get("torch")
    if torch is not None:
        # Only a device torch can use: anything else (no driver, an index past the device
        # count, a malformed name) is left to the library, whose error names the call and
        # the argument.
        try:
            return torch.cuda.current_stream(torch.device(device)).cuda_stream
        except (RuntimeError, ValueError, AssertionError):
            return None
    cupy = _sys.modules.get("cupy")
    if cupy is not None:
        # The same for CuPy, whose current stream is per device.
        index = device[len("cuda:"):] if device.startswith("cuda:") else "0"
        if not index.isdigit():
            return None
        try:
            with cupy.cuda.Device(int(index)):
                return cupy.cuda.get_current_stream().ptr
        except Exception:  # CuPy's CUDA errors have no common base class but Exception
            return None
    return None


def _backend_method(method):
    """A backend method whose stream=None means the current stream of the backend's device
    (so eager calls and calls under torch.cuda.graph capture land on the right stream), with
    torch tensors exported as in _stream_defaulted."""

    @_functools.wraps(method)
    def call(self, *args, stream: int | None = None, **kwargs):
        if stream is None:
            stream = _device_stream(self.device)
        args, kwargs = _export_all(args, kwargs)
        return method(self, *args, stream=stream, **kwargs)

    return call


def _checked_method(cls, name, wrap=None, op=None):
    """Replaces cls.name by wrap(raw method) (default: the raw method) with wrong argument
    types raised as pagedmha.Error naming `op` (default: the method's name)."""
    raw = getattr(cls, name)
    func = raw if wrap is None else wrap(raw)
    setattr(cls, name, _arguments.checked(op or name, raw, func, method=True))


class MhaBackend(_pagedmha.MhaBackend):
    # A Python subclass, as ForwardBatch and LayerSpec below: nanobind constructs its own
    # types without looking at a replaced __init__. create_backend returns one too.
    __doc__ = _pagedmha.MhaBackend.__doc__


for _name in (
    "init_forward_metadata",
    "init_cuda_graph_state",
    "init_forward_metadata_capture_cuda_graph",
    "init_forward_metadata_replay_cuda_graph",
    "fill_block_decode_seq_lens",
):
    _checked_method(MhaBackend, _name, _backend_method)
for _name in ("register_layers", "set_stream"):
    _checked_method(MhaBackend, _name)
del _name


def _forward_method(method):
    """forward_extend / forward_decode: returns ``out`` as [T, Hq * D] (a view of it)."""
    method = _backend_method(method)

    @_functools.wraps(method)
    def call(self, q, k, v, layer, k_cache, v_cache, out_cache_loc, bs, out, save_kv_cache=True,
             *, stream: int | None = None):
        method(self, q, k, v, layer, k_cache, v_cache, out_cache_loc, bs, out, save_kv_cache,
               stream=stream)
        return out.reshape(out.shape[0], -1) if len(out.shape) == 3 else out

    return call


_checked_method(MhaBackend, "forward_extend", _forward_method)
_checked_method(MhaBackend, "forward_decode", _forward_method)


def _select_method(select):
    select = _backend_method(select)

    @_functools.wraps(select)
    def call(self, layer, forward_mode, out_cache_loc, *, stream: int | None = None):
        slots = select(self, layer, forward_mode, _export(out_cache_loc), stream=stream)
        if slots is None:  # the caller's own out_cache_loc
            return out_cache_loc
        torch = _sys.modules.get("torch")
        if torch is not None and isinstance(out_cache_loc, torch.Tensor):
            return torch.utils.dlpack.from_dlpack(slots)
        return slots

    return call


_checked_method(MhaBackend, "select_out_cache_loc", _select_method)


def _config(config: dict, op: str) -> dict:
    """Backend config with dtype names resolved (errors name `op`) and, for a CUDA device
    given no stream, the device's current stream."""
    for key in ("kv_cache_dtype", "out_dtype"):
        if key in config:
            config[key] = _arguments.dtype(config[key], op, key)
    if config.get("stream") is None:
        config["stream"] = _device_stream(str(config.get("device", "cpu")))
    return config


def _refuse_constructed(self, op):
    if _pagedmha._constructed(self):
        raise Error(f"{op}: self: expected a new object, got one already constructed "
                    f"(construct another {op} instead of calling __init__ again)")


def _config_init(init):
    @_functools.wraps(init)
    def call(self, *args, **config):
        _refuse_constructed(self, "MhaBackend")
        init(self, *args, **_config(config, "MhaBackend"))

    return call


def _exporting_init(op):
    def wrap(init):
        @_functools.wraps(init)
        def call(self, *args, **kwargs):
            _refuse_constructed(self, op)
            args, kwargs = _export_all(args, kwargs)
            init(self, *args, **kwargs)

        return call

    return wrap


# Classes holding arrays: Python subclasses whose constructors export torch tensors (see
# _export) and report wrong argument types as pagedmha.Error. nanobind constructs its own
# types without looking at a replaced __init__, hence subclasses; every method taking the
# extension's class takes them.


class ForwardBatch(_pagedmha.ForwardBatch):
    __doc__ = _pagedmha.ForwardBatch.__doc__


class LayerSpec(_pagedmha.LayerSpec):
    __doc__ = _pagedmha.LayerSpec.__doc__


_checked_method(MhaBackend, "__init__", _config_init, op="MhaBackend")
_checked_method(ForwardBatch, "__init__", _exporting_init("ForwardBatch"), op="ForwardBatch")
_checked_method(LayerSpec, "__init__", _exporting_init("LayerSpec"), op="LayerSpec")


def create_backend(name: str = "pagedmha", *args, **config) -> MhaBackend:
    """The attention backend registered under ``name`` ("pagedmha", or its alias "trtllm",
    so an engine configured for the upstream "trtllm" backend switches by name).

    ``config``: keyword arguments of :class:`MhaBackend` (page_size, context_len,
    kv_cache_dtype, out_dtype, max_bs, device, spec_num_tokens, is_draft, draft_block_decode,
    workspace_bytes, num_q_heads, num_kv_heads, head_dim, state_cache_groups, stream,
    sm_margin); dtypes
    may be given by name ("bf16") and device as "cpu" / "cuda:N" / a torch.device. For a CUDA
    device with stream None the backend starts on the device's current torch stream.

    Raises:
        pagedmha.Error: an unknown name (the message lists the registered ones), an invalid
            config value or an argument of the wrong type.
    """
    return _create_backend(name, *args, **config)


def _create(name, *args, **config):
    if args:
        raise Error(f"create_backend: config: expected keyword arguments after the name "
                    f"(page_size=..., context_len=..., ...), got {len(args)} positional value(s)")
    config = _config(config, "create_backend")
    return _pagedmha._adopt(MhaBackend, _pagedmha.create_backend(name, **config))


_create_backend = _arguments.checked("create_backend", _pagedmha.create_backend, _create)


__all__ = [
    "DType",
    "Error",
    "ForwardBatch",
    "ForwardMode",
    "LayerSpec",
    "MhaBackend",
    "create_backend",
    "registered_backends",
    "TypedArray",
    "append_kv",
    "batch_decode",
    "batch_prefill",
    "built_with_cuda",
    "clamp_seq_lens",
    "cuda_available",
    "cumsum_lengths",
    "debug_validation",
    "decode_workspace_size",
    "prefill_workspace_size",
    "decode_write_slots",
    "extend_write_slots",
    "gather_page_table_with_padding",
    "merge_attention_states",
    "set_debug_validation",
    "visible_pairs",
    "view_as",
]
