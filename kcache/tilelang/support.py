"""The version gate of kcache's TileLang layer: whether the installed TileLang is one kcache works with.

Outside the tested range of versions (SUPPORTED, the pin of pyproject.toml), or where an essential
internal is missing (kcache/tilelang/internals.py), kcache's TileLang layer is not used:
- the drop-in (`kcache.install()`, `kcache run`, KCACHE_TILELANG=1) leaves TileLang as it is, so
  every compile is plain TileLang's, and says so in one warning;
- `get_or_compile` raises TileLangUnsupported, one line;
- `kcache doctor` reports the version as a problem (it imports nothing of TileLang, so it reads the
  version only).

The version is TileLang's own `__version__` once it is loaded, else its package's metadata (the
doctor's, which imports nothing). A TileLang without either has no version to judge: only its
internals are checked.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
from typing import Any

from kcache.errors import TileLangMissing, TileLangUnsupported
from kcache.tilelang.installed import is_tilelang_missing, tilelang_installed

log = logging.getLogger("kcache")

# The range CI tests (.ci/run), the same as pyproject.toml's pin (tests/test_tilelang_support.py).
MINIMUM = (0, 1, 15)
BELOW = (0, 2)
SUPPORTED = ">=0.1.15,<0.2"
FIX = f"pip install 'tilelang{SUPPORTED}'"

_reason: str | None = None
_checked = False
_warned = False


def installed_version() -> str | None:
    """The installed TileLang's version: the loaded module's own, else its package metadata (no import;
    reading it costs ~60 ms in a process that has not loaded importlib.metadata); None where there is none."""
    loaded = getattr(sys.modules.get("tilelang"), "__version__", None)
    if isinstance(loaded, str):
        return loaded
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tilelang")
    except PackageNotFoundError:
        return None


def version_supported(version: str) -> bool:
    """Whether `version` (its release numbers: "0.1.15+cu130" is 0.1.15) is in SUPPORTED."""
    numbers = re.match(r"\d+(?:\.\d+)*", version.strip())
    if numbers is None:
        return False
    release = tuple(int(part) for part in numbers.group(0).split("."))
    return MINIMUM <= release and release[:len(BELOW)] < BELOW


def version_problem() -> str | None:
    """One line saying that the installed TileLang's version is outside SUPPORTED, with the fix; None
    where it is inside (or unknown, or TileLang is not installed). No TileLang import."""
    version = installed_version()
    if version is None or version_supported(version):
        return None
    return f"TileLang {version} is installed; kcache supports TileLang {SUPPORTED}: {FIX}"


def unsupported_reason() -> str | None:
    """Why kcache's TileLang layer cannot be used with this TileLang (the version, or the essential
    internals it lacks), one line with the fix; None where it can. Imports TileLang's modules where
    the version passes; memoized."""
    global _reason, _checked
    if not _checked:
        reason = None
        if tilelang_installed():  # not installed: TileLangMissing, from the caller's import
            importlib.import_module("tilelang")  # the caller's next step anyway; its version is then free to read
            reason = version_problem()
            from kcache.tilelang.internals import missing_essentials

            missing = [] if reason is not None else missing_essentials()
            if missing:
                version = installed_version() or "(version unknown)"
                reason = (f"TileLang {version} lacks {', '.join(missing)}, which kcache needs; kcache supports "
                          f"TileLang {SUPPORTED}: {FIX}")
        _reason, _checked = reason, True
    return _reason


def require_supported() -> None:
    """Raise TileLangUnsupported where kcache's TileLang layer cannot be used with this TileLang."""
    reason = unsupported_reason()
    if reason is not None:
        raise TileLangUnsupported(reason)


def warn_passing_through(reason: str) -> None:
    """The drop-in's one warning (once a process): compiles go to plain TileLang, and why."""
    global _warned
    if not _warned:
        _warned = True
        log.warning("kcache: every TileLang compile goes to plain TileLang, uncached by kcache: %s", reason)


def load_backend() -> Any:
    """kcache's TileLang backend (kcache.tilelang.backend), imported. A TileLang outside the supported
    versions, or without an internal kcache needs, is one line (require_supported), before any of
    kcache's layer imports it; a missing TileLang is TileLangMissing: what to install, not where the
    import failed."""
    try:
        require_supported()
        from kcache.tilelang import backend
    except ModuleNotFoundError as err:
        if is_tilelang_missing(err):
            raise TileLangMissing() from None
        raise
    return backend
