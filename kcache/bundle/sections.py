"""A bundle's sections beside TileLang's kernels: Triton's compile groups (kcache.triton) and Helion's
autotune picks (kcache.helion).

Each section is a store of its own under the root, a folder of members in the bundle and a listing in
its manifest, all three under one name (kcache.store.layout). This table says how a section's entries
are listed, checked, placed and named, so that export, import and the coverage check treat every
section alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kcache.bundle.entries import TRITON_META, BundleError, check_triton_bound
from kcache.helion import store as helion_store
from kcache.store.layout import HELION, TRITON
from kcache.store.manifest import MANIFEST_NAME, is_entry_file_name
from kcache.triton.store import kernel_name
from kcache.triton.store import store_of as triton_store_of

if TYPE_CHECKING:
    from kcache.store.entries import EntryStore


@dataclass(frozen=True)
class Section:
    folder: str  # the manifest's key, the members' folder, the namespace under the root
    owner: str  # "Triton's": how reports and messages name its entries
    meta: str  # the record of kcache's that each entry holds (its key, its creation time)
    store_of: Callable[[Path], EntryStore]
    listed_files_fit: Callable[[set[str]], bool]  # the manifest's listing of an entry is one of this section's
    check_bound: Callable[[str, dict[str, bytes], Path], None]  # BundleError unless the files are `key`'s entry
    arch: Callable[[dict[str, bytes]], str]  # the arch `archs=` filters on
    kernel: Callable[[dict[str, bytes]], str]  # the name the manifest lists

    def created(self, files: dict[str, bytes]) -> float:
        return float(json.loads(files[self.meta]).get("created", 0))


def triton_arch(files: dict[str, bytes]) -> str:
    """The arch a Triton entry was compiled for, from its group's metadata (Triton's `target`):
    `sm_90` for CUDA's 90; `triton` where no metadata says (a lone file: a launcher, timings)."""
    for name, data in sorted(files.items()):
        if name.endswith(".json") and name != TRITON_META and name != MANIFEST_NAME:
            try:
                target = json.loads(data).get("target")
            except (ValueError, AttributeError):
                continue
            if isinstance(target, dict) and target.get("backend") == "cuda" and isinstance(target.get("arch"), int):
                return f"sm_{target['arch']}"
    return "triton"


def _triton_kernel(files: dict[str, bytes]) -> str:
    meta = json.loads(files[TRITON_META])
    return kernel_name(str(meta.get("group") or (meta["files"] or ["?"])[0]))


def _triton_listing_fits(names: set[str]) -> bool:
    return {TRITON_META, MANIFEST_NAME} <= names and all(is_entry_file_name(n) for n in names - {MANIFEST_NAME})


def _check_helion_bound(key: str, files: dict[str, bytes], path: Path) -> None:
    """BundleError unless a Helion entry's record names `key` and a Helion key whose entry is `key`, and
    its value is a pick Helion may read (kcache.helion.store's check on a read)."""
    try:
        helion_store.bound_value(files, key, f"{HELION}/{key}")
    except ValueError as refused:
        raise BundleError(str(path), f"{refused} (not one of kcache's Helion entries)") from None


TRITON_SECTION = Section(TRITON, "Triton's", TRITON_META, triton_store_of, _triton_listing_fits, check_triton_bound,
                         triton_arch, _triton_kernel)
# A pick is keyed by Helion on its device among the rest, so it goes with any arch.
HELION_SECTION = Section(HELION, "Helion's", helion_store.META, helion_store.store_of,
                         lambda names: names == helion_store.FILES | {MANIFEST_NAME}, _check_helion_bound,
                         lambda files: "helion", lambda files: "helion pick")
SECTIONS = (TRITON_SECTION, HELION_SECTION)
