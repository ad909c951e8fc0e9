"""A fake compiler for `python -m stress --synthetic`: the whole kcache protocol, without TileLang.

It plugs into `kcache.KernelCache(backend=...)` with the same functions as
`kcache.tilelang.backend`. A "kernel" is a name; compiling it writes random
artifacts of realistic sizes (a ~30 KB .so, a ~6 KB cubin, ~20 KB of host
source); loading it returns the verified bytes. Thousands of store
operations per second, so races and faults are hit far more often than
with real compiles.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcache.keys import ENTRY_FORMAT, canonical_json  # noqa: F401 - canonical_json is part of the backend interface
from kcache.store.fsutil import empty_staging, write_durable

DEVICE_SOURCE, HOST_SOURCE, DEVICE_BINARY, LIBRARY, PARAMS, META = (
    "device.cu", "host.cu", "kernel.cubin", "kernel.so", "params.json", "meta.json")
COMPONENTS = frozenset({DEVICE_SOURCE, HOST_SOURCE, DEVICE_BINARY, LIBRARY, PARAMS, META})
SIZES = {DEVICE_SOURCE: 1_000, HOST_SOURCE: 19_000, DEVICE_BINARY: 6_000, LIBRARY: 28_000, PARAMS: 1_000}
# Seconds one fake compile takes: long enough for herds to form.
COMPILE_SECONDS = float(os.environ.get("KCACHE_SYNTHETIC_COMPILE_S", "0.02"))


@dataclass(frozen=True)
class SyntheticFunc:
    name: str


@dataclass(frozen=True)
class SyntheticKernel:
    name: str
    library_sha: str


class _Resolved:
    canonical = "synthetic"

    class context:  # noqa: N801 - mirrors ResolvedTarget.context.execution_backend.name
        class execution_backend:  # noqa: N801
            name = "synthetic"


class _Compiled:
    def __init__(self, name: str) -> None:
        self.name = name
        self.kernel = None
        self.files = {part: os.urandom(size) for part, size in SIZES.items()}


def kernel_name(func: SyntheticFunc) -> str:
    return func.name


def target_memo_key(target: object) -> str:
    return repr(target)


def normalize_out_idx(out_idx: Any) -> list[int] | None:
    return None if out_idx is None else ([out_idx] if isinstance(out_idx, int) else list(out_idx))


def normalize_flags(flags: Any) -> list[str] | None:
    return None if flags is None else ([flags] if isinstance(flags, str) else list(flags))


def normalize_pass_configs(configs: Any) -> dict[str, Any]:
    return dict(configs or {})


def fast_structural_hash(func: SyntheticFunc) -> int:
    return hash(func.name)


def fast_structural_equal(a: SyntheticFunc, b: SyntheticFunc) -> bool:
    return a.name == b.name


def resolve_target(target: object, execution_backend: str, memo_key: str | None = None) -> _Resolved:
    return _Resolved()


def toolchain_fingerprint(root: Path, persist: bool = True) -> dict[str, object]:
    return {"entry_format": ENTRY_FORMAT, "compiler": "synthetic"}


def capture_context() -> None:
    return None  # a synthetic compile depends on nothing but its name


def context_token() -> tuple[()]:
    return ()


def key_fields(func: SyntheticFunc, resolved: Any, out_idx: Any, pass_configs: Any, flags: Any, toolchain: Any,
               context: Any = None) -> dict:
    return {"kind": "synthetic", "name": func.name, "toolchain": toolchain}


def describe_key_fields(fields: dict) -> dict:
    return dict(fields)


def compile_kernel(func: SyntheticFunc, resolved: Any, out_idx: Any, pass_configs: Any, flags: Any, log_dir: Path,
                   context: Any = None) -> _Compiled:
    time.sleep(COMPILE_SECONDS)  # stands in for the compiler's work, not a synchronization
    compiled = _Compiled(func.name)
    compiled.kernel = SyntheticKernel(func.name, "")
    return compiled


COMPILE_PRELOAD = ("stress.programs.synthetic",)


def compile_entry(func: SyntheticFunc, resolved: Any, out_idx: Any, pass_configs: Any, flags: Any, log_dir: Path, *,
                  pool: Any, out_dir: Path, key: str, toolchain: dict, context: Any = None,
                  described_fields: dict | None = None) -> None:
    pool.run(compile_job, func, str(out_dir), key, toolchain, described_fields, name=func.name)


def compile_job(func: SyntheticFunc, out_dir: str, key: str, toolchain: dict, described_fields: dict | None = None) -> None:
    empty_staging(Path(out_dir))  # as kcache's own compile job: a run again starts clean
    write_entry(Path(out_dir), compile_kernel(func, None, None, None, None, Path(out_dir)), key, _Resolved(), toolchain,
                described_fields)


def write_entry(staging: Path, compiled: _Compiled, key: str, resolved: Any, toolchain: dict,
                described_fields: dict | None = None) -> None:
    for part, data in compiled.files.items():
        write_durable(staging / part, data)
    meta = {"key": key, "kernel": compiled.name, "created": time.time(), "pid": os.getpid()}
    if described_fields is not None:
        meta["key_fields"] = described_fields
    write_durable(staging / META, json.dumps(meta).encode())


def load_kernel(func: SyntheticFunc, entry_dir: Path, files: dict[str, bytes], *rest: Any,
                noexec_mount: Path | None = None) -> SyntheticKernel:
    import hashlib

    return SyntheticKernel(func.name, hashlib.sha256(files[LIBRARY]).hexdigest())
