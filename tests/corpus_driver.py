"""The differential corpus, compiled in one fresh process per mode (tests/test_corpus.py).

    python tests/corpus_driver.py MODE ROOT OUT ARCH [NAME,NAME,...]   (KCACHE_CORPUS_REPEATS=N: see REPEATS)

MODE is `tilelang` (plain TileLang, its caches off: every kernel compiles) or a kcache lane:
`inprocess`, `pool` (the process's own pool), `server` (every compile in the compile service) or
`fork` (every compile in a fork of this process: the test gives it no service to reach). For each
kernel of tests/corpus it writes one JSON line to OUT: sha256 of the device and host sources, the
device binary's machine code (its `.text` sections), and, on a machine with a GPU whose arch is ARCH,
the result of the kernel's own check against torch. kcache's rows also say which lane compiled
(`lane`: jobs the service ran, compiles in forks of this process, warnings of a compile that could
not be sent exactly).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

MODE, ROOT, OUT, ARCH = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
ONLY = set(sys.argv[5].split(",")) if len(sys.argv) > 5 else None  # these kernels only
# Plain TileLang only: compile each kernel this many times, a row each (TileLang's output varies with
# the process's state: tests/test_corpus.py samples it).
REPEATS = int(os.environ.get("KCACHE_CORPUS_REPEATS", "1"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.corpus`
os.environ["KCACHE_DIR"] = str(ROOT)
if MODE != "tilelang":
    os.environ["KCACHE_COMPILE_ISOLATION"] = {"fork": "server"}.get(MODE, MODE)

import tilelang  # noqa: E402
from tvm.target import Target  # noqa: E402

from tests.corpus import CorpusKernel, all_kernels  # noqa: E402
from tests.machine_code import binary_of, capture_tilelang_binaries, text_sections  # noqa: E402

TARGET = {"kind": "cuda", "arch": ARCH}


def gpu_here() -> bool:
    import torch

    if not torch.cuda.is_available():
        return False
    major, minor = torch.cuda.get_device_capability()
    return ARCH.startswith(f"sm_{major}{minor}")


class Warnings(logging.Handler):
    """kcache's warnings in this process, to tell a compile that fell back from its lane."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


_binaries: list[tuple[str, bytes]] = []  # plain TileLang's nvcc runs: (source, binary) (machine_code)


def compile_plain(entry: CorpusKernel) -> tuple[Any, bytes | None]:
    _binaries.clear()
    with Target(TARGET):
        if entry.style == "prim_func":
            kernel = tilelang.compile(entry.build(), out_idx=entry.out_idx, target=TARGET,
                                      pass_configs=entry.pass_configs, execution_backend="tvm_ffi")
        else:
            kernel = entry.build()
    return kernel, binary_of(_binaries, kernel)


def compile_kcache(entry: CorpusKernel, cache: Any) -> tuple[Any, bytes | None]:
    """The kernel through kcache, and the device binary of the entry it published."""
    kernels = ROOT / "kernels"
    with Target(TARGET):
        if entry.style == "prim_func":
            kernel = cache.get_or_compile(entry.build(), TARGET, out_idx=entry.out_idx, pass_configs=entry.pass_configs)
        else:
            kernel = entry.build()  # `@tilelang.jit` and `@tilelang.autotune` through kcache.install()
    if entry.style == "prim_func":
        from kcache.cache.request import KernelRequest

        backend = cache._tilelang()
        key = KernelRequest.build(backend, entry.build(), TARGET, entry.out_idx, entry.pass_configs, None, "tvm_ffi",
                                  backend.target_memo_key(TARGET), cache._toolchain_fingerprint(backend)).key
        binary = kernels / key / "kernel.cubin"
        return kernel, (binary.read_bytes() if binary.exists() else None)
    # The jit and autotune styles: the entry whose device source is the kernel's (an autotuned kernel
    # is the entry of its best config, compiled before it, so it may be no new entry).
    source = kernel.get_kernel_source().encode()
    for key in sorted(os.listdir(kernels)) if kernels.exists() else []:
        if (kernels / key / "device.cu").read_bytes() == source:
            return kernel, (kernels / key / "kernel.cubin").read_bytes()
    return kernel, None


def describe(kernel: Any, binary: bytes | None) -> dict[str, Any]:
    text, _sections = text_sections(binary) if binary is not None else (None, None)
    return {
        "device_source": hashlib.sha256(kernel.get_kernel_source().encode()).hexdigest(),
        "host_source": hashlib.sha256((kernel.get_host_source() or "").encode()).hexdigest(),
        "machine_code": text,
    }


def lane_counts(cache: Any, warnings: Warnings) -> dict[str, int]:
    from kcache.compile.service import connection as service_connection
    from kcache.compile.service import shared_pools as service_pools

    jobs = 0
    for pool in service_pools._shared.values():
        try:
            jobs += int(service_connection.request(pool.name, ("status",))["jobs"])
        except (OSError, EOFError):
            pass
    return {"service_jobs": jobs,
            "caller_forks": sum(pool.caller_forks for pool in service_pools._shared.values()),
            "unserialized": sum("cannot be sent to a compile worker exactly" in m for m in warnings.messages),
            "compiles": cache.stats()["compiles"]}


def main() -> None:
    on_gpu = gpu_here()
    rows = []
    warnings = Warnings()
    logging.getLogger("kcache").addHandler(warnings)
    cache = None
    if MODE == "tilelang":
        tilelang.disable_cache()
        capture_tilelang_binaries(_binaries)
    else:
        import kcache

        kcache.install()  # the jit and autotune styles go through kcache
        cache = kcache.default_cache()
    # The autotuned entry last: its tuning (on a GPU) compiles its configs, which are prim_func
    # entries of their own, and each of those must be a compile of its own here.
    for entry in sorted(all_kernels(), key=lambda k: k.style == "autotune"):
        if ONLY is not None and entry.name not in ONLY:
            continue
        row: dict[str, Any] = {"kernel": entry.name, "style": entry.style, "features": list(entry.features)}
        if entry.style == "autotune" and not on_gpu:
            row["not_run"] = "autotuning measures on a GPU: its configs compile as prim_func entries here"
            rows.append(row)
            continue
        started = time.perf_counter()
        try:
            kernel, binary = compile_plain(entry) if cache is None else compile_kcache(entry, cache)
            row.update(describe(kernel, binary))
            for _ in range(REPEATS - 1 if cache is None else 0):  # compiled again in this process's later states
                rows.append({**row, **describe(*compile_plain(entry))})
        except Exception as err:  # noqa: BLE001 - the row says what failed; the test names it
            row["error"] = f"{type(err).__name__}: {err}"[:4000]
            row["traceback"] = traceback.format_exc()[-4000:]
            rows.append(row)
            continue
        row["seconds"] = round(time.perf_counter() - started, 2)
        if on_gpu:
            try:
                entry.gpu_check(kernel)
                row["gpu_check"] = "ok"
            except Exception as err:  # noqa: BLE001
                row["gpu_check"] = f"{type(err).__name__}: {err}"[:2000]
        rows.append(row)
        print(f"corpus {MODE}: {entry.name} {row['seconds']} s", file=sys.stderr, flush=True)
    if cache is not None:
        rows.append({"lane": lane_counts(cache, warnings), "warnings": warnings.messages[:50]})
    OUT.write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main()
