"""Wrong argument types as pagedmha.Error naming the call and the argument.

nanobind answers a call whose arguments do not convert (None for a required array, a float
page size, a str for an int, a missing argument) with a TypeError that dumps the whole
signature. ``checked`` catches that TypeError and, from the extension function's own
signature (``__nb_signature__``), finds the first argument at fault and raises
:class:`pagedmha.Error` "<call>: <argument>: expected ..., got ...". A TypeError it cannot
explain propagates unchanged.

nanobind also converts a bool where an int or a float is expected (bool is an int
subclass), so ``page_size=True`` would run with page size 1. Calls given a bool anywhere
are therefore judged before they run (a bool is refused except where the signature says
bool); calls without one pay only that scan.
"""

from __future__ import annotations

import functools
import inspect
import operator
import sys
import types
import typing
from typing import Callable, NamedTuple, Optional

from . import _pagedmha


class Param(NamedTuple):
    name: str
    annotation: str
    has_default: bool
    keyword_only: bool


def _split_top_level(text: str) -> list[str]:
    """Splits a parameter list at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


@functools.lru_cache(maxsize=None)
def _parse(signature: str) -> tuple[Param, ...]:
    """Params of a nanobind signature "def f(self, a: int, *, b: float = \\0) -> None"
    (defaults appear as \\N placeholders, so they hold no commas); self is dropped."""
    inner = signature[signature.index("(") + 1: signature.rindex(") ->")]
    params, keyword_only = [], False
    for part in _split_top_level(inner):
        if part == "*":
            keyword_only = True
            continue
        head, _, default = part.partition("=")
        name, _, annotation = head.partition(":")
        name = name.strip()
        if name == "self":
            continue
        params.append(Param(name, annotation.strip(), bool(default.strip()), keyword_only))
    return tuple(params)


def signature_of(func) -> tuple[Param, ...]:
    """Params of a nanobind function or method."""
    return _parse(func.__nb_signature__[0][0])


def _annotation_name(annotation) -> str:
    """A Python annotation in the spelling of nanobind's signatures ("int", "X | None")."""
    args = typing.get_args(annotation)
    unions = (typing.Union, getattr(types, "UnionType", typing.Union))  # Optional[X], X | None
    if typing.get_origin(annotation) in unions and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _annotation_name(rest[0]) + " | None"
    if annotation in (int, float, bool, str):
        return annotation.__name__
    if isinstance(annotation, type):
        return f"{annotation.__module__}.{annotation.__qualname__}"
    return "object"


def python_signature(func) -> tuple[Param, ...]:
    """Params of an annotated Python function (as signature_of for nanobind ones)."""
    params = []
    for p in inspect.signature(func).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        params.append(Param(p.name, _annotation_name(p.annotation), p.default is not p.empty,
                            p.kind is p.KEYWORD_ONLY))
    return tuple(params)


# ---------------------------------------------------------------------------------------
# What each annotation accepts (as nanobind converts) and how the error describes it.

_ARRAY = "an array (NumPy, PyTorch, CuPy or any DLPack producer) or a pagedmha.TypedArray"


def _is_int(v) -> bool:
    """An int: operator.index works (Python and NumPy integer scalars, not 1-element
    arrays), and not a bool (nanobind would take True as 1)."""
    if isinstance(v, (float, str, bytes)) or _is_bool(v):
        return False
    try:
        operator.index(v)
    except TypeError:
        return False
    return True


def _is_float(v) -> bool:
    """A real number, not a bool (nanobind would take True as 1.0)."""
    return not isinstance(v, (str, bytes)) and not _is_bool(v) and (
        isinstance(v, (int, float)) or hasattr(type(v), "__float__"))


def _is_bool(v) -> bool:
    """A Python bool or a NumPy one (numpy.bool_, named numpy.bool since NumPy 2)."""
    return isinstance(v, bool) or (type(v).__name__ in ("bool_", "bool")
                                   and type(v).__module__ == "numpy")


def _has_bool(args: tuple, kwargs: dict) -> bool:
    return any(map(_is_bool, args)) or any(map(_is_bool, kwargs.values()))


def _class_check(name: str):
    cls = getattr(_pagedmha, name, None)
    if cls is None:
        return None
    if name == "DType":  # the Python layer also takes dtype names
        return (lambda v: isinstance(v, cls) or (isinstance(v, str) and v in cls.__members__),
                f"a pagedmha.DType or one of the names {', '.join(cls.__members__)}")
    return (lambda v: isinstance(v, cls)), f"a pagedmha.{name}"


