"""Starting kcache's own interpreters (compile workers, the worker template, the compile service, the
bundle stagers): one way, that imports nothing from the working directory.

`python -m X` and `python -c ...` put the working directory first on sys.path: run from a directory
another user can write (a shared scratch, /tmp), that user's `json.py` would run as you, inside the
compile service, with your secrets in its environment. So every interpreter kcache starts runs
`python_command`: `-P` (no unsafe path entry; Python 3.11+), a bootstrap that drops '' and every
relative entry from sys.path before its first import (the same on 3.10, where -P does not exist; the
site module, which runs before the bootstrap, never sees the working directory), and a PYTHONPATH
without relative entries (`isolated_environment`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kcache.compile.protocol import PROTOCOL_FDS_ENV
from kcache.compile.workers.worker import PARENT_ENV
from kcache.errors import CompilePoolError
from kcache.setting_values import DROPIN_ENV


def start_interpreter(module: str, protocol: tuple[int, int], log: int, env: dict[str, str],
                      extra_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """A fresh interpreter that runs `module`'s main: protocol pipes `(in, out)` passed as descriptors
    of their own (named by PROTOCOL_FDS_ENV), stdin /dev/null, stdout and stderr into `log`. Started
    through `subprocess.Popen` as bound when kcache was imported: a program (or a test suite) that
    patches `subprocess.Popen` later does not reach kcache's workers."""
    try:
        return POPEN(
            python_command(f"from {module} import main; sys.exit(main())"),
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(*protocol, *extra_fds),
            env=internal_environment({**env, PARENT_ENV: str(os.getpid()),
                                      PROTOCOL_FDS_ENV: f"{protocol[0]},{protocol[1]}"}),
            start_new_session=True,  # its own process group: a kill takes its nvcc too, and Ctrl-C reaches only us
        )
    except Exception as err:  # noqa: BLE001 - OSError, or whatever a broken environment raises
        raise CompilePoolError(f"{sys.executable} could not be started ({module}): {err}", "") from err


def python_command(statement: str) -> list[str]:
    """The command line of an interpreter of this environment that runs `statement` (with `sys` and
    `os` imported) and imports nothing from the working directory or a relative path; this kcache
    first on its path (the caller may have found it through a sys.path its program set)."""
    package_parent = str(Path(__file__).resolve().parents[2])
    bootstrap = ("import sys, os; sys.path[:] = [p for p in sys.path if p and os.path.isabs(p)]; "
                 f"sys.path.insert(0, {package_parent!r}); {statement}")
    return [sys.executable, *SAFE_PATH_FLAG, "-c", bootstrap]


# -P: no working directory, nor the script's, on sys.path (3.11+); the bootstrap covers 3.10.
SAFE_PATH_FLAG = ("-P",) if sys.version_info >= (3, 11) else ()


def internal_environment(extra: dict[str, str]) -> dict[str, str]:
    """The environment of an interpreter kcache starts for itself (a worker, the worker template, the
    compile service): this one's with `extra`, less KCACHE_TILELANG. kcache's own processes never
    install the drop-in: installed there, their `import tilelang` would open a cache that warms the
    service up from inside it (threads in the template, which then cannot fork), and a job's
    `tilelang.compile` would send a compile to the service it runs in."""
    environment = {**{name: value for name, value in os.environ.items() if name != DROPIN_ENV}, **extra}
    if "PYTHONPATH" in environment:
        environment["PYTHONPATH"] = os.pathsep.join(
            entry for entry in environment["PYTHONPATH"].split(os.pathsep) if entry and os.path.isabs(entry))
    return environment


# Bound at import (see start_interpreter).
POPEN = subprocess.Popen
