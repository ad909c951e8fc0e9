"""A PrimFunc's passage to another process, proven exact: packed in the caller, checked on arrival.

A PrimFunc pickles as TVM's JSON graph, which keeps every object's fields and the sharing of objects
within the graph, but not the identity of objects that are singletons of a process. TileLang's
layouts are such a case: a `Layout` or `Fragment` states its index map in terms of global
placeholder variables (`_i`, `_j`, ..., `_rep`), and everything derived from it (its output shape,
the thread extent of a fragment, whether it is injective) is computed by binding those very
variables. After a round trip they are fresh variables of the same names: the layout of a swizzled
shared tile then has the output shape `_i // 8 + 1`, and the compile fails ("the forward map must be
injective", "must be constant"), though the printed script is identical.

So a transfer is:
- `pack` (in the caller): the pickled function, a *fingerprint* of it, and a proof that the round
  trip is exact for this function. The proof unpickles the payload here, restores the placeholders
  (`restore_placeholders`: every Layout and Fragment in a block's or loop's annotations is rebuilt
  through TileLang's own constructor, with this process's placeholders), and compares the result
  with the caller's function by `tvm.ir.structural_equal`, which compares free variables by
  identity: in one process that is the exact question. A function that fails it is not sent at all
  (`pack` says why): the caller compiles it in a lane that needs no serialization.
- `unpack` (in the worker): the same unpickling and restoring, then the fingerprint of what arrived
  compared with the caller's: `TransferMismatch` when they differ, and nothing is compiled.

The fingerprint must be equal across processes for equal functions and differ for the broken copy:
TVM's structural hash with free variables mapped by position (pointers differ between processes),
plus the printed form of every layout in the function, which shows what the layouts derive (the
broken copy prints `_i // 8 + 1` where the right one prints 16).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from typing import Any

import tvm
import tvm_ffi
from tvm.ir import Range
from tvm.tirx import For, IterVar, PrimFunc, SBlock, Var, stmt_functor

from kcache.errors import KCacheError
from kcache.tilelang import internals

# TileLang's layouts and their FFI constructors (kcache/tilelang/internals.py): where this TileLang
# lacks one, nothing is sent to a worker (`pack` says why) and the kernel compiles in the caller's fork.
_NEEDED = (("tilelang.layout", "Layout"), ("tilelang.layout", "Fragment"), ("tilelang._ffi_api", "Layout"),
           ("tilelang._ffi_api", "Fragment"))
_MISSING = [f"{module}.{name}" for module, name in _NEEDED if internals.lookup(module, name) is None]
Layout: Any = internals.lookup("tilelang.layout", "Layout")
Fragment: Any = internals.lookup("tilelang.layout", "Fragment")
tl_ffi: Any = internals.lookup("tilelang", "_ffi_api")


class TransferMismatch(KCacheError, RuntimeError):
    """What arrived in the worker is not what the caller built: it is never compiled."""

    def __init__(self, kernel_name: str, detail: str) -> None:
        self.kernel_name = kernel_name
        self.detail = detail
        self._init_args = (kernel_name, detail)
        super().__init__(f"kernel {kernel_name!r} did not arrive in the compile worker as the caller built it "
                         f"({detail}); it was not compiled there")


class PackedFunc:
    """A PrimFunc on its way to a worker: TVM's pickled graph and the caller's fingerprint of it."""

    __slots__ = ("payload", "fingerprint", "name")

    def __init__(self, payload: bytes, fingerprint: str, name: str) -> None:
        self.payload = payload
        self.fingerprint = fingerprint
        self.name = name

    def __reduce__(self) -> tuple:
        return (PackedFunc, (self.payload, self.fingerprint, self.name))


class TransferableFunc:
    """The caller's PrimFunc in a job: itself where the job runs from memory (a fork of the caller),
    and, where it is pickled, the checked copy (`unpack` runs as it is unpickled, so a mismatch fails
    the job before anything is compiled)."""

    __slots__ = ("func", "packed")

    def __init__(self, func: PrimFunc, packed: PackedFunc) -> None:
        self.func = func
        self.packed = packed

    def __reduce__(self) -> tuple:
        return (unpack, (self.packed,))


def pack(func: PrimFunc, name: str) -> tuple[PackedFunc | None, str]:
    """(the packed function, "") when its transfer is proven exact; (None, why) when it is not."""
    if _MISSING:
        return None, f"this TileLang lacks {', '.join(_MISSING)}"
    payload = pickle.dumps(func, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        arrived = restore_placeholders(pickle.loads(payload))
    except Exception as err:  # noqa: BLE001 - whatever TVM raises: then it cannot travel
        return None, f"it does not survive pickling ({type(err).__name__}: {err})"
    if not tvm.ir.structural_equal(func, arrived):
        return None, "it does not survive pickling exactly (TVM's structural_equal differs after the round trip)"
    return PackedFunc(payload, fingerprint(func), name), ""


def unpack(packed: PackedFunc) -> PrimFunc:
    """The caller's function, rebuilt here and checked against its fingerprint."""
    func = restore_placeholders(pickle.loads(packed.payload))
    arrived = fingerprint(func)
    if arrived != packed.fingerprint:
        raise TransferMismatch(packed.name, f"fingerprint {arrived[:16]} here, {packed.fingerprint[:16]} in the caller")
    return func


