"""A tune's front halves made once for the configs whose Triton IR is the same.

An autotuner's configs often differ only in what the front half never reads: `num_warps`,
`num_stages`, `maxnreg` shape the back half's passes, while the IR that `ASTSource.make_ir` makes
depends on the kernel, its signature, its constexprs and the few options its code generator reads
(`debug`, `supported_fp8_dtypes`, ...). fla's hgrn tunes 12 configs over 3 IRs; a matmul tune's
16 configs commonly have 8. The front halves run in the caller, one at a time under its GIL, and
they are most of a tune's compile phase there (docs/design/triton.md, "A tune's compile phase").

So while a tune's configs are compiled ahead (kcache.triton.parallel_tune: `sharing()`), a front half
is made with options that record every attribute the code generator reads of them, and another
config of the same source (`ASTSource.hash()`: the kernel's and its dependencies' code, signature,
attributes, constexprs), target and environment reuses that text where its options are equal in
every attribute read. A kernel that reads one (`tl.extra.cuda.num_warps()`, Gluon's) makes its own.
Nothing is guessed: equal inputs to the same code, read or not, give the same text. Outside a tune's
compile-ahead, every front half is made as Triton makes it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# The longest wait for another thread's front half of the same source, before making one's own.
WAIT_S = 60.0
_MISSING = object()


@dataclass
class _Front:
    """One front half made during the sharing: the options it was made with, the attributes it read of
    them, and its text (None until made, or when making it failed)."""

    options: Any
    read: frozenset[str] = frozenset()
    text: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def serves(self, options: Any) -> bool:
        """Whether `options` agree with this front's in every attribute it read."""
        if self.text is None:
            return False
        if "__dict__" in self.read:  # read whole: shared only with equal options
            return vars(self.options) == vars(options)
        return all(getattr(self.options, name, _MISSING) == getattr(options, name, _MISSING) for name in self.read)


_lock = threading.Lock()
_active = 0  # tunes compiling ahead now, in any thread
_fronts: dict[tuple[Any, ...], list[_Front]] = {}


@contextlib.contextmanager
def sharing() -> Iterator[None]:
    """Front halves shared between compiles while this lasts (a tune's compile-ahead); forgotten when
    the last such scope of the process ends."""
    global _active
    with _lock:
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if not _active:
                _fronts.clear()


def ir_text(source: Any, target: Any, options: Any, env_vars: dict[str, Any], make: Callable[[Any], str]) -> str:
    """The text of the front half of `source` for `target` and `options`: `make(options)`'s, or, while
    sharing, that of an earlier compile of the same source which read nothing that differs."""
    if not _active or not hasattr(options, "__dict__") or not callable(getattr(source, "hash", None)):
        return make(options)  # outside a compile-ahead, or what this cannot key: made as Triton makes it
    key = (source.hash(), repr(target), tuple(sorted((name, repr(value)) for name, value in env_vars.items())))
    mine = _claim(key, options)
    if isinstance(mine, str):
        return mine
    recording, read = _recording(options)
    try:
        mine.text = make(recording)
        mine.read = frozenset(read)
    finally:
        mine.done.set()
    return mine.text


def _claim(key: tuple[Any, ...], options: Any) -> str | _Front:
    """A text made already for `options`, or this thread's claim to make it (another thread making one
    of the same source is waited for first: it may serve these options too)."""
    while True:
        with _lock:
            made = _fronts.setdefault(key, [])
            for front in made:
                if front.done.is_set() and front.serves(options):
                    return front.text  # type: ignore[return-value]
            pending = next((front for front in made if not front.done.is_set()), None)
            if pending is None:
                mine = _Front(options)
                made.append(mine)
                return mine
        if not pending.done.wait(WAIT_S):  # made alone, and kept for others (the sharing may have ended)
            with _lock:
                mine = _Front(options)
                _fronts.setdefault(key, []).append(mine)
            return mine


def _recording(options: Any) -> tuple[Any, set[str]]:
    """A copy of `options` (of a subclass of its type, equal in every field) that notes each attribute
    read of it, and the set it notes them in."""
    read: set[str] = set()
    base = type(options)

    def __getattribute__(self: Any, name: str) -> Any:  # noqa: N807 - the hook itself
        if name == "__dict__" or not name.startswith("__"):
            read.add(name)
        return base.__getattribute__(self, name)

    recording_type = type(base.__name__, (base,), {"__getattribute__": __getattribute__,
                                                   "__module__": base.__module__, "__qualname__": base.__qualname__})
    copy = object.__new__(recording_type)
    object.__getattribute__(copy, "__dict__").update(object.__getattribute__(options, "__dict__"))
    return copy, read
