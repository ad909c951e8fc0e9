"""Triton's compiles isolated from the caller: a compiler's abort kills a worker, never the program.

The hook is the cache manager's `get_group`, the one call every Triton compile makes before it
compiles, whichever way it was reached (`triton.compile`, a JIT launch or warmup, `@triton.autotune`,
Inductor, Helion) and whatever reference to `compile` the program holds. On a miss, once the caller
holds the key's lock (and the cluster's lease, kcache.triton.manager), the compile is split in two:
- the front half, in the caller (kcache.triton.frontend): the user's kernel to Triton's IR, which runs
  the user's Python and needs the caller's objects;
- the back half, in a clean worker of the compile service (kcache.triton.stages): Triton's passes and
  ptxas, where a compiler crashes. The worker is a fresh fork of a template that imported Triton
  before any thread existed: it inherits none of the caller's threads, locks, runtimes (an S3
  client's) or signal handlers. Until the service is warm, the back half runs in a fork of the caller
  where that is provably safe (no other Python thread: `caller_fork.unsafe_reason`), as TileLang's
  compiles do; else it waits for the service.
The caller publishes the group, uploads it, and reads it back as a hit; Triton's `compile` goes on
down its hit path.

Where the back half cannot leave the caller (`frontend.needs_caller`: a stages hook of the program's,
say), it runs in a fork of the caller when no other thread runs, else in the caller itself, with one
warning: a fork of a threaded program can hang on a lock another thread held (docs/design/triton.md).

- A compiler's own crash (SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE): `TritonCompilerCrashed` (a
  `kcache.CompilerCrashed`, and a Triton `PTXASError`, which `@triton.autotune` skips as a config it
  cannot build), remembered (kcache.triton.crashes). Any other death (SIGKILL, SIGTERM: an OOM killer
  or an admin) raises the same, but is not remembered. Past KCACHE_COMPILE_TIMEOUT:
  `TritonCompileTimeout`, not remembered.
- A Python error in either half (a `tl.static_assert`, ptxas refusing a config): `CompileFailed`;
  the caller lets go of the key's lock and compiles in-process, down the path it would have taken
  without isolation, and so raises exactly what plain Triton raises (kcache.triton.failed_compiles).
- KCACHE_TRITON_ISOLATION=off, Triton's override and dump modes, one of Helion's precompile children
  (a process of its own already), or a caller other than Triton's `compile`: no isolation.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
import time
from types import FrameType
from typing import Any

from kcache import setting_values as values
from kcache.triton.compile_record import config_of

log = logging.getLogger("kcache")


class CompileFailed(Exception):
    """A Python error in a compile's front or back half: Triton's own compile, in the caller, raises it
    again (a failed compile holds nothing: no lock is kept for it, kcache.triton.failed_compiles)."""


# What the compile service's template imports for Triton's jobs (and warms up: stages.warm_up_template).
TRITON_PRELOAD = ("triton", "kcache.triton.stages")

# Where Helion's precompile children start (helion.autotuner.precompile_future, Helion 1.5.0 and 1.5.1).
HELION_CHILD_FILE = os.path.join("helion", "autotuner", "precompile_future.py")
HELION_CHILD_ENTRIES = frozenset({"_run_kernel_in_subprocess_fork", "_run_kernel_in_subprocess_spawn"})

_warned: set[str] = set()
_service_warming = False  # warm_service_soon ran in this process


def lane() -> str:
    """KCACHE_TRITON_ISOLATION's lane, `worker` by default (a bad value fails with one line); in one of
    Helion's precompile children, `off`: it compiles in place."""
    if _in_helions_child():
        return "off"
    return values.triton_isolation_setting()


