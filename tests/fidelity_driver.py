"""The differential fidelity table, run in one fresh process per mode (tests/test_fidelity.py).

    python tests/fidelity_driver.py MODE ROOT OUT [ARCH]

MODE is `tilelang` (plain TileLang, its cache off, so every step compiles what TileLang compiles
in that context), `inprocess`, `pool`, `server` or `fork` (kcache in that isolation mode, on the cache ROOT;
`fork`: server mode compiling in forks of the caller), or one of
the special rows `opaque` and `timeout`. Every step of the table sets up a compile context (a Target
scope, the environment, a callback), compiles the same PrimFunc, and writes one JSON line to OUT:
the resolved target, sha256 of the device and host sources, the device binary's machine code
(its `.text` sections: the rest of a cubin holds the compile's temporary path), its section names,
and for kcache the key and whether the step compiled.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MODE, ROOT, OUT = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
ARCH = sys.argv[4] if len(sys.argv) > 4 else "sm_90a"  # the GPU machine passes its own
OTHER_ARCH = "sm_80"
os.environ["KCACHE_DIR"] = str(ROOT)
if MODE in ("inprocess", "pool", "server", "fork", "opaque", "timeout"):
    # `fork`: server mode where every compile runs in a fork of this process (the test gives it no
    # service to reach); `server`: every compile in the service (KCACHE_CALLER_FORK=0 there).
    os.environ["KCACHE_COMPILE_ISOLATION"] = {"inprocess": "inprocess", "server": "server", "fork": "server"}.get(MODE, "pool")
    os.environ["KCACHE_COMPILE_WORKERS"] = "1"

import tilelang  # noqa: E402
import tilelang.language as T  # noqa: E402
import tvm_ffi  # noqa: E402
from tilelang.engine import callback as tl_callback  # noqa: E402
from tvm.target import Target  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.machine_code import binary_of, capture_tilelang_binaries, text_sections  # noqa: E402

POSTPROC = "tilelang_callback_cuda_postproc"
HOST_POSTPROC = "tilelang_callback_c_host_postproc"


def make_add(n: int = 4096) -> Any:
    @T.prim_func
    def fidelity_add(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
        with T.Kernel(n // 256, threads=256) as bx:
            for i in T.Parallel(256):
                C[bx * 256 + i] = A[bx * 256 + i] * 2.0 + B[bx * 256 + i]

    return fidelity_add


FUNC = make_add()


def target(arch: str) -> dict[str, str]:
    return {"kind": "cuda", "arch": arch}


# ---------------------------------------------------------------- context set-ups


@contextlib.contextmanager
def scope(arch: str) -> Iterator[None]:
    with Target(target(arch)):
        yield


@contextlib.contextmanager
def env(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


MARK = "fidelity-mark-a"
# Calls of the table's callbacks in this process (the caller's), with the pid each ran in: plain
# TileLang calls a callback once per compile, in the compiling process, and never on a hit.
CALLS: list[int] = []


def mark_source(code: str, target: Any) -> str:
    CALLS.append(os.getpid())
    return code + f"\n// {MARK}\n"


@contextlib.contextmanager
def registered(name: str, function: Callable[..., Any]) -> Iterator[None]:
    tvm_ffi.register_global_func(name, function, override=True)
    try:
        yield
    finally:
        tvm_ffi.remove_global_func(name)


def postproc_a() -> Any:
    return registered(POSTPROC, mark_source)


def postproc_b() -> Any:
    def mark_b(code: str, target: Any) -> str:  # another callback: another source, another kernel
        CALLS.append(os.getpid())
        return code + "\n// fidelity-mark-b\n"

    return registered(POSTPROC, mark_b)


def postproc_c_constant() -> Any:
    """The same function object as postproc_a, but the module constant it reads has changed."""
    global MARK

    @contextlib.contextmanager
    def changed() -> Iterator[None]:
        global MARK
        MARK = "fidelity-mark-c"
        try:
            with registered(POSTPROC, lambda code, t: mark_source(code, t)):
                yield
        finally:
            MARK = "fidelity-mark-a"

    return changed()


def host_postproc() -> Any:
    def mark_host(code: str, target: Any) -> str:
        CALLS.append(os.getpid())
        return code + "\n// fidelity-host-mark\n"

    return registered(HOST_POSTPROC, mark_host)


# Each step: (name, the context it sets up, the target argument). Both orders of two scopes for
# "auto" and for None; a later step returning to an earlier context must give its kernel again.
STEPS: list[tuple[str, Callable[[], Any], Any]] = [
    ("baseline", contextlib.nullcontext, target(ARCH)),
    ("auto_in_other_scope", lambda: scope(OTHER_ARCH), "auto"),
    ("auto_in_own_scope", lambda: scope(ARCH), "auto"),
    ("auto_in_other_scope_again", lambda: scope(OTHER_ARCH), "auto"),
    ("none_in_own_scope", lambda: scope(ARCH), None),
    ("none_in_other_scope", lambda: scope(OTHER_ARCH), None),
    ("explicit_target_ignores_scope", lambda: scope(OTHER_ARCH), target(ARCH)),
    ("default_target_env", lambda: env(TILELANG_DEFAULT_TARGET=json.dumps(target(OTHER_ARCH))), None),
    ("default_target_env_beats_scope",
     lambda: _both(env(TILELANG_DEFAULT_TARGET=json.dumps(target(OTHER_ARCH))), scope(ARCH)), None),
    ("postproc_a", postproc_a, target(ARCH)),
    ("postproc_b", postproc_b, target(ARCH)),
    ("postproc_a_again", postproc_a, target(ARCH)),
    ("postproc_global_changed", postproc_c_constant, target(ARCH)),
    ("host_postproc", host_postproc, target(ARCH)),
    ("nvcc_append_flags", lambda: env(NVCC_APPEND_FLAGS="-G"), target(ARCH)),
    ("nvcc_prepend_flags", lambda: env(NVCC_PREPEND_FLAGS="-G"), target(ARCH)),
    ("layout_cost_model_env", lambda: env(TILELANG_LAYOUT_COST_MODEL="io-aware"), target(ARCH)),
    ("unrelated_env", lambda: env(KCACHE_FIDELITY_UNRELATED="1", TILELANG_PRINT_ON_COMPILATION="0",
                                  TILELANG_CACHE_DIR=str(ROOT / "tilelang-cache-elsewhere")), target(ARCH)),
    ("baseline_again", contextlib.nullcontext, target(ARCH)),
]


@contextlib.contextmanager
def _both(first: Any, second: Any) -> Iterator[None]:
    with first, second:
        yield


# ---------------------------------------------------------------- what a step produced


_binaries: list[tuple[str, bytes]] = []  # plain TileLang's nvcc runs: (source, binary) (machine_code)


def run_on_gpu(kernel: Any) -> str | None:
    """On the GPU machine, for a kernel of the device's own arch: sha256 of C for fixed A and B, after
    checking C == 2A + B. None where it cannot run here."""
    import torch

    if not torch.cuda.is_available() or f'"arch":"{ARCH}"' not in str(kernel.target).replace(" ", ""):
        return None
    generator = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(4096, device="cuda", generator=generator)
    b = torch.randn(4096, device="cuda", generator=generator)
    c = kernel(a, b)
    torch.cuda.synchronize()
    assert torch.equal(c, a * 2.0 + b), "the kernel computed something else"
    return hashlib.sha256(c.cpu().numpy().tobytes()).hexdigest()


def describe(kernel: Any, binary: bytes | None) -> dict[str, Any]:
    text, sections = text_sections(binary) if binary is not None else (None, None)
    return {
        "result": run_on_gpu(kernel),
        "target": str(kernel.target),
        "device_source": hashlib.sha256(kernel.get_kernel_source().encode()).hexdigest(),
        "host_source": hashlib.sha256((kernel.get_host_source() or "").encode()).hexdigest(),
        "marks": sorted(m for m in ("fidelity-mark-a", "fidelity-mark-b", "fidelity-mark-c")
                        if m in kernel.get_kernel_source()),
        "host_mark": "fidelity-host-mark" in (kernel.get_host_source() or ""),
        "machine_code": text,
        "sections": sections,
    }


def run_tilelang(step: str, make_context: Callable[[], Any], target_arg: Any) -> dict[str, Any]:
    _binaries.clear()
    calls = len(CALLS)
    with make_context():
        kernel = tilelang.compile(FUNC, out_idx=[2], target=target_arg, execution_backend="tvm_ffi")
    return {**describe(kernel, binary_of(_binaries, kernel)), **callback_calls(calls)}


def callback_calls(before: int) -> dict[str, Any]:
    """The table's callbacks called during a step: how many times, and whether all in this process."""
    during = CALLS[before:]
    return {"callback_calls": len(during), "callbacks_in_caller": all(pid == os.getpid() for pid in during)}


