"""Starting a fresh interpreter for a compile worker or the worker template: one way, for both."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kcache.compile.protocol import PROTOCOL_FDS_ENV
from kcache.compile.worker import PARENT_ENV
from kcache.config import DROPIN_ENV
from kcache.errors import CompilePoolError


def start_interpreter(module: str, protocol: tuple[int, int], log: int, env: dict[str, str],
                      extra_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """A fresh interpreter that runs `module`'s main: protocol pipes `(in, out)` passed as descriptors
    of their own (named by PROTOCOL_FDS_ENV), stdin /dev/null, stdout and stderr into `log`. Started
    through `subprocess.Popen` as bound when kcache was imported: a program (or a test suite) that
    patches `subprocess.Popen` later does not reach kcache's workers."""
    package_parent = str(Path(__file__).resolve().parents[2])
    bootstrap = f"import sys; sys.path.insert(0, {package_parent!r}); from {module} import main; sys.exit(main())"
    try:
        return POPEN(
            [sys.executable, "-c", bootstrap],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(*protocol, *extra_fds),
            env=internal_environment({**env, PARENT_ENV: str(os.getpid()),
                                      PROTOCOL_FDS_ENV: f"{protocol[0]},{protocol[1]}"}),
            start_new_session=True,  # its own process group: a kill takes its nvcc too, and Ctrl-C reaches only us
        )
    except Exception as err:  # noqa: BLE001 - OSError, or whatever a broken environment raises
        raise CompilePoolError(f"{sys.executable} could not be started ({module}): {err}", "") from err


def internal_environment(extra: dict[str, str]) -> dict[str, str]:
    """The environment of an interpreter kcache starts for itself (a worker, the worker template, the
    compile service): this one's with `extra`, less KCACHE_TILELANG. kcache's own processes never
    install the drop-in: installed there, their `import tilelang` would open a cache that warms the
    service up from inside it (threads in the template, which then cannot fork), and a job's
    `tilelang.compile` would send a compile to the service it runs in."""
    return {**{name: value for name, value in os.environ.items() if name != DROPIN_ENV}, **extra}


# Bound at import (see start_interpreter).
POPEN = subprocess.Popen
