"""pagedmha ops as PyTorch custom ops (``torch.ops.pagedmha.*``), in place and functional.

In place: each op of :mod:`pagedmha` (append_kv, batch_decode, batch_prefill and the
metadata ops) is (or, for the attention ops, calls with every argument filled in) a
``torch.library.custom_op`` that writes its outputs in place (they are listed in
``mutates_args``) and returns None, with a fake (meta) implementation, so it can be
called from a model compiled with ``torch.compile`` (the ops are opaque to Dynamo and
functionalized by Inductor) and captured in a ``torch.cuda.CUDAGraph``: an op issues its
work on ``torch.cuda.current_stream()``, never synchronises and never allocates.

Functional: :func:`batch_decode_with_kvcache` and :func:`batch_prefill_with_kvcache`
allocate and return ``out`` (and, with ``return_lse=True``, ``lse``) in the style of
FlashAttention's ``flash_attn_with_kvcache``, then run the in-place op; on CUDA they also
allocate the workspace when none is given (allocations come from torch's caching
allocator, so they are graph-capturable too).

Arguments and semantics are those of the same-named functions in :mod:`pagedmha`
(shapes, dtypes, units in their docstrings); tensors may be CPU or CUDA, bf16 / fp16 /
float8_e4m3fn / fp32 / int32 as each op requires, any strides with a contiguous last dim.
``bmm1_scale=None`` (the default) means ``head_dim ** -0.5`` (head_dim = ``q.shape[-1]``).
Errors raise :class:`pagedmha.Error` naming the function called and the argument, wrong
argument types (None for a tensor, a float page size) included.

Importing this module imports torch; ``import pagedmha`` alone does not.
"""

import contextlib
from typing import Optional, Tuple, Union

import torch

import pagedmha as _pm
from pagedmha import _arguments

__all__ = [
    "append_kv",
    "batch_decode",
    "batch_decode_with_kvcache",
    "batch_prefill",
    "batch_prefill_with_kvcache",
    "gather_page_table_with_padding",
    "cumsum_lengths",
    "clamp_seq_lens",
    "decode_write_slots",
    "extend_write_slots",
    "merge_attention_states",
]

# What a wrong argument type looks like here: torch's dispatcher answers a schema mismatch
# with a RuntimeError, our wrappers read attributes of what should be tensors.
_ARGUMENT_ERRORS = (TypeError, RuntimeError, AttributeError)


def _public(impl, signature_of):
    """`impl` as a public function: wrong argument types (judged against the annotations of
    `signature_of`, whose name and docstring it takes) raise pagedmha.Error naming it."""
    return _arguments.checked(signature_of.__name__, _arguments.python_signature(signature_of),
                              impl, errors=_ARGUMENT_ERRORS, like=signature_of)


def _checked(fn):
    """Decorator: fn as a public function (see _public)."""
    return _public(fn, fn)


def _custom_op(name: str, mutates_args):
    """Registers the decorated function as ``torch.ops.pagedmha.<name>``; the op object
    (for register_fake) goes into _OPS, the checked public function is returned."""

    def register(fn):
        _OPS[name] = torch.library.custom_op(f"pagedmha::{name}", mutates_args=mutates_args)(fn)
        return _public(_OPS[name], fn)

    return register


_OPS = {}


