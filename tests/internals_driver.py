"""One compile with one TileLang internal hidden from kcache (tests/test_tilelang_internals.py).

    python tests/internals_driver.py HIDDEN ROOT OUT

HIDDEN is `plain` (plain TileLang, kcache never imported: the reference), `none` (kcache installed,
nothing hidden) or "MODULE:NAME", an entry of kcache/tilelang/internals.py. That name is hidden from
kcache as a later TileLang that renamed it would be: the module is replaced in sys.modules (and as its
package's attribute) by a copy that gives the name to TileLang's own code (which imports lazily too)
but not to kcache's; for an "object.attribute", kcache gets a subclass (an object of one) on which the
attribute reads as missing. The driver checks that kcache no longer finds the name, then
installs kcache, compiles the fidelity table's kernel through `tilelang.compile` (TileLang's own
cache off), and writes one JSON line to OUT: the device and host sources' sha256, the device binary's
machine code, whether kcache compiled it, the warnings kcache logged, and what `get_or_compile` did.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import sys
import types
from pathlib import Path
from typing import Any

HIDDEN, ROOT, OUT = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
os.environ["KCACHE_DIR"] = str(ROOT)

import tilelang  # noqa: E402
import tilelang.language as T  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.machine_code import binary_of, capture_tilelang_binaries, text_sections  # noqa: E402

N = 4096
TARGET = {"kind": "cuda", "arch": "sm_90a"}


@T.prim_func
def internals_add(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32"), C: T.Tensor((N,), "float32")):
    with T.Kernel(N // 256, threads=256) as bx:
        for i in T.Parallel(256):
            C[bx * 256 + i] = A[bx * 256 + i] * 2.0 + B[bx * 256 + i]


class _Missing:
    """A class attribute that reads as absent (hasattr is False), on the subclass that hides it."""

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        raise AttributeError("hidden by the test")


def _asked_by_kcache() -> bool:
    """Whether the code reading a module attribute now is kcache's (past the import machinery)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("importlib"):
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__", "").startswith("kcache")


def hide(module_name: str, name: str) -> None:
    """Hide `name` from kcache's code: TileLang's own code (which imports lazily too) keeps it, as a
    TileLang that renamed it would keep calling its own."""
    real = importlib.import_module(module_name)
    first, _, attribute = name.partition(".")
    value = real.__dict__[first]
    hidden: Any = None  # what kcache gets: nothing, or a subclass (an object of one) without `attribute`
    if attribute:
        cls = value if isinstance(value, type) else type(value)
        hidden = type(cls.__name__, (cls,), {attribute: _Missing()})
        if not isinstance(value, type):
            copy = object.__new__(hidden)
            copy.__dict__.update(value.__dict__)
            hidden = copy
    proxy = types.ModuleType(real.__name__)
    proxy.__dict__.update({key: item for key, item in real.__dict__.items() if key != first})

    def __getattr__(asked: str) -> Any:
        if asked != first:
            raise AttributeError(f"module {module_name!r} has no attribute {asked!r}")
        if not _asked_by_kcache():
            return value
        if hidden is None:
            raise AttributeError(f"module {module_name!r} has no attribute {asked!r} (hidden by the test)")
        return hidden

    proxy.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[module_name] = proxy
    parent, _, child = module_name.rpartition(".")
    if parent and getattr(sys.modules[parent], child, None) is real:  # `tilelang.jit` is the decorator there
        setattr(sys.modules[parent], child, proxy)
    # The fault fired: kcache no longer finds the name, by import or by attribute; TileLang still does.
    from kcache.tilelang.internals import lookup

    assert lookup(module_name, name) is None, f"{module_name}.{name} is still there for kcache"
    found: Any = importlib.import_module(module_name)
    for part in name.split("."):
        found = getattr(found, part)
    assert found is not None


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def describe(kernel: Any, binary: bytes | None) -> dict[str, Any]:
    return {
        "device_source": hashlib.sha256(kernel.get_kernel_source().encode()).hexdigest(),
        "host_source": hashlib.sha256((kernel.get_host_source() or "").encode()).hexdigest(),
        "machine_code": text_sections(binary)[0] if binary is not None else None,
    }


def main() -> None:
    tilelang.disable_cache()  # every run compiles: plain TileLang's as much as kcache's
    captured: list[tuple[str, bytes]] = []
    capture_tilelang_binaries(captured)  # kcache's own compile hook replaces it where kcache compiles
    if HIDDEN == "plain":
        kernel = tilelang.compile(internals_add, out_idx=[2], target=TARGET, execution_backend="tvm_ffi")
        OUT.write_text(json.dumps(describe(kernel, binary_of(captured, kernel))) + "\n")
        return
    if HIDDEN != "none":
        hide(*HIDDEN.split(":"))
    collected = Collect()
    logging.getLogger("kcache").addHandler(collected)
    import kcache
    from kcache.store.components import DEVICE_BINARY

    kcache.install()
    kcache.install()  # a second call warns no more
    cache = kcache.default_cache()
    kernel = tilelang.compile(internals_add, out_idx=[2], target=TARGET, execution_backend="tvm_ffi")
    entries = sorted((ROOT / "kernels").glob(f"*/{DEVICE_BINARY}")) if (ROOT / "kernels").is_dir() else []
    binary = entries[0].read_bytes() if entries else binary_of(captured, kernel)
    try:
        cache.get_or_compile(internals_add, TARGET, out_idx=[2])
        direct = "served"
    except kcache.TileLangUnsupported as err:
        direct = str(err)
    row = describe(kernel, binary)
    row.update(compiles=cache.stats()["compiles"], entries=len(entries), warnings=collected.lines,
               installed=kcache.is_installed(), get_or_compile=direct)
    if HIDDEN.endswith(":lower_with_context"):  # the compile workers' template's warm-up, run here
        from kcache.tilelang import warm_up

        row["warm_up_lowered"] = warm_up.lower_once() is not None
    OUT.write_text(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
