"""Triton's compiles in a fork of the caller: a compiler's abort kills the fork, never the program.

The hook is the cache manager's `get_group`, the one call every Triton compile makes before it
compiles, whichever way it was reached (`triton.compile`, a JIT launch or warmup, `@triton.autotune`,
Inductor, Helion) and whatever reference to `compile` the program holds; patching `triton.compile`
would miss the references taken before kcache was installed. On a miss, `get_group` forks. The fork
calls Triton's `compile` again with the arguments of the call that asked (the frame of
`triton.compiler.compiler.compile`, checked by identity): the same source object, target, options
and environment, nothing serialized. In the fork the manager works as without isolation (the key's
lock, a wait for another process's compile, the compile, the publish) and the fork exits through
`os._exit` once `compile` returns, with the group's files as its answer. The caller then reads the
published group, verified, as a hit, and Triton's `compile` goes on down its hit path.

- An abort, a segfault or an exit of the fork: `TritonCompilerCrashed` (a `kcache.CompilerCrashed`,
  and a Triton `PTXASError`, which `@triton.autotune` skips as it skips a config out of resources),
  with the signal and the fork's last output (LLVM's assertion); the crash is remembered
  (kcache.triton.crashes). A hang past KCACHE_COMPILE_TIMEOUT: `TritonCompileTimeout`, the fork and
  its process group killed.
- A Python error in the fork (a `CompilationError`, say): the caller compiles in-process, down the
  path it would have taken without isolation, and so raises exactly what plain Triton raises; the
  fork showed that this compile does not crash.
- KCACHE_TRITON_ISOLATION=off, Triton's override and dump modes, or a caller other than Triton's
  `compile`: no fork, the compile runs in the caller as before.
Before its first fork the caller imports what a compile imports at its first use (Triton's code
generator, kcache's miss path), where plain Triton imports it: the forks inherit it (docs/design/triton.md).
The fork runs only the compile: Triton's own code and the hooks Triton calls during a compile
(`knobs.runtime.add_stages_inspection_hook`, a compilation listener); it touches no CUDA (the target is
resolved in the caller), and its effects on objects stay in the fork.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from types import FrameType
from typing import Any

from kcache import setting_values as values
from kcache.triton.compile_record import config_of

log = logging.getLogger("kcache")

_in_fork = False  # True in a fork that compiles: its manager compiles in place
_groups: dict[str, dict[str, bytes]] = {}  # in a fork: the groups its compile put, by entry key


# Where Helion's precompile children start (helion.autotuner.precompile_future, Helion 1.5.0 and 1.5.1).
HELION_CHILD_FILE = os.path.join("helion", "autotuner", "precompile_future.py")
HELION_CHILD_ENTRIES = frozenset({"_run_kernel_in_subprocess_fork", "_run_kernel_in_subprocess_spawn"})


def lane() -> str:
    """KCACHE_TRITON_ISOLATION's lane, `fork` by default (a bad value fails with one line); in the
    fork itself, and in one of Helion's precompile children, `off`: it compiles in place."""
    if _in_fork or _in_helions_child():
        return "off"
    return values.triton_isolation_setting()


def _in_helions_child() -> bool:
    """Whether this compile runs in one of Helion's precompile children: a process of its own already,
    whose crash Helion reports as that config's failure and skips. A second fork there would cost a
    fork per candidate and protect nothing more (docs/design/triton.md, "Isolation")."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in HELION_CHILD_ENTRIES and code.co_filename.endswith(HELION_CHILD_FILE):
            return True
        frame = frame.f_back
    return False


def in_fork() -> bool:
    return _in_fork


def note_group(key: str, files: dict[str, bytes]) -> None:
    """In a fork: the group its compile put under `key`, the fork's answer."""
    if _in_fork:
        _groups[key] = files


def describe(frame: FrameType, kernel: str) -> str:
    """The kernel and its config, as an autotuner's log names it: `matmul_kernel (Triton) [BM=128, ...,
    num_warps=4, num_stages=3]`."""
    parts = config_of(frame)
    return f"{kernel} [{', '.join(parts)}]" if parts else kernel


# What a compile imports at its first use: Triton's code generator (with its Gluon and libdevice
# modules: about 35 ms on the CPU machine; `ASTSource.make_ir`, Triton 3.5 and 3.6), and kcache's own
# miss path, which runs in the fork (the key's lock, the publish: about 8 ms).
COMPILE_IMPORTS = ("triton.compiler.code_generator", "kcache.triton.held", "kcache.triton.key_fields",
                   "kcache.triton.private", "kcache.store.arrivals", "kcache.store.entries", "kcache.store.locks",
                   "kcache.cache.deployment", "kcache.cache.miss_explain")


def import_before_forking() -> None:
    """Import COMPILE_IMPORTS here, where plain Triton would import them (in the process that compiles),
    so that every fork inherits them: this compile's, later ones, and the forks this process makes
    itself (Helion's precompile children, one per config). Otherwise each fork imports them again."""
    for module in COMPILE_IMPORTS:
        if module not in sys.modules:
            try:
                importlib.import_module(module)
            except ImportError:  # another Triton's layout: the fork imports what its compile needs
                if not module.startswith("triton."):
                    raise


def compile_in_fork(frame: FrameType, name: str) -> tuple[str, Any]:
    """Run the compile of `frame` in a fork of this process: ("ok", {entry key: group files}) or
    ("error", "Type: message") for a Python error there. Raises CompilerCrashed or CompileTimeout."""
    from kcache.compile.fork.caller_fork import run_in_fork  # a miss's

    import_before_forking()
    arguments = frame.f_locals
    options = arguments["options"]
    job = (sys.modules["triton.compiler.compiler"].compile, arguments["src"], arguments["target"],
           dict(getattr(options, "__dict__", options)), arguments.get("env_vars"))
    timeout = values.env_seconds("KCACHE_COMPILE_TIMEOUT", values.DEFAULT_COMPILE_TIMEOUT_S) or None
    return run_in_fork(_compile_here, job, name, timeout, relay=_relay)


def _relay(text: str) -> None:
    """What the fork printed (Triton's warnings, kcache's log), on this process's stderr."""
    if text.strip():
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()


def compiler_said(tail: str) -> str:
    """The line of a crashed fork's output that says why (LLVM's assertion, say): the last one before
    Python's own report of the fatal signal, else the last one."""
    lines = [line for line in tail.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if line.startswith("Fatal Python error"):
            return lines[index - 1].strip() if index else line
    return lines[-1].strip() if lines else "(no output)"


def _compile_here(compile_fn: Any, src: Any, target: Any, options: dict, env_vars: Any) -> tuple[str, Any]:
    """In the fork: Triton's compile, its manager compiling in place; what it put comes back."""
    global _in_fork
    _in_fork = True
    try:
        compile_fn(src, target=target, options=options, _env_vars=env_vars)
    except Exception as err:  # noqa: BLE001 - the caller compiles again, in-process, and raises it itself
        return "error", f"{type(err).__name__}: {str(err)[:2000]}"
    return "ok", dict(_groups)