def _stream(t: torch.Tensor) -> int:
    """The current stream of t's device (the capture stream inside torch.cuda.graph).
    pagedmha's functions export the tensors through DLPack with no stream handshake."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


@_custom_op("append_kv", mutates_args=("k_cache", "v_cache"))
def append_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              out_cache_loc: torch.Tensor, page_size: int, k_scale: float = 1.0,
              v_scale: float = 1.0) -> None:
    """k_cache[out_cache_loc[t]] = k[t], v_cache[out_cache_loc[t]] = v[t] (see pagedmha.append_kv)."""
    _pm.append_kv(k, v, k_cache, v_cache, out_cache_loc, page_size,
                  k_scale, v_scale, stream=_stream(k_cache))


# The attention ops take their optional mutated outputs (lse, workspace) as required
# arguments, and the public functions below supply the defaults: the dispatcher drops
# trailing arguments equal to their schema default before calling the Python kernels, and
# torch's ADInplaceOrView shim then indexes a mutated argument that is not there
# (IndexError; pytorch/pytorch#176078) instead of reaching the op.


@torch.library.custom_op("pagedmha::batch_decode", mutates_args=("out", "lse", "workspace"))
def _batch_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                  q_len_per_req: int, out: torch.Tensor, lse: Optional[torch.Tensor],
                  workspace: Optional[torch.Tensor], bmm1_scale: Optional[float] = None,
                  bmm2_scale: float = 1.0, window_left: int = -1, logits_soft_cap: float = 0.0,
                  sinks: Optional[torch.Tensor] = None, num_splits: int = 0,
                  sm_margin: int = 0) -> None:
    _pm.batch_decode(q, k_cache, v_cache, page_table, seq_lens,
                     page_size, q_len_per_req, out, bmm1_scale=bmm1_scale,
                     bmm2_scale=bmm2_scale, window_left=window_left,
                     logits_soft_cap=logits_soft_cap, sinks=sinks, num_splits=num_splits,
                     sm_margin=sm_margin, lse=lse, workspace=workspace, stream=_stream(q))


@_checked
def batch_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                 q_len_per_req: int, out: torch.Tensor, bmm1_scale: Optional[float] = None,
                 bmm2_scale: float = 1.0, window_left: int = -1, logits_soft_cap: float = 0.0,
                 sinks: Optional[torch.Tensor] = None, num_splits: int = 0,
                 lse: Optional[torch.Tensor] = None,
                 workspace: Optional[torch.Tensor] = None, sm_margin: int = 0) -> None:
    """Decode / verify attention into out (and lse) (see pagedmha.batch_decode); calls
    ``torch.ops.pagedmha.batch_decode``.

    bmm1_scale: None (the default) means q.shape[-1] ** -0.5.
    workspace: uint8, at least pagedmha.decode_workspace_size(q.device, ...) bytes (None on
    the CPU); scratch the kernel writes (hence listed as mutated), shareable by all layers.
    sm_margin: SMs the Hopper kernel leaves free for a kernel beside it (see pagedmha).
    """
    _batch_decode(q, k_cache, v_cache, page_table, seq_lens, page_size, q_len_per_req, out,
                  lse, workspace, bmm1_scale, bmm2_scale, window_left, logits_soft_cap, sinks,
                  num_splits, sm_margin)


@torch.library.custom_op("pagedmha::batch_prefill", mutates_args=("out", "lse", "workspace"))
def _batch_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   page_table: torch.Tensor, seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   page_size: int, max_q_len: int, out: torch.Tensor,
                   lse: Optional[torch.Tensor], workspace: Optional[torch.Tensor],
                   bmm1_scale: Optional[float] = None, bmm2_scale: float = 1.0,
                   window_left: int = -1, logits_soft_cap: float = 0.0,
                   sinks: Optional[torch.Tensor] = None, causal: bool = True,
                   sm_margin: int = 0) -> None:
    _pm.batch_prefill(q, k_cache, v_cache, page_table, seq_lens,
                      cu_seqlens_q, page_size, max_q_len, out, bmm1_scale=bmm1_scale,
                      bmm2_scale=bmm2_scale, window_left=window_left,
                      logits_soft_cap=logits_soft_cap, sinks=sinks, causal=causal,
                      sm_margin=sm_margin, lse=lse, workspace=workspace, stream=_stream(q))


def _prefill_workspace(q: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    size = _pm.prefill_workspace_size(str(q.device), seq_lens.shape[0], q.shape[0])
    return torch.empty(max(size, 1), dtype=torch.uint8, device=q.device)


@_checked
def batch_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  page_table: torch.Tensor, seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor,
                  page_size: int, max_q_len: int, out: torch.Tensor,
                  bmm1_scale: Optional[float] = None, bmm2_scale: float = 1.0,
                  window_left: int = -1, logits_soft_cap: float = 0.0,
                  sinks: Optional[torch.Tensor] = None, causal: bool = True,
                  lse: Optional[torch.Tensor] = None,
                  workspace: Optional[torch.Tensor] = None, sm_margin: int = 0) -> None:
    """Prefill / extend attention into out (and lse) (see pagedmha.batch_prefill); calls
    ``torch.ops.pagedmha.batch_prefill``.

    bmm1_scale: None (the default) means q.shape[-1] ** -0.5.
    workspace: uint8, at least pagedmha.prefill_workspace_size(q.device, batch, total_q)
    bytes; None on a CUDA device allocates one here (pass your own under CUDA-graph capture
    or to avoid the allocation).
    sm_margin: SMs the Hopper kernel leaves free for a kernel beside it (see pagedmha)."""
    if workspace is None and q.is_cuda:
        workspace = _prefill_workspace(q, seq_lens)
    _batch_prefill(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, page_size,
                   max_q_len, out, lse, workspace, bmm1_scale, bmm2_scale, window_left,
                   logits_soft_cap, sinks, causal, sm_margin)



# ---------------------------------------------------------------------------------------
# Functional forms: allocate out (and lse), then the in-place op above.


@contextlib.contextmanager
def _named(call: str):
    """pagedmha.Error raised inside (by the in-place op or a workspace size) names `call`,
    the function the user called."""
    try:
        yield
    except _pm.Error as error:
        op, sep, rest = str(error).partition(": ")
        raise _pm.Error(f"{call}: {rest}" if sep else f"{call}: {op}") from None


def _outputs(q: torch.Tensor, return_lse: bool):
    """out of q's shape and dtype (bf16 for fp8 queries), lse fp32 [rows, Hq] on request."""
    if not isinstance(return_lse, bool):  # _checked names the argument (it is typed bool)
        raise TypeError("return_lse")
    fp8 = getattr(torch, "float8_e4m3fn", None)
    out = torch.empty(q.shape, dtype=torch.bfloat16 if q.dtype == fp8 else q.dtype,
                      device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    return out, lse


def _returned(out, lse, return_lse):
    return (out, lse) if return_lse else out


@_checked
def batch_decode_with_kvcache(
        q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
        seq_lens: torch.Tensor, page_size: int, q_len_per_req: int = 1, *,
        bmm1_scale: Optional[float] = None, bmm2_scale: float = 1.0, window_left: int = -1,
        logits_soft_cap: float = 0.0, sinks: Optional[torch.Tensor] = None, num_splits: int = 0,
        return_lse: bool = False, workspace: Optional[torch.Tensor] = None, sm_margin: int = 0,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Decode / verify attention returning a new ``out``: the functional form of
    :func:`batch_decode`, in the style of ``flash_attn_with_kvcache``.

    Args: as batch_decode (q [batch * q_len_per_req, Hq, D]; k_cache, v_cache paged
    [.., Hkv, D]; page_table int32 [batch, cols]; seq_lens int32 [batch], KV length in
    tokens including this step's queries), without out and lse; bmm1_scale None means
    D ** -0.5. workspace: None allocates one on CUDA (decode_workspace_size bytes; pass
    your own to reuse it across layers).

    Returns:
        out: a new tensor of q's shape and dtype (bf16 for fp8 queries); with
        return_lse=True, (out, lse), lse a new fp32 [batch * q_len_per_req, Hq] tensor
        (natural-log log-sum-exp of the logits, sink included).

    Raises:
        pagedmha.Error: naming batch_decode_with_kvcache, the argument, the expectation
        and the value given.
    """
    with _named("batch_decode_with_kvcache"):
        out, lse = _outputs(q, return_lse)
        if workspace is None and q.is_cuda:
            size = _pm.decode_workspace_size(str(q.device), seq_lens.shape[0], q_len_per_req,
                                             q.shape[-2], k_cache.shape[-2], q.shape[-1])
            workspace = torch.empty(max(size, 1), dtype=torch.uint8, device=q.device)
        batch_decode(q, k_cache, v_cache, page_table, seq_lens, page_size, q_len_per_req,
                             out, bmm1_scale, bmm2_scale, window_left, logits_soft_cap, sinks,
                             num_splits, lse, workspace, sm_margin)
    return _returned(out, lse, return_lse)


@_checked
def batch_prefill_with_kvcache(
        q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
        seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor, page_size: int, max_q_len: int, *,
        bmm1_scale: Optional[float] = None, bmm2_scale: float = 1.0, window_left: int = -1,
        logits_soft_cap: float = 0.0, sinks: Optional[torch.Tensor] = None, causal: bool = True,
        return_lse: bool = False, workspace: Optional[torch.Tensor] = None, sm_margin: int = 0,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Prefill / extend attention returning a new ``out``: the functional form of
    :func:`batch_prefill`, in the style of ``flash_attn_varlen_func`` over a paged cache.

    Args: as batch_prefill (q [total_q, Hq, D], request b's queries at rows
    [cu_seqlens_q[b], cu_seqlens_q[b + 1]); seq_lens int32 [batch], KV length including
    the new tokens; max_q_len a host bound of the query lengths), without out and lse;
    bmm1_scale None means D ** -0.5. workspace: None allocates one on CUDA.

    Returns:
        out: a new tensor of q's shape and dtype; with return_lse=True, (out, lse), lse a
        new fp32 [total_q, Hq] tensor.

    Raises:
        pagedmha.Error: naming batch_prefill_with_kvcache, the argument, the expectation
        and the value given.
    """
    with _named("batch_prefill_with_kvcache"):
        out, lse = _outputs(q, return_lse)
        batch_prefill(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, page_size,
                              max_q_len, out, bmm1_scale, bmm2_scale, window_left,
                              logits_soft_cap, sinks, causal, lse, workspace, sm_margin)
    return _returned(out, lse, return_lse)



# ---------------------------------------------------------------------------------------
# Metadata ops


@_custom_op("gather_page_table_with_padding", mutates_args=("out",))
def gather_page_table_with_padding(req_to_page: torch.Tensor, req_pool_indices: torch.Tensor,
                                   seq_lens: torch.Tensor, out: torch.Tensor, bs: int, cols: int,
                                   page_size: int) -> None:
    """out[r, c] = req_to_page[req_pool_indices[r], c] or 0 past the live pages (see pagedmha)."""
    _pm.gather_page_table_with_padding(req_to_page, req_pool_indices, seq_lens,
                                       out, bs, cols, page_size, stream=_stream(out))


@_custom_op("cumsum_lengths", mutates_args=("out",))
def cumsum_lengths(lengths: torch.Tensor, out: torch.Tensor) -> None:
    """out = [0, cumsum(lengths)] (int32; see pagedmha.cumsum_lengths)."""
    _pm.cumsum_lengths(lengths, out, stream=_stream(out))


@_custom_op("clamp_seq_lens", mutates_args=("out",))
def clamp_seq_lens(seq_lens: torch.Tensor, min_len: int, out: torch.Tensor) -> None:
    """out = max(seq_lens, min_len) (int32; see pagedmha.clamp_seq_lens)."""
    _pm.clamp_seq_lens(seq_lens, min_len, out, stream=_stream(out))


@_custom_op("decode_write_slots", mutates_args=("out",))
def decode_write_slots(page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                       q_len_per_req: int, out: torch.Tensor) -> None:
    """Cache slots of a decode / verify step's new tokens (see pagedmha.decode_write_slots)."""
    _pm.decode_write_slots(page_table, seq_lens, page_size, q_len_per_req, out,
                           stream=_stream(out))


@_custom_op("extend_write_slots", mutates_args=("out",))
def extend_write_slots(page_table: torch.Tensor, prefix_lens: torch.Tensor,
                       cu_seqlens_q: torch.Tensor, page_size: int, out: torch.Tensor) -> None:
    """Cache slots of an extend step's new tokens (see pagedmha.extend_write_slots)."""
    _pm.extend_write_slots(page_table, prefix_lens, cu_seqlens_q, page_size,
                           out, stream=_stream(out))


@torch.library.custom_op("pagedmha::merge_attention_states", mutates_args=("out", "out_lse"))
def _merge_attention_states(o: torch.Tensor, lse: torch.Tensor, out: torch.Tensor,
                            out_lse: Optional[torch.Tensor],
                            sinks: Optional[torch.Tensor] = None) -> None:
    _pm.merge_attention_states(o, lse, out, out_lse=out_lse, sinks=sinks, stream=_stream(out))


@_checked
def merge_attention_states(o: torch.Tensor, lse: torch.Tensor, out: torch.Tensor,
                           out_lse: Optional[torch.Tensor] = None,
                           sinks: Optional[torch.Tensor] = None) -> None:
    """Merges K partial results o [K, T, Hq, D], lse fp32 [K, T, Hq] over disjoint key sets
    into out [T, Hq, D] (and out_lse [T, Hq]) (see pagedmha.merge_attention_states); calls
    ``torch.ops.pagedmha.merge_attention_states``. out may be o[i] in eager mode; under
    torch.compile pass an out that does not alias o (o is not a mutated argument)."""
    _merge_attention_states(o, lse, out, out_lse, sinks)


# Fake implementations: the ops only write into their (already shaped) outputs, so tracing
# needs no output metadata; they check what a fake tensor can show - dtypes and shapes -
# so a bad call fails at trace time instead of inside a compiled graph.


def _expect(cond: bool, op: str, arg: str, expected: str, got) -> None:
    if not cond:
        raise _pm.Error(f"{op}: {arg}: expected {expected}, got {got}")


def _fake_attention(op, q, out, lse):
    _expect(out.shape == q.shape, op, "out", f"shape {list(q.shape)} (q's)", list(out.shape))
    if lse is not None:
        want = list(q.shape[:2])
        _expect(list(lse.shape) == want and lse.dtype == torch.float32, op, "lse",
                f"fp32 {want}", f"{lse.dtype} {list(lse.shape)}")


@_OPS["append_kv"].register_fake
def _(k, v, k_cache, v_cache, out_cache_loc, page_size, k_scale=1.0, v_scale=1.0):
    _expect(out_cache_loc.dtype == torch.int32, "append_kv", "out_cache_loc", "dtype int32",
            out_cache_loc.dtype)


@_batch_decode.register_fake
def _(q, k_cache, v_cache, page_table, seq_lens, page_size, q_len_per_req, out, lse, workspace,
      bmm1_scale=None, bmm2_scale=1.0, window_left=-1, logits_soft_cap=0.0, sinks=None,
      num_splits=0, sm_margin=0):
    _fake_attention("batch_decode", q, out, lse)


@_batch_prefill.register_fake
def _(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, page_size, max_q_len, out, lse,
      workspace, bmm1_scale=None, bmm2_scale=1.0, window_left=-1, logits_soft_cap=0.0,
      sinks=None, causal=True, sm_margin=0):
    _fake_attention("batch_prefill", q, out, lse)


@_merge_attention_states.register_fake
def _(o, lse, out, out_lse, sinks=None):
    op = "merge_attention_states"
    _expect(o.dim() == 4, op, "o", "4 dims [K, T, Hq, D]", list(o.shape))
    _expect(list(out.shape) == list(o.shape[1:]) and out.dtype == o.dtype, op, "out",
            f"{o.dtype} {list(o.shape[1:])} (o's)", f"{out.dtype} {list(out.shape)}")
    _expect(list(lse.shape) == list(o.shape[:3]) and lse.dtype == torch.float32, op, "lse",
            f"fp32 {list(o.shape[:3])}", f"{lse.dtype} {list(lse.shape)}")
    if out_lse is not None:
        _expect(list(out_lse.shape) == list(o.shape[1:3]) and out_lse.dtype == torch.float32, op,
                "out_lse", f"fp32 {list(o.shape[1:3])}", f"{out_lse.dtype} {list(out_lse.shape)}")


@_OPS["gather_page_table_with_padding"].register_fake
def _(req_to_page, req_pool_indices, seq_lens, out, bs, cols, page_size):
    _expect(out.dtype == torch.int32, "gather_page_table_with_padding", "out", "dtype int32",
            out.dtype)


@_OPS["cumsum_lengths"].register_fake
def _(lengths, out):
    _expect(out.shape[0] == lengths.shape[0] + 1, "cumsum_lengths", "out",
            f"shape [{lengths.shape[0] + 1}]", list(out.shape))


@_OPS["clamp_seq_lens"].register_fake
def _(seq_lens, min_len, out):
    _expect(out.shape == seq_lens.shape, "clamp_seq_lens", "out",
            f"shape {list(seq_lens.shape)}", list(out.shape))


@_OPS["decode_write_slots"].register_fake
def _(page_table, seq_lens, page_size, q_len_per_req, out):
    _expect(out.dtype == torch.int32, "decode_write_slots", "out", "dtype int32", out.dtype)


@_OPS["extend_write_slots"].register_fake
def _(page_table, prefix_lens, cu_seqlens_q, page_size, out):
    _expect(out.dtype == torch.int32, "extend_write_slots", "out", "dtype int32", out.dtype)
