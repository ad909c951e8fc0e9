"""What a deployment needs, and what it must not do: the key recorder and the JIT guard.

- **Recording** (`KCACHE_RECORD=FILE`, or `kcache.record(path)`): every key a process asks for, hit
  or miss, is appended to FILE once per process, as a JSON line {"key", "kernel", "target"}: the
  list a bundle must cover (`kcache export --keys FILE`, `kcache verify-coverage --keys FILE`).
  Lines are appended with O_APPEND, one write each, so processes can share one file.
- **The JIT guard** (`KCACHE_JIT_GUARD=warn|error`, or `kcache.guard(mode)` after a warm-up): a
  compile that happens anyway warns once per kernel, or raises `UnexpectedCompile` naming the
  kernel and its key, before anything compiles. For a serving stack that must not compile once it
  takes traffic.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from kcache.errors import KCacheError

log = logging.getLogger("kcache")

GUARD_MODES = ("off", "warn", "error")
_lock = threading.Lock()
_recorder: KeyRecorder | None = None
_recorder_from_env = False
_guard: str | None = None  # None: as KCACHE_JIT_GUARD says
_warned: set[str] = set()


class UnexpectedCompile(KCacheError, RuntimeError):
    """A compile under `KCACHE_JIT_GUARD=error` (or `kcache.guard("error")`)."""

    def __init__(self, kernel: str, key: str) -> None:
        self.kernel = kernel
        self.key = key
        self._init_args = (kernel, key)
        super().__init__(
            f"kernel {kernel} (key {key[:16]}) would compile, and the JIT guard forbids compiles "
            f"(KCACHE_JIT_GUARD=error): it is in no local root, bundle or remote tier here. Record the "
            f"deployment's keys (KCACHE_RECORD), bundle them (kcache export --keys), and check the bundle "
            f"(kcache verify-coverage) before serving.")


class KeyRecorder:
    """Appends each key once per process to a JSON-lines file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._seen: set[str] = set()

    def note(self, key: str, kernel: str, target: str) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        line = json.dumps({"key": key, "kernel": kernel, "target": target}, sort_keys=True) + "\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
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
    if mode not in GUARD_MODES:
        raise ValueError(f"the JIT guard is one of {', '.join(GUARD_MODES)}, not {mode!r}")
    _guard = mode


def guard_mode() -> str:
    if _guard is not None:
        return _guard
    configured = os.environ.get("KCACHE_JIT_GUARD", "").strip().lower() or "off"
    if configured not in GUARD_MODES:
        raise ValueError(f"KCACHE_JIT_GUARD={configured!r}: use one of {', '.join(GUARD_MODES)}")
    return configured


def check_compile(kernel: str, key: str) -> None:
    """Before a compile: the guard's warning (once per kernel) or UnexpectedCompile."""
    mode = guard_mode()
    if mode == "off":
        return
    if mode == "error":
        raise UnexpectedCompile(kernel, key)
    if kernel not in _warned:
        _warned.add(kernel)
        log.warning("kcache: compiling kernel %s (key %s) under the JIT guard (KCACHE_JIT_GUARD=warn): it is in no "
                    "local root, bundle or remote tier here", kernel, key[:16])
