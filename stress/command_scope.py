"""One long command of the harness (`python -m stress`, `python -m stress.bench`, `python -m
stress.bench.standalone.tune`), and everything it starts, stopped however it ends.

Within `command_scope()`:
- SIGINT and SIGTERM raise kcache.interruption.Interrupted in the main thread: every `with` and
  `finally` on the way out runs (the command then prints its one line);
- the command's compile services live in a runtime directory of its own
  (XDG_RUNTIME_DIR, inherited by every child), never in the user's, where `kcache server stop` would
  be the only way to stop them;
- its children's temporary files go to a directory of its own (TMPDIR), removed at the end;
- at the end, whatever ends it (a return, an error, a signal), every process below the command is
  killed and waited for, and the services of its runtime directory are stopped and the directory
  removed. Nothing the command started outlives it.

For a command's own process only (a `python -m` entry point): the end stops every process below
that process, and closes its compile pools.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kcache.compile.pool.live_pools import close_all_pools
from kcache.compile.service.shared_pools import close_shared_service_pools
from kcache.interruption import Interrupted, ignore_further_signals, interruptible, signals_deferred

from .own_processes import stop_descendants
from .procs import environ
from .service_runtime import fresh_runtime, stop_services


@dataclass
class CommandScope:
    runtime: Path  # the command's own XDG_RUNTIME_DIR
    children_tmp: Path  # its children's TMPDIR


@contextlib.contextmanager
def command_scope() -> Iterator[CommandScope]:
    # The command's own temporary files stay where they were (tempfile remembers the directory at its
    # first use, made here): its children's go to a directory of the command's, removed at its end,
    # for what a killed compile leaves there (TileLang's and nvcc's temporaries).
    children_tmp = Path(tempfile.mkdtemp(prefix="kcache-tmp-", dir=tempfile.gettempdir()))
    runtime = fresh_runtime()
    with environ({"TMPDIR": str(children_tmp), "XDG_RUNTIME_DIR": str(runtime)}), interruptible():
        try:
            yield CommandScope(runtime, children_tmp)
        finally:
            with signals_deferred():  # a signal now is acted on once this is done, never cuts it short
                _stop_everything(runtime)
                shutil.rmtree(children_tmp, ignore_errors=True)


def _stop_everything(runtime: Path) -> None:
    # The services go away on purpose now: a client thread's warning that its service went away
    # (this process's own compiles were cut short) would only be noise after the command's last line.
    logging.getLogger("kcache").disabled = True
    # This process's own compile clients first: a job of theirs cut short must not run again in a
    # fallback pool (new processes) once its service stops.
    close_shared_service_pools()
    close_all_pools()
    stop_descendants()  # then everything below: a worker left running would start a service again
    stop_services(runtime)


def run_command(name: str, body: Callable[[], int]) -> int:
    """`body` (a benchmark's main) within a command scope. SIGINT or SIGTERM: one line on stderr,
    `NAME: interrupted by SIGINT: ...` (what the body recorded in Interrupted.done, else that
    everything it started was stopped), and exit status 130 or 143."""
    try:
        with command_scope():
            return body()
    except Interrupted as stop:
        ignore_further_signals()
        print(f"{name}: interrupted by {stop.name}: "
              f"{stop.done or 'stopped before it finished, and everything it started with it'}", file=sys.stderr)
        return stop.exit_status
