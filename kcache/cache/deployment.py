"""What a deployment needs, and what it must not do: the key recorder and the JIT guard.

- **Recording** (`KCACHE_RECORD=FILE`, or `kcache.record(path)`): every key a process asks for, hit
  or miss, is appended to FILE once per process, as a JSON line {"key", "kernel", "target", "fields"}: the
  list a bundle must cover (`kcache export --keys FILE`, `kcache verify-coverage --keys FILE`).
  Lines are appended with O_APPEND, one write each, so processes can share one file. The file is
  this user's own, never a link, created 0600 (group read and write in group mode)
  (kcache.store.owned_files).
- **The JIT guard** (`KCACHE_JIT_GUARD=warn|error`, or `kcache.guard(mode)` after a warm-up): a
  compile that happens anyway warns once per kernel, or raises `UnexpectedCompile` naming the
  kernel, its key and how it differs from the nearest stored entry of the kernel
  (kcache.cache.miss_explain), before anything compiles. For a serving stack that must not compile
  once it takes traffic.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from kcache.errors import KCacheError
from kcache.setting_values import JIT_GUARD_MODES, jit_guard_setting
from kcache.store import owned_files

log = logging.getLogger("kcache")

_lock = threading.Lock()
# A thread of the parent may hold it at a fork (a Triton compile forks from any thread): made anew.
os.register_at_fork(after_in_child=lambda: globals().update(_lock=threading.Lock()))
_recorder: KeyRecorder | None = None
_recorder_from_env = False
_guard: str | None = None  # None: as KCACHE_JIT_GUARD says
_warned: set[str] = set()


class UnexpectedCompile(KCacheError, RuntimeError):
    """A compile under `KCACHE_JIT_GUARD=error` (or `kcache.guard("error")`)."""

    def __init__(self, kernel: str, key: str, why: str = "") -> None:
        self.kernel = kernel
        self.key = key
        self.why = why  # how the key differs from the nearest stored entry of the kernel
        self._init_args = (kernel, key, why)
        super().__init__(
            f"kernel {kernel} (key {key[:16]}) would compile, and the JIT guard forbids compiles "
            f"(KCACHE_JIT_GUARD=error): it is in no local root, bundle or remote tier here. "
            f"{why + '. ' if why else ''}Record the deployment's keys (KCACHE_RECORD), bundle them "
            f"(kcache export --keys), and check the bundle (kcache verify-coverage) before serving; "
            f"`kcache why-miss {key[:16]}` explains this miss again.")


class KeyRecorder:
    """Appends each key once per process to a JSON-lines file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._seen: set[str] = set()
        self._refused = False  # the file is unsafe: said once

    def note(self, key: str, kernel: str, target: str, fields: dict[str, object] | None = None) -> None:
        """`fields`: the key's fields (as meta.json keeps them), so `kcache why-miss --keys FILE` can
        explain a recorded key that a bundle or root lacks."""
        if key in self._seen:
            return
        self._seen.add(key)
        record: dict[str, object] = {"key": key, "kernel": kernel, "target": target}
        if fields is not None:
            record["fields"] = fields
        line = json.dumps(record, sort_keys=True) + "\n"
        try:
            fd = owned_files.open_for_append(self.path)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except owned_files.UnsafeFile as err:
            if not self._refused:
                self._refused = True
                log.warning("kcache: not recording keys (KCACHE_RECORD): %s", err)
        except OSError as err:
            log.warning("kcache: cannot record key %s in %s: %s", key[:16], self.path, err)


def record(path: str | os.PathLike[str] | None) -> None:
    """Record every key this process asks for into `path` (None: stop recording)."""
    global _recorder, _recorder_from_env
    with _lock:
        _recorder = KeyRecorder(path) if path is not None else None
        _recorder_from_env = True  # an explicit choice overrides KCACHE_RECORD


def recorder() -> KeyRecorder | None:
    global _recorder, _recorder_from_env
    if not _recorder_from_env:
        with _lock:
            if not _recorder_from_env:
                configured = os.environ.get("KCACHE_RECORD")
                _recorder = KeyRecorder(configured) if configured else None
                _recorder_from_env = True
    return _recorder


def guard(mode: str) -> None:
    """Turn the JIT guard on ("warn", "error") or off ("off") for this process, whatever
    KCACHE_JIT_GUARD says: a serving process calls guard("error") once its warm-up is done."""
    global _guard
    if mode not in JIT_GUARD_MODES:
        raise ValueError(f"the JIT guard is one of {', '.join(JIT_GUARD_MODES)}, not {mode!r}")
    _guard = mode


def guard_mode() -> str:
    return _guard if _guard is not None else jit_guard_setting()


def check_compile(kernel: str, key: str, why: Callable[[], str] | None = None) -> None:
    """Before a compile: the guard's warning (once per kernel) or UnexpectedCompile. `why()` says how
    the key differs from what is stored; it is asked only when the guard speaks."""
    mode = guard_mode()
    if mode == "off":
        return
    if mode == "error":
        raise UnexpectedCompile(kernel, key, why() if why is not None else "")
    if kernel not in _warned:
        _warned.add(kernel)
        log.warning("kcache: compiling kernel %s (key %s) under the JIT guard (KCACHE_JIT_GUARD=warn): it is in no "
                    "local root, bundle or remote tier here%s", kernel, key[:16],
                    f"; {why()}" if why is not None else "")
