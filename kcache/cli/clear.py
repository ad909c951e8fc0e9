"""`kcache clear`: remove the entries of the installed compilers' versions, or (`--all-versions`) every
entry and result a root holds, of every compiler.

- `clear`: TileLang's kernel entries built by the installed TileLang, Triton's compiled kernels built
  by the installed Triton (the version their metadata names), and the Triton crashes remembered
  (kcache.triton.crashes). Triton's single files (launchers, driver modules, autotune timings) carry no
  version, Helion's picks and the autotune results none that kcache reads: they stay.
- `clear --all-versions`: every TileLang entry, Triton entry (kernels, single files, crashes), Helion
  pick and autotune result.
- `clear --crashes [KEY ...]`: the Triton crashes remembered and nothing else (those whose key, as
  `kcache ls` shows it, starts with one of KEY): a config to retry, the kernels kept.
Versions come from the packages' metadata: nothing is imported.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcache.cli.entries import autotune_results, entry_meta, is_triton_crash, json_file
from kcache.cli.format import count_of
from kcache.config import Settings
from kcache.maintenance.eviction import evict_entry, scan_entries
from kcache.store import layout
from kcache.triton.store import META as TRITON_META


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    clear = command("clear", "remove the entries of the installed versions: TileLang's kernels of this TileLang, "
                    "Triton's kernels of this Triton, and the Triton crashes remembered")
    clear.add_argument("--all-versions", action="store_true",
                       help="every entry of every compiler (TileLang, Triton, Helion) and every autotune result")
    clear.add_argument("--crashes", nargs="*", metavar="KEY", default=None,
                       help="only the Triton crashes remembered (those whose key, as `kcache ls` shows it, starts "
                            "with a KEY given), so that their configs compile again; nothing else is removed")


def installed(distribution: str) -> str | None:
    """The installed version of `distribution`, from its package metadata (no import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def triton_version_of(entry: Path) -> str | None:
    """The Triton version a Triton entry's group was compiled by (its metadata's triton_version)."""
    meta = json_file(entry / TRITON_META)
    group = meta.get("group") if isinstance(meta, dict) else None
    compiled = json_file(entry / group) if isinstance(group, str) else None
    found = compiled.get("triton_version") if isinstance(compiled, dict) else None
    return found if isinstance(found, str) else None


def cmd_clear(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    if args.crashes is not None:
        return _clear_crashes(settings.root, args.crashes)
    root, everything = settings.root, args.all_versions
    tilelang, triton = installed("tilelang"), installed("triton")
    removed = sum(evict_entry(root, entry.path) for entry in scan_entries(root)
                  if everything or (tilelang is not None and entry_meta(entry.path).get("tilelang") == tilelang))
    results = sum(evict_entry(root, item) for item in autotune_results(root)) if everything else 0
    tritons = crashes = 0
    for entry in scan_entries(root, layout.TRITON):
        crash = is_triton_crash(entry.path)  # a remembered crash is no entry of a kernel: counted apart
        if everything or crash or (triton is not None and triton_version_of(entry.path) == triton):
            gone = evict_entry(root, entry.path)
            crashes, tritons = (crashes + gone, tritons) if crash else (crashes, tritons + gone)
    helion = sum(evict_entry(root, entry.path) for entry in scan_entries(root, layout.HELION)) if everything else 0
    if everything:
        scope = "every version"
    else:
        scope = ", ".join([f"TileLang {tilelang}" if tilelang else "TileLang is not installed",
                           f"Triton {triton}" if triton else "Triton is not installed"])
    result = {"removed_entries": removed, "removed_autotune_results": results, "removed_triton_entries": tritons,
              "removed_helion_picks": helion, "forgotten_triton_crashes": crashes, "scope": scope}
    forgotten = f"; forgot {count_of(crashes, 'remembered Triton crash', 'remembered Triton crashes')}" if crashes else ""
    return result, (f"removed {count_of(removed, 'kernel entry', 'kernel entries')}, "
                    f"{count_of(results, 'autotune result', 'autotune results')}, "
                    f"{count_of(tritons, 'Triton entry', 'Triton entries')} and "
                    f"{count_of(helion, 'Helion pick', 'Helion picks')} ({scope}){forgotten}"), 0




def _clear_crashes(root: Path, keys: list[str]) -> tuple[Any, str, int]:
    """Forget the Triton crashes remembered (those of `keys`' prefixes, where given): their configs
    compile again; every kernel stays."""
    removed = sum(evict_entry(root, entry.path) for entry in scan_entries(root, layout.TRITON)
                  if is_triton_crash(entry.path) and (not keys or any(entry.key.startswith(key) for key in keys)))
    return ({"forgotten_triton_crashes": removed},
            f"forgot {count_of(removed, 'remembered Triton crash', 'remembered Triton crashes')}: those configs "
            "compile again", 0)
