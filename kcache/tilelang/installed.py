"""Whether TileLang is installed here, found without importing it (an import costs seconds and loads
hundreds of megabytes of libraries), and the one error that says how to install it."""

from __future__ import annotations

import importlib.util
import sys

from kcache.errors import TileLangMissing


def tilelang_installed() -> bool:
    """Whether `import tilelang` can find a package in this environment (not whether it works)."""
    if "tilelang" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("tilelang") is not None
    except (ImportError, ValueError):  # a broken entry on the path: as good as none
        return False


def require_tilelang(alternative: str = "") -> None:
    """Raise TileLangMissing (naming `alternative`, a way to do without, if any) where TileLang is not
    installed: before anything is started or created for work that needs it."""
    if not tilelang_installed():
        raise TileLangMissing(alternative)


def is_tilelang_missing(err: ImportError) -> bool:
    """Whether `err` is the import of TileLang itself failing for want of the package (not a module of
    an installed TileLang that is broken, which keeps its own message)."""
    return isinstance(err, ModuleNotFoundError) and err.name == "tilelang"