def fingerprint(func: PrimFunc) -> str:
    """Equal in any process for structurally equal functions (see the module's docstring)."""
    digest = hashlib.sha256(str(tvm.ir.structural_hash(func, map_free_vars=True)).encode())
    for layout in _layouts_in(func):
        digest.update(b"\0" + repr(layout).encode())
    return digest.hexdigest()


# ---------------------------------------------------------------- the placeholders of this process


class _Placeholders:
    """TileLang's global placeholder variables, read from layouts made here."""

    def __init__(self) -> None:
        self._inputs: list[Var] = []
        self._replicate: Var | None = None

    def inputs(self, rank: int) -> list[Var]:
        if len(self._inputs) < rank:
            self._inputs = list(Layout([1] * rank, lambda *v: v[0]).get_forward_vars())
        return self._inputs[:rank]

    def replicate(self) -> Var:
        if self._replicate is None:
            self._replicate = Fragment([1], forward_thread_fn=lambda i, rep: rep, replicate=2).forward_thread
        return self._replicate


_PLACEHOLDERS = _Placeholders()


def _restore_layout(layout: Any) -> Any:
    """`layout` rebuilt with this process's placeholders; as it is when it is not a layout this knows
    how to rebuild (the proof in `pack` then decides)."""
    if type(layout) not in (Layout, Fragment):
        return layout
    shape = list(layout.input_size)
    inputs = _PLACEHOLDERS.inputs(len(shape))
    wanted = {var.name: var for var in inputs}
    if type(layout) is Fragment:
        wanted[_PLACEHOLDERS.replicate().name] = _PLACEHOLDERS.replicate()
    exprs = list(layout.forward_index) + ([layout.forward_thread] if type(layout) is Fragment else [])
    mapping = _stale_vars(exprs, wanted)
    if not mapping:
        return layout  # made in this process: its placeholders are ours already
    index = [stmt_functor.substitute(expr, mapping) for expr in layout.forward_index]
    iter_vars = [IterVar(Range(0, extent), var, 0) for extent, var in zip(shape, inputs)]
    if type(layout) is Layout:
        return tl_ffi.Layout(iter_vars, index)
    if layout.thread_range is not None:
        return layout  # bound to a thread range: no constructor takes it (the proof will refuse it)
    replicate = (IterVar(Range(0, layout.replicate_size), _PLACEHOLDERS.replicate(), 0)
                 if _as_int(layout.replicate_size) != 1 else None)
    return tl_ffi.Fragment(iter_vars, index, stmt_functor.substitute(layout.forward_thread, mapping), replicate)


def _stale_vars(exprs: list[Any], wanted: dict[str, Var]) -> dict[Var, Var]:
    """The variables of `exprs` named as a placeholder but not this process's placeholder."""
    mapping: dict[Var, Var] = {}

    def visit(node: Any) -> None:
        if isinstance(node, Var):
            ours = wanted.get(node.name)
            if ours is not None and not node.same_as(ours):
                mapping[node] = ours

    for expr in exprs:
        stmt_functor.post_order_visit(expr, visit)
    return mapping


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------- annotations, where layouts live


def _restore_value(value: Any, restore: Callable[[Any], Any]) -> Any:
    """`value` (an annotation) with every layout in it restored; the same object when none changed."""
    if isinstance(value, (Layout, Fragment)):
        return restore(value)
    if isinstance(value, tvm_ffi.Map):
        items = [(key, _restore_value(item, restore)) for key, item in value.items()]
        if all(new.same_as(old) for (_, new), old in zip(items, value.values())):
            return value
        return tvm_ffi.Map(dict(items))
    if isinstance(value, tvm_ffi.Array):
        items = [_restore_value(item, restore) for item in value]
        if all(new.same_as(old) for new, old in zip(items, value)):
            return value
        return tvm_ffi.Array(items)
    return value


def _restored_annotations(node: Any, restore: Callable[[Any], Any]) -> Any | None:
    annotations = node.annotations
    if not annotations:
        return None
    restored = _restore_value(annotations, restore)
    return None if restored.same_as(annotations) else restored


def _restore_node(node: Any) -> Any:
    annotations = _restored_annotations(node, _restore_layout)
    if annotations is None:
        return node
    if isinstance(node, SBlock):
        return SBlock(node.iter_vars, node.reads, node.writes, node.name_hint, node.body, node.init,
                      node.alloc_buffers, node.match_buffers, annotations)
    return For(node.loop_var, node.min, node.extent, node.kind, node.body, node.thread_binding, annotations,
               node.step)


def restore_placeholders(func: PrimFunc) -> PrimFunc:
    """`func` with every Layout and Fragment in its blocks' and loops' annotations made with this
    process's placeholders (see the module's docstring)."""
    body = stmt_functor.ir_transform(func.body, None, _restore_node, ["tirx.SBlock", "tirx.For"])
    return func if body.same_as(func.body) else func.with_body(body)


def _layouts_in(func: PrimFunc) -> list[Any]:
    found: list[Any] = []

    def collect(value: Any) -> Any:
        found.append(value)
        return value

    def visit(node: Any) -> None:
        if isinstance(node, (SBlock, For)) and node.annotations:
            _restore_value(node.annotations, collect)

    stmt_functor.post_order_visit(func.body, visit)
    return found
