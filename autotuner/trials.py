"""The compile phase of a tune: every config compiled through kcache at once, each failure classified.

A failing config never ends a tune: it becomes a `Trial` with its class and
message. Deterministic failures (`compile_error`, `out_of_resources`) are
remembered as negative entries under `<root>/autotuner/.negative/`, so a
re-tune skips them without compiling; transient ones (`timeout`) get one
more try.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcache import CompileError, CompilerCrashed, CompileTimeout, KernelCache
from kcache.keys import canonical_json
from kcache.store.fsutil import ensure_dir, write_durable

OK = "ok"
COMPILE_ERROR = "compile_error"
COMPILER_CRASH = "compiler_crash"
TIMEOUT = "timeout"
OUT_OF_RESOURCES = "out_of_resources"
LAUNCH_ERROR = "launch_error"
WRONG_RESULT = "wrong_result"
DETERMINISTIC = frozenset({COMPILE_ERROR, OUT_OF_RESOURCES})
TRANSIENT = frozenset({TIMEOUT, LAUNCH_ERROR})
NEGATIVE = ".negative"
# Errors of the interpreter, not of a config: a factory that raises one is not remembered as failing.
INTERPRETER_ERRORS = (SystemError, MemoryError, RecursionError)
# Kernel factories run one at a time (their compiles run in parallel). TileLang's `T.prim_func`
# parses Python's AST, and CPython 3.11 before 3.11.8 raises "SystemError: AST constructor recursion
# depth mismatch" when two threads build ASTs at once (python/cpython#106905): a config that
# compiles was once recorded as a compile error that way.
_FACTORY_LOCK = threading.Lock()

# How compilers and drivers say a config asks for more than the device has.
_OUT_OF_RESOURCES = re.compile(
    r"out of resource|hardware limit|too many resources requested|uses too much shared data|"
    r"exceeds? (?:the )?(?:maximum|limit)|shared memory .*(?:exceed|too large)|too many (?:threads|registers)|"
    r"failed to set the allowed dynamic shared memory size",
    re.IGNORECASE,
)
# TVM's runtime, when the device refuses a kernel's dynamic shared memory at launch (TileLang 0.1.15
# compiles such a kernel without complaint).
_DYNAMIC_SHARED_REFUSED = re.compile(r"failed to set the allowed dynamic shared memory size to (\d+)", re.IGNORECASE)


@dataclass
class Trial:
    """One config's compile: the kernel, or why not."""

    config: dict[str, Any]
    status: str
    message: str = ""
    kernel: Any = None
    func: Any = None
    attempts: int = 0
    remembered: bool = False  # skipped: a negative entry said it fails


def looks_out_of_resources(message: str) -> bool:
    return _OUT_OF_RESOURCES.search(message) is not None


def launch_failure_message(message: str, shared_memory_limit: int | None) -> str:
    """A launch failure restated in the driver's words where it is a shared-memory refusal:
    "out of resource: shared memory, Required: 393216, Hardware limit: 232448"."""
    refused = _DYNAMIC_SHARED_REFUSED.search(message)
    if refused is None:
        return message
    limit = f"{shared_memory_limit}" if shared_memory_limit else "unknown"
    return f"out of resource: shared memory, Required: {refused.group(1)}, Hardware limit: {limit} ({message.strip()})"


def classify(error: BaseException) -> str:
    """The failure class of a compile error."""
    if isinstance(error, CompilerCrashed):
        return COMPILER_CRASH
    if isinstance(error, CompileTimeout):
        return TIMEOUT
    if _OUT_OF_RESOURCES.search(str(error)):
        return OUT_OF_RESOURCES
    return COMPILE_ERROR


def launch_threads(func: Any) -> int | None:
    """Threads per block a TileLang PrimFunc asks for (its `tl.launch_threads`), if it says."""
    from tvm import tirx

    found: list[int] = []

    def visit(node: Any) -> None:
        annotations = getattr(node, "annotations", None)
        if annotations is not None and "tl.launch_threads" in annotations:
            count = 1
            for extent in annotations["tl.launch_threads"]:
                count *= int(extent)
            found.append(count)

    tirx.stmt_functor.post_order_visit(func.body, visit)
    return max(found) if found else None