def run_kcache(step: str, make_context: Callable[[], Any], target_arg: Any) -> dict[str, Any]:
    import kcache
    from kcache.cache.request import KernelRequest
    from kcache.store.components import DEVICE_BINARY

    cache = kcache.default_cache()
    backend = cache._tilelang()
    before = cache.stats()
    calls = len(CALLS)
    with make_context():
        kernel = cache.get_or_compile(FUNC, target_arg, out_idx=[2])
        request = KernelRequest.build(backend, FUNC, target_arg, [2], None, None, "tvm_ffi",
                                      backend.target_memo_key(target_arg), cache._toolchain_fingerprint(backend))
    after = cache.stats()
    entry = cache.root / "kernels" / request.key / DEVICE_BINARY
    row = describe(kernel, entry.read_bytes() if entry.exists() else None)
    row.update(callback_calls(calls))
    row.update(key=request.key, compiled=after["compiles"] - before["compiles"],
               disk_hit=after["disk_hits"] - before["disk_hits"], memory_hit=after["memory_hits"] - before["memory_hits"])
    return row


def main() -> None:
    rows = []
    if MODE == "tilelang":
        tilelang.disable_cache()  # the baseline compiles every step in its context
        capture_tilelang_binaries(_binaries)
        for name, make_context, target_arg in STEPS:
            rows.append({"step": name, **run_tilelang(name, make_context, target_arg)})
    elif MODE in ("inprocess", "pool", "server", "fork"):
        import kcache  # noqa: F401 - before any callback is registered, as the docs ask

        for name, make_context, target_arg in STEPS:
            rows.append({"step": name, **run_kcache(name, make_context, target_arg)})
        from kcache.compile.service import shared_pools as service_pools

        forks = sum(pool.caller_forks for pool in service_pools._shared.values())
        print(f"fidelity driver: {forks} compile(s) in a fork of this process", file=sys.stderr)
    elif MODE == "opaque":
        rows += opaque_rows()
    elif MODE == "timeout":
        rows += timeout_rows()
    OUT.write_text("".join(json.dumps(row) + "\n" for row in rows))


