"""The TileLang backend: the functions `KernelCache` calls, in one namespace.

TileLang is imported when this module is, so `import kcache` stays cheap and
only a cache that actually compiles or loads pays for it. Everything here is
on the hit path except compiling and saving (`kcache.tilelang.compiler`),
which load only on a miss. The stress harness's synthetic backend
(stress/programs/synthetic.py) provides the same names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tilelang  # noqa: F401 - puts TileLang's tvm on the path

from kcache.keys import canonical_json  # noqa: F401 - part of the backend interface
from kcache.store import layout
from kcache.store.components import COMPONENTS  # noqa: F401 - part of the backend interface
from kcache.tilelang.callbacks import watch_registrations
from kcache.tilelang.context import capture as capture_context  # noqa: F401
from kcache.tilelang.context import token as context_token  # noqa: F401
from kcache.tilelang.fingerprint import toolchain_fingerprint  # noqa: F401
from kcache.tilelang.identity import (  # noqa: F401
    describe_key_fields,
    fast_structural_equal,
    fast_structural_hash,
    kernel_name,
    key_fields,
    normalize_flags,
    normalize_out_idx,
    normalize_pass_configs,
)
from kcache.tilelang.loader import load_kernel  # noqa: F401
from kcache.tilelang.target import ResolvedTarget, fast_backend_context, resolve_target, target_memo_key  # noqa: F401

# Callbacks registered from now on are seen with their Python functions (kcache.tilelang.callbacks).
watch_registrations()

# What a compile worker imports before its first job.
COMPILE_PRELOAD = ("tilelang", "kcache.tilelang.compiler")


def compile_kernel(*args: Any, **kwargs: Any) -> Any:
    from kcache.tilelang import compiler  # a miss only

    return compiler.compile_kernel(*args, **kwargs)


def write_entry(*args: Any, **kwargs: Any) -> None:
    from kcache.tilelang import compiler  # a miss only

    compiler.write_entry(*args, **kwargs)


def compile_entry(*args: Any, **kwargs: Any) -> None:
    """Compile into the staging directory `out_dir`, in the lane the pool gives (`compile_lanes`)."""
    from kcache.tilelang import compile_lanes  # a miss only

    compile_lanes.compile_entry(*args, **kwargs)


def log_dir(root: Path) -> Path:
    return root / layout.LOGS
