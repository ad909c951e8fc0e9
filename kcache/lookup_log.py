"""KCACHE_LOG=debug|info|warning: kcache's log on stderr, one line per lookup of every compiler.

Each lookup of TileLang's cache, Triton's manager (a group) and Helion's backend (a pick) says what
happened, naming the compiler, the kernel and the key:

    kcache: triton hit add_kernel (Triton), key 71dd14c10ebed716 (disk)
    kcache: tilelang miss gemm, key 1a2b3c4d5e6f7a8b: compiling
    kcache: tilelang compile gemm, key 1a2b3c4d5e6f7a8b: 3.2 s
    kcache: tilelang wait gemm, key 1a2b3c4d5e6f7a8b: 2.9 s for another process's compile

`debug` logs every event; `info` the costly ones (miss, compile, wait) and kcache's notes; `warning`
(the default) only what needs a look. Unset, kcache's logger is left as it is: its warnings go where
the program's logging sends them (else to stderr, through Python's last resort). Set, kcache's logger
gets a handler of its own on stderr, at that level, and does not pass its lines on: each shows once.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("kcache")

LEVELS = {"warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}
# The level of each event: a hit is the common case, only `debug` shows it.
EVENT_LEVELS = {"hit": logging.DEBUG, "miss": logging.INFO, "compile": logging.INFO, "wait": logging.INFO}
_HANDLER_MARK = "_kcache_log_handler"


def configure(environ: dict[str, str] | None = None) -> None:
    """Apply KCACHE_LOG (at `import kcache`). A value that is not a level does nothing here: opening a
    cache, or any `kcache` command, stops on it with one line (setting_values.log_setting)."""
    raw = (os.environ if environ is None else environ).get("KCACHE_LOG", "").strip().lower()
    level = LEVELS.get(raw)
    if level is None:
        return
    if not any(getattr(handler, _HANDLER_MARK, False) for handler in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))  # kcache's lines begin with "kcache: "
        setattr(handler, _HANDLER_MARK, True)
        log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False


def lookup(compiler: str, event: str, kernel: str, key: str, detail: str = "") -> None:
    """One line for one event of a lookup: `event` is hit, miss, compile or wait."""
    level = EVENT_LEVELS[event]
    if log.isEnabledFor(level):
        log.log(level, "kcache: %s %s %s, key %s%s", compiler, event, kernel, key[:16], detail)


def enabled(event: str) -> bool:
    """Whether `event` would be logged: what a hot path asks before it computes a kernel's name."""
    return log.isEnabledFor(EVENT_LEVELS[event])