def opaque_rows() -> list[dict[str, Any]]:
    """Callbacks kcache cannot carry: one registered before kcache was imported, and a closure over a
    lock (unpicklable). Each compiles in the caller, with its edit, and is not stored on disk."""
    import threading

    tl_callback.register_cuda_postproc(mark_source)  # before kcache watches
    import kcache

    cache = kcache.default_cache()
    rows = [{"step": "registered_before_kcache", **describe(cache.get_or_compile(FUNC, target(ARCH), out_idx=[2]), None),
             "entries": _entries(cache.root), "compiles": cache.stats()["compiles"]}]
    guard = threading.Lock()

    def locked_mark(code: str, target: Any) -> str:
        with guard:
            return code + "\n// fidelity-mark-b\n"

    tl_callback.register_cuda_postproc(locked_mark)
    rows.append({"step": "unpicklable_closure", **describe(cache.get_or_compile(FUNC, target(ARCH), out_idx=[2]), None),
                 "entries": _entries(cache.root), "compiles": cache.stats()["compiles"]})
    tvm_ffi.remove_global_func(POSTPROC)
    return rows


def _entries(root: Path) -> int:
    try:
        return len(os.listdir(root / "kernels"))
    except FileNotFoundError:
        return 0


def timeout_rows() -> list[dict[str, Any]]:
    """TILELANG_COMPILE_TIMEOUT_SECONDS set after the process's first compile, with an nvcc that
    never returns (the test's CUDA home hangs while its marker file exists)."""
    import kcache

    cache = kcache.default_cache()
    cache.get_or_compile(FUNC, target(ARCH), out_idx=[2])  # starts the worker, with no timeout set
    Path(os.environ["FIDELITY_NVCC_HANG_MARKER"]).touch()
    os.environ["TILELANG_COMPILE_TIMEOUT_SECONDS"] = "3"
    started = time.monotonic()
    try:
        cache.get_or_compile(make_add(8192), target(ARCH), out_idx=[2])
        outcome = {"error": None}
    except Exception as err:  # what the caller sees: the type and message
        outcome = {"error": type(err).__name__, "runtime_error": isinstance(err, RuntimeError),
                   "message": str(err)[:2000], "command_line": "Command:" in str(err)}
    return [{"step": "timeout", "seconds": time.monotonic() - started, **outcome}]


if __name__ == "__main__":
    main()