def _check(annotation: str, name: str):
    """(accepts(value) -> bool, description) for one annotation; None: not judged."""
    optional = annotation.endswith(" | None")
    base = annotation[: -len(" | None")] if optional else annotation
    if base == "int" and name == "stream":
        accepts, what = _is_int, "a cudaStream_t as an int"
    elif base == "int":
        accepts, what = _is_int, "an int"
    elif base == "float":
        accepts, what = _is_float, "a float"
    elif base == "bool":
        # A Python bool only: nanobind refuses NumPy's as a bool argument.
        accepts, what = (lambda v: isinstance(v, bool)), "a bool"
    elif base == "str":
        accepts, what = (lambda v: isinstance(v, str)), "a str"
    elif base == "ArrayLike" or base.startswith("ndarray"):
        accepts, what = (lambda v: v is not None), _ARRAY
    elif base == "torch.Tensor":
        accepts = lambda v: isinstance(v, sys.modules["torch"].Tensor)  # noqa: E731
        what = "a torch.Tensor"
    elif base.startswith("collections.abc.Sequence[") and base.endswith("]"):
        item = _check(base[len("collections.abc.Sequence["):-1], name)
        if item is None:
            return None
        accepts = lambda v: isinstance(v, (list, tuple)) and all(item[0](x) for x in v)  # noqa: E731
        what = "a list of " + item[1].removeprefix("a ").removeprefix("an ")
    elif base in ("collections.abc.Mapping[str, ArrayLike]", "dict[str, ArrayLike]"):
        accepts = lambda v: isinstance(v, dict) and all(  # noqa: E731
            isinstance(k, str) and x is not None for k, x in v.items())
        what = "a dict of str to arrays"
    elif base.startswith("pagedmha._pagedmha."):
        found = _class_check(base[len("pagedmha._pagedmha."):])
        if found is None:
            return None
        accepts, what = found
    elif name == "device":  # "cpu" / "cuda:N" / a torch.device
        accepts = lambda v: isinstance(v, str) or type(v).__name__ == "device"  # noqa: E731
        what = 'a device ("cpu", "cuda:N" or a torch.device)'
    else:  # object and anything unforeseen
        return None
    if optional:
        return (lambda v: v is None or accepts(v)), what + " or None"
    return accepts, what


def _show(value) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


_INT32 = (-(2**31), 2**31 - 1)
_UNSIGNED = ("stream", "workspace_bytes")  # uintptr_t / size_t parameters


def diagnose(op: str, params: tuple[Param, ...], args: tuple, kwargs: dict) -> Optional[str]:
    """The message for the first argument of `op` that does not fit `params`, or None."""
    positional = [p for p in params if not p.keyword_only]
    names = {p.name for p in params}
    if len(args) > len(positional):
        return (f"{op}: arguments: expected at most {len(positional)} positional arguments "
                f"({', '.join(p.name for p in positional)}), got {len(args)}")
    bound = {p.name: a for p, a in zip(positional, args)}
    for key, value in kwargs.items():
        if key not in names:
            return f"{op}: {key}: unexpected keyword argument (expected one of {', '.join(p.name for p in params)})"
        if key in bound:
            return f"{op}: {key}: given twice (by position and by keyword)"
        bound[key] = value
    for p in params:
        if p.name not in bound and not p.has_default:
            return f"{op}: {p.name}: required argument missing"
    for p in params:
        if p.name not in bound:
            continue
        check = _check(p.annotation, p.name)
        if check is not None and not check[0](bound[p.name]):
            return f"{op}: {p.name}: expected {check[1]}, got {_show(bound[p.name])}"
    # Right types: an int the C++ parameter cannot hold, or a number no double holds (an
    # int past 2^1024: nanobind then raises a TypeError naming the whole signature).
    for p in params:
        value = bound.get(p.name)
        if p.annotation.startswith("float") and value is not None and _is_float(value):
            try:
                float(value)
            except OverflowError:
                return f"{op}: {p.name}: expected a value float32 holds, got {_show(value)}"
        if p.annotation.startswith("int") and value is not None and _is_int(value):
            value = operator.index(value)
            if p.name in _UNSIGNED and not 0 <= value < 2**64:
                return f"{op}: {p.name}: expected an int in [0, 2^64), got {value}"
            if p.name not in _UNSIGNED and not _INT32[0] <= value <= _INT32[1]:
                return f"{op}: {p.name}: expected an int in [{_INT32[0]}, {_INT32[1]}], got {value}"
    return None


def checked(op: str, raw, func: Optional[Callable] = None, method: bool = False,
            errors: tuple = (TypeError,), like: Optional[Callable] = None):
    """`func` (default `raw`) with the `errors` that wrong arguments raise turned into
    pagedmha.Error naming `op` and the argument, judged against `raw`: a nanobind
    function, or the Params of one (see python_signature).
    method: `func` is called as func(self, *args, **kwargs).
    like: whose name and docstring the result takes (default `func`)."""
    func = raw if func is None else func
    params = raw if isinstance(raw, tuple) else signature_of(raw)

    def explain(error: Exception, args, kwargs):
        message = diagnose(op, params, args, kwargs)
        if message is None:
            raise error
        raise _pagedmha.Error(message) from None

    def refuse_bools(args, kwargs):
        """A bool where the signature wants an int or a float (nanobind would convert it)."""
        if _has_bool(args, kwargs):
            message = diagnose(op, params, args, kwargs)
            if message is not None:
                raise _pagedmha.Error(message)

    if method:
        def call_method(self, *args, **kwargs):
            refuse_bools(args, kwargs)
            try:
                return func(self, *args, **kwargs)
            except errors as error:
                explain(error, args, kwargs)
        return functools.wraps(like or func)(call_method)

    def call(*args, **kwargs):
        refuse_bools(args, kwargs)
        try:
            return func(*args, **kwargs)
        except errors as error:
            explain(error, args, kwargs)
    return functools.wraps(like or func)(call)


def dtype(value, op: str, name: str):
    """A DType from a DType or its name; pagedmha.Error naming op and name otherwise (an
    int too, which nanobind would take as the enum's value)."""
    if not isinstance(value, (str, _pagedmha.DType)):
        _, what = _class_check("DType")
        raise _pagedmha.Error(f"{op}: {name}: expected {what}, got {_show(value)}")
    if isinstance(value, str):
        try:
            return _pagedmha.DType.__members__[value]
        except KeyError:
            raise _pagedmha.Error(
                f"{op}: {name}: expected one of {', '.join(_pagedmha.DType.__members__)}, got {value!r}"
            ) from None
    return value


__all__ = ["checked", "diagnose", "dtype", "python_signature", "signature_of"]
