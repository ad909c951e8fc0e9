"""Installing the drop-in as soon as the program imports TileLang, not before (KCACHE_TILELANG=1, `kcache run`).

Light on purpose: it imports the import hooks and the flag's parser only. A program that never imports
TileLang (a Triton-only one, or one where TileLang is not installed) never loads kcache's TileLang layer,
and `kcache run empty.py` costs about what `python empty.py` does (stress.bench's `run` scenario).
"""

from __future__ import annotations

import logging
import os
import sys

from kcache.import_hooks import after_import, before_import
from kcache.setting_values import DROPIN_ENV, parse_flag

log = logging.getLogger("kcache")

# The last module `install` patches: `import tilelang` loads tilelang.jit before it.
LAST_PATCHED = "tilelang.autotuner.tuner"
_hooked = False  # install_from_environment has run (and installed, or set its hooks)


def install_from_environment() -> None:
    """KCACHE_TILELANG=1 at `import kcache`: install now if TileLang is loaded, else as soon as it is
    (a process that never imports TileLang, such as the `kcache` CLI, never pays for it). A value that
    is not a flag installs too, so that install() raises its SettingError where TileLang is imported,
    as KCACHE_LOG's does at the first open: the `kcache` command, which imports kcache and never
    TileLang, says it in one line (exit status 2), and no program's compiles go uncached unheard of."""
    raw = os.environ.get(DROPIN_ENV, "").strip()
    try:
        wanted = bool(raw) and parse_flag(raw)
    except ValueError:
        wanted = True
    global _hooked
    if not wanted or _hooked:  # once: a second call would install twice at the import
        return
    _hooked = True
    if LAST_PATCHED not in sys.modules:
        # When TileLang's import begins, the default cache opens, so that the compile service's start
        # (server mode) overlaps that import rather than following it.
        before_import("tilelang", _open_default_cache)
    after_import(LAST_PATCHED, _install)


def _install() -> None:
    from kcache.dropin.installer import install

    install()


def _open_default_cache() -> None:
    try:
        from kcache.cache.default import default_cache

        default_cache()
    except Exception as err:  # noqa: BLE001 - install(), after the import, raises it with its message
        log.debug("kcache: the default cache did not open at TileLang's import: %s", err)