def check_resources(func: Any, target: Any) -> str | None:
    """The message of an out-of-resources config TileLang 0.1.15 would compile anyway, or None.

    TileLang compiles a kernel of 2048 threads per block for a target whose
    limit is 1024; it fails only at launch. The target says its limit, so the
    config is refused before the compile, in the driver's words.
    """
    limit = target.get("max_num_threads") if isinstance(target, dict) else None
    if limit is None and isinstance(target, dict) and target.get("kind") == "cuda":
        limit = 1024  # every CUDA device since compute capability 2.0
    if limit is None:  # a target that states no limit (a string one, say): nothing to check against
        return None
    threads = launch_threads(func)
    if threads is not None and threads > int(limit):
        return f"out of resource: threads, Required: {threads}, Hardware limit: {limit}"
    return None


class NegativeEntries:
    """Deterministic failures of configs, remembered per (tune identity, config)."""

    def __init__(self, root: Path, tune_identity: str, *, writable: bool = True) -> None:
        self.directory = Path(root) / "autotuner" / NEGATIVE
        self.identity = tune_identity
        self.writable = writable  # False for a read-only cache: learn nothing on disk

    def _path(self, config: dict[str, Any]) -> Path:
        digest = hashlib.sha256(f"{self.identity}\0{canonical_json(config)}".encode()).hexdigest()
        return self.directory / f"{digest}.json"

    def get(self, config: dict[str, Any]) -> dict[str, str] | None:
        try:
            value = json.loads(self._path(config).read_bytes())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) and value.get("status") in DETERMINISTIC else None

    def remember(self, config: dict[str, Any], status: str, message: str) -> None:
        if not self.writable:
            return
        path = self._path(config)
        temporary = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            ensure_dir(self.directory)
            write_durable(temporary, json.dumps({"config": config, "status": status, "message": message}).encode())
            os.replace(temporary, path)
        except OSError:
            return  # a cache we cannot write still tunes; it just re-learns the failure next time


def compile_configs(
    kernel_factory: Callable[..., Any],
    configs: Sequence[dict[str, Any]],
    *,
    target: Any,
    cache: KernelCache,
    tune_identity: str,
    out_idx: Any = None,
    retries: int = 1,
    progress: Callable[[Trial], None] | None = None,
) -> list[Trial]:
    """Compile every config at once (up to the cache's pool size), in config order of the result."""
    negative = NegativeEntries(cache.root, tune_identity, writable=not cache.readonly)

    def attempt(config: dict[str, Any]) -> Trial:
        known = negative.get(config)
        if known is not None:
            return Trial(dict(config), known["status"], known.get("message", ""), remembered=True)
        try:
            with _FACTORY_LOCK:
                func = kernel_factory(**config)
        except INTERPRETER_ERRORS as err:  # not the config's fault: a failure of this run, not remembered
            return Trial(dict(config), COMPILE_ERROR, f"{type(err).__name__}: {err}")
        except Exception as err:  # a config the factory itself rejects is a compile error of that config
            return _failed(negative, config, COMPILE_ERROR, f"{type(err).__name__}: {err}", 0)
        too_big = check_resources(func, target)
        if too_big:
            return _failed(negative, config, OUT_OF_RESOURCES, too_big, 0)
        trial = Trial(dict(config), OK, func=func)
        for attempt_number in range(1, retries + 2):
            trial.attempts = attempt_number
            try:
                trial.kernel = cache.get_or_compile(func, target, out_idx=out_idx)
                trial.status, trial.message = OK, ""
                return trial
            except (CompileError, CompilerCrashed, CompileTimeout) as err:
                trial.status, trial.message = classify(err), str(err)
            if trial.status not in TRANSIENT:
                break
        if trial.status in DETERMINISTIC:
            negative.remember(config, trial.status, trial.message)
        return trial

    def run(config: dict[str, Any]) -> Trial:
        trial = attempt(config)
        if progress is not None:
            progress(trial)
        return trial

    workers = max(1, min(len(configs), cache.compile_pool.max_workers))
    with ThreadPoolExecutor(workers, thread_name_prefix="kcache-tune") as threads:
        return list(threads.map(run, list(configs)))


def _failed(negative: NegativeEntries, config: dict[str, Any], status: str, message: str, attempts: int) -> Trial:
    negative.remember(config, status, message)
    return Trial(dict(config), status, message, attempts=attempts)


def summary_table(trials: Iterable[Trial], latencies: dict[int, float] | None = None) -> str:
    """One line per config: its outcome and latency, or why it failed."""
    rows = []
    for index, trial in enumerate(trials):
        latency = (latencies or {}).get(index)
        why = trial.message.splitlines()[0][:100] if trial.message else ""
        rows.append((canonical_json(trial.config), trial.status + (" (remembered)" if trial.remembered else ""),
                     f"{latency:.4f} ms" if latency is not None else "-", why))
    header = ("config", "outcome", "latency", "why")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(4)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows])