def _in_helions_child() -> bool:
    """Whether this compile runs in one of Helion's precompile children: a process of its own already,
    whose crash Helion reports as that config's failure and skips. Isolating it again would cost a
    worker's round trip per candidate and protect nothing more (docs/design/triton.md, "Isolation")."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in HELION_CHILD_ENTRIES and code.co_filename.endswith(HELION_CHILD_FILE):
            return True
        frame = frame.f_back
    return False


def describe(frame: FrameType, kernel: str) -> str:
    """The kernel and its config, as an autotuner's log names it: `matmul_kernel (Triton) [BM=128, ...,
    num_warps=4, num_stages=3]`."""
    parts = config_of(frame)
    return f"{kernel} [{', '.join(parts)}]" if parts else kernel


# What a compile imports at its first use: Triton's code generator (with its Gluon and libdevice
# modules; `ASTSource.make_ir`, Triton 3.5 and 3.6), and kcache's own miss path. Imported in the
# process that compiles, where plain Triton imports them: the forks it makes itself (Helion's
# precompile children, one per config) then inherit them rather than import them again.
COMPILE_IMPORTS = ("triton.compiler.code_generator", "kcache.triton.held", "kcache.triton.key_fields",
                   "kcache.triton.private", "kcache.store.arrivals", "kcache.store.entries", "kcache.store.locks",
                   "kcache.cache.deployment", "kcache.cache.miss_explain")


def import_before_forking() -> None:
    """Import COMPILE_IMPORTS here. Through `importlib.import_module` each time, never skipped for being
    in sys.modules: a module another thread is still importing is there half made, and the import
    waits for that thread to finish it (a fork made meanwhile would inherit its module lock, held by a
    thread that does not exist in the fork)."""
    for module in COMPILE_IMPORTS:
        try:
            importlib.import_module(module)
        except ImportError:  # another Triton's layout: the compile imports what it needs
            if not module.startswith("triton."):
                raise


def compile_isolated(frame: FrameType, name: str) -> dict[str, bytes] | None:
    """The group's files of the compile of `frame`, its back half run away from this process; None
    where this process compiles it itself (a program whose stages hook cannot leave it, and which runs
    other threads; the service stopped). Raises CompileFailed (a Python error in either half, which
    Triton's own compile then raises here), CompilerCrashed or CompileTimeout."""
    from kcache.errors import CompileAborted, CompilerCrashed, CompileTimeout
    from kcache.triton import frontend
    from kcache.triton.compile_cost import estimated_cost
    from kcache.triton.stages import ArrivedChanged, run_stages

    import_before_forking()
    reason = frontend.needs_caller()
    if reason is not None and not _forkable(reason):
        return None
    started = time.thread_time()  # this thread's CPU: the front halves of a tune's threads share the GIL
    try:
        job = frontend.stages_job(frame)
    except Exception as err:  # noqa: BLE001 - Triton's compile meets it again here, and raises it
        log.debug("kcache: the front half of Triton's %s failed (%s): compiling it in this process", name, err)
        raise CompileFailed(name) from err
    log.debug("kcache: the front half of Triton's %s took %.1f ms of CPU", name, 1000 * (time.thread_time() - started))
    timeout = values.env_seconds("KCACHE_COMPILE_TIMEOUT", values.DEFAULT_COMPILE_TIMEOUT_S) or None
    try:
        if reason is not None:
            from kcache.compile.fork.caller_fork import run_in_fork

            with _compile_slot(name, timeout):
                result = run_in_fork(run_stages, (job,), name, timeout, relay=_relay)
        else:
            result = _compile_pool().run(run_stages, job, name=name, timeout_s=timeout, cost=estimated_cost(job))
        files = result.verified_files()
    except (CompilerCrashed, CompileTimeout):
        raise
    except ArrivedChanged as err:
        log.warning("kcache: %s: compiling Triton's %s in this process", err, name)
        return None
    except CompileAborted as err:
        log.warning("kcache: Triton's compile of %s was stopped (%s): compiling it in this process", name, err)
        return None
    except Exception as err:  # noqa: BLE001 - a Python error: Triton's own compile raises it here
        log.debug("kcache: Triton's compile of %s failed in its worker (%s: %s): compiling it here", name,
                  type(err).__name__, err)
        raise CompileFailed(name) from err
    from kcache.triton.stage_output import relay

    relay(result.output, stderr_too=reason is None)  # run_in_fork relayed the fork's stderr whole
    source_name, source = frontend.source_file(job)
    return {source_name: source, **files}


def warm_workers(count: int) -> None:
    """Ask the compile service for `count` warm workers, without waiting (a tune's configs are about to
    arrive); nothing where Triton's compiles are not isolated or the service cannot be reached."""
    if lane() != "worker":
        return
    try:
        pool = _compile_pool()
        from kcache.compile.service.client import ServicePool  # loaded by _compile_pool where it is one

        if isinstance(pool, ServicePool):  # the process's own pool warms as it goes
            pool.warm(count)
    except Exception as err:  # noqa: BLE001 - a warm-up is an optimization; its failure costs nothing
        log.debug("kcache: could not warm %d compile workers: %s", count, err)


def warm_service_soon() -> None:
    """Reach (or start) the compile service in the background, once a process, at its first miss of a
    lone file: Triton's driver building its utilities module at the first launch, a kernel's launcher,
    an autotune result on disk. A compile is near; the service's start (an interpreter, Triton's
    import, its template's warm-up compile: about 0.5 s of the H200's first tune) then overlaps what the
    program does until its first compile. Nothing where Triton's compiles do not go to the service;
    a process that only hits never misses a lone file, and starts nothing."""
    global _service_warming
    if _service_warming:
        return
    _service_warming = True
    try:
        if lane() != "worker" or values.env_choice("KCACHE_COMPILE_ISOLATION", values.ISOLATION_MODES) != "server":
            return
        _compile_pool()  # the client imported here: the warm-up's thread imports nothing
        from kcache.compile.fork.caller_fork import SERVICE_WARM_THREAD

        threading.Thread(target=warm_workers, args=(1,), name=SERVICE_WARM_THREAD, daemon=True).start()
    except Exception as err:  # noqa: BLE001 - a warm-up is an optimization (a bad setting: the compile says it)
        log.debug("kcache: could not warm the compile service ahead: %s", err)


def _forkable(reason: str) -> bool:
    """Whether a compile that must stay with the caller's code (`reason`) may run in a fork of it: only
    where no other thread runs; else it runs in this process, with one warning."""
    from kcache.compile.fork.caller_fork import unsafe_reason

    unsafe = unsafe_reason(TRITON_PRELOAD[:1])
    if unsafe is None:
        return True
    if reason not in _warned:
        _warned.add(reason)
        log.warning("kcache: Triton's compiles run in this process, unisolated: %s, and %s (a fork of this "
                    "process could hang on that thread's locks). A crash of the compiler ends the program",
                    reason, unsafe)
    return False


def _compile_slot(name: str, timeout_s: float | None) -> Any:
    """One of the user's compile slots (kcache.compile.compile_slots), held by a fork of this process
    that compiles outside the service, so that it counts against the machine's bound as the service's
    workers do: waited for at most the compile's timeout, then the compile runs without one."""
    from kcache.compile.compile_slots import CompileSlots
    from kcache.compile.jobs import usable_cpu_count

    slots = CompileSlots("triton-fork", values.env_count("KCACHE_COMPILE_WORKERS") or usable_cpu_count())
    try:
        slot = slots.try_take()
        if slot is None:
            log.debug("kcache: every compile slot is held; Triton's compile of %s waits for one", name)
            slot = slots.take(timeout_s or values.DEFAULT_COMPILE_TIMEOUT_S)
    except OSError as err:  # no private runtime directory: nothing to count against
        log.debug("kcache: no compile slot for Triton's compile of %s (%s)", name, err)
        return contextlib.nullcontext()
    if slot is None:
        log.warning("kcache: Triton's compile of %s waited KCACHE_COMPILE_TIMEOUT for a compile slot; it "
                    "runs beside the others", name)
        return contextlib.nullcontext()
    return slot


def _compile_pool() -> Any:
    """The compile service of this environment for Triton's jobs (KCACHE_COMPILE_ISOLATION=server, the
    default), else the process's own pool: its workers import TRITON_PRELOAD. The settings are read as
    `kcache.config.Settings` reads them, without it, and nothing of TileLang's miss path is loaded: a
    cold process's first compile waits for these imports (about 50 ms through the cache's miss path)."""
    mode = values.env_choice("KCACHE_COMPILE_ISOLATION", values.ISOLATION_MODES)
    workers = values.env_count("KCACHE_COMPILE_WORKERS")
    timeout = values.env_seconds("KCACHE_COMPILE_TIMEOUT", values.DEFAULT_COMPILE_TIMEOUT_S) or None
    if mode == "server":
        from kcache.compile.service.shared_pools import shared_service_pool

        idle = values.env_seconds("KCACHE_SERVER_IDLE", values.DEFAULT_SERVER_IDLE_S) or values.DEFAULT_SERVER_IDLE_S
        return shared_service_pool(workers, timeout, TRITON_PRELOAD, idle)
    from kcache.compile.pool.shared_pools import shared_pool

    return shared_pool(workers, timeout, TRITON_PRELOAD)


def _relay(text: str) -> None:
    """What a fork of this process printed (Triton's warnings), on this process's stderr."""
    if text.strip():
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()


def compiler_said(tail: str) -> str:
    """The line of a crashed worker's output that says why (LLVM's assertion, say): the last one before
    Python's own report of the fatal signal, else the last one."""
    lines = [line for line in tail.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if line.startswith("Fatal Python error"):
            return lines[index - 1].strip() if index else line
    return lines[-1].strip() if lines else "(no output)"
