"""Which lane compiles a TileLang kernel, and what crosses into it (a miss only).

- The compile pool's lane (`pool.run`: the compile service, a fork of the caller while the service
  is not warm, or the process's own pool): the PrimFunc crosses as a `TransferableFunc`, proven
  exact in the caller (`transfer.pack`) and checked on arrival (`transfer.unpack`); a fork of the
  caller takes the caller's object from memory instead. The target crosses as its canonical JSON,
  the compile context (environment, callback fingerprints) as data.
- The caller's callbacks never cross: the worker calls them back in the caller (`CallerCalls`).
- A function whose transfer cannot be proven exact, or that arrived changed (`TransferMismatch`),
  is compiled where nothing is serialized: in a fork of the caller when that is safe (no other
  Python thread runs), else in the caller's own process; one warning names the kernel.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tvm.tirx import PrimFunc

from kcache.compile.caller_calls import CallerCalls
from kcache.compile.fork import caller_fork
from kcache.compile.jobs import JobOutput
from kcache.compile.protocol import CallByName
from kcache.tilelang import transfer
from kcache.tilelang.context import caller_functions
from kcache.tilelang.identity import kernel_name
from kcache.tilelang.target import ResolvedTarget

log = logging.getLogger("kcache")

COMPILE_JOB = CallByName("kcache.tilelang.compiler", "compile_job")
_warned: set[str] = set()


def compile_entry(
    func: PrimFunc, resolved: ResolvedTarget, out_idx: list[int] | None, pass_configs: dict[str, Any],
    compile_flags: list[str] | None, log_dir: Path, *, pool: Any, out_dir: Path, key: str, toolchain: dict,
    context: Any = None, described_fields: dict | None = None,
) -> None:
    """Compile in a worker of `pool` (or, see the module's docstring, without serializing), which
    writes every component of the entry into `out_dir`."""
    name = kernel_name(func)
    rest = (resolved.canonical, resolved.context.execution_backend.name, out_idx, pass_configs, compile_flags,
            str(log_dir), str(out_dir), key, toolchain, context, described_fields)
    calls = CallerCalls(caller_functions(context))
    packed, why = transfer.pack(func, name)
    if packed is not None:
        try:
            pool.run(COMPILE_JOB, transfer.TransferableFunc(func, packed), *rest, name=name,
                     output=JobOutput(key, str(out_dir)),  # the entry of `key`: one compile for identical jobs in flight
                     calls=calls)
            return
        except transfer.TransferMismatch as err:
            why = err.detail
    compile_unserialized(func, rest, name, why, getattr(pool, "timeout_s", None), calls)


def compile_unserialized(func: PrimFunc, rest: tuple, name: str, why: str, timeout_s: float | None,
                         calls: CallerCalls) -> None:
    """The job with the caller's own `func`: in a fork of this process when that is safe, else here."""
    unsafe = caller_fork.unsafe_reason(("tilelang",))
    where = "in a fork of this process" if unsafe is None else f"in this process ({unsafe}, so no fork)"
    if name not in _warned:
        _warned.add(name)
        log.warning("kcache: kernel %r cannot be sent to a compile worker exactly (%s); compiling it %s",
                    name, why, where)
    if unsafe is None:
        try:
            caller_fork.run_in_fork(COMPILE_JOB, (func, *rest), name, timeout_s, calls=calls)
            return
        except caller_fork.ForkUnavailable:
            pass
    from kcache.tilelang.compiler import compile_job

    compile_job(func, *rest, in_worker=False)
