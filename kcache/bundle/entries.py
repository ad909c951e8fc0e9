"""One bundle entry's import: its bytes checked against the signed bundle manifest, then staged.

Shared by the two ways an import stages (kcache.bundle.importer: threads, for small bundles;
kcache.bundle.stager: processes, for large ones), so both check exactly the same things.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from kcache.errors import CorruptEntry, KCacheError
from kcache.store.components import KERNELS, META
from kcache.store.entries import EntryStore, check_bound_key
from kcache.store.layout import TRITON  # the manifest's section and the members' folder of Triton's entries
from kcache.store.publish_batch import PublishBatch
from kcache.triton.store import META as TRITON_META
from kcache.triton.store import bound_meta
from kcache.triton.store import entry_key as triton_entry_key


class BundleError(KCacheError, ValueError):
    """A bundle that cannot be written or is refused; `path` and `reason` say which and why."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        self._init_args = (path, reason)
        super().__init__(f"bundle {path}: {reason}")


def check_bound(key: str, meta: bytes, path: Path) -> None:
    """BundleError unless the entry's meta.json names `key` (an entry moved under another key)."""
    try:
        check_bound_key(f"{path}: {KERNELS}/{key}", {META: meta}, key)
    except CorruptEntry as corrupt:
        raise BundleError(str(path), corrupt.reason) from None


def check_triton_bound(key: str, files: dict[str, bytes], path: Path) -> None:
    """BundleError unless a Triton entry's kcache-triton.json names `key` and exactly the entry's files
    (kcache.triton.store's check on a read), and `key` is the name of the Triton key it names."""
    meta = bound_meta(files, key)
    if not isinstance(meta, str):
        listed, group = meta["files"], meta.get("group")
        lone = listed[0] if group is None and len(listed) == 1 else None
        if group is not None and (not isinstance(group, str) or group not in listed or not group.endswith(".json")):
            meta = f"{TRITON_META} names the group {group!r}, which is not among its files"
        elif group is None and lone is None:
            meta = f"{TRITON_META} names no group, yet lists {len(listed)} files (a lone file's entry holds one)"
        elif isinstance(meta.get("triton_key"), str) and triton_entry_key(meta["triton_key"], lone) == key:
            return
        else:
            meta = f"{TRITON_META} names a Triton key whose entry is not {key[:16]}"
    raise BundleError(str(path), f"{TRITON}/{key}: {meta} (an entry moved under another key, or not one of "
                      "kcache's)")


def read_exactly(fd: int, offset: int, size: int, path: Path, where: str) -> bytes:
    """`size` bytes of the bundle at `offset`, with one pread (a member is contiguous); a short read
    means the archive was cut."""
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise BundleError(str(path), f"{where} is cut short: the archive is truncated")
    return data


class EntryFate(Enum):
    STAGED = "staged"
    FILTERED_OUT = "filtered_out"  # built for an arch not asked for
    ALREADY_PRESENT = "already_present"


@dataclass(frozen=True)
class EntryImport:
    """What a worker needs to verify one entry's bytes and stage it."""

    store: EntryStore
    batch: PublishBatch
    allowed_archs: set[str] | None
    path: Path
    folder: str = KERNELS  # the members' folder: KERNELS, or a section's (kcache.bundle.sections)
    check_section_bound: Callable[[str, dict[str, bytes], Path], None] | None = None  # a section's; None: a kernel's

    def verify_and_stage(self, key: str, entry: dict[str, Any], files: dict[str, bytes]) -> EntryFate:
        """Every file of `key` against the signed bundle manifest and its meta.json (a section's record)
        naming `key` (filtered and present entries too: a bundle is refused whole), then staged where
        wanted."""
        digests = {component: hashlib.sha256(data).hexdigest() for component, data in files.items()}
        for component, data in files.items():
            size, digest = entry["files"][component]
            if len(data) != size or digests[component] != digest:
                raise BundleError(str(self.path), f"{self.folder}/{key}/{component} does not match the bundle "
                                  "manifest (changed or swapped)")
        if self.check_section_bound is not None:
            self.check_section_bound(key, files, self.path)
        else:
            check_bound(key, files[META], self.path)
        if not arch_allowed(entry["arch"], self.allowed_archs):
            return EntryFate.FILTERED_OUT
        if self.store.entry_path(key).is_dir():
            return EntryFate.ALREADY_PRESENT
        self.batch.stage(key, files, digests)
        return EntryFate.STAGED


ANY_ARCH = frozenset({"triton", "helion"})  # a lone Triton file's, a Helion pick's (keyed on its device)


def arch_allowed(arch: str, allowed: set[str] | None) -> bool:
    """Whether an entry of `arch` is wanted where `allowed` archs are: Triton names CUDA's 90 `sm_90`,
    which TileLang's `sm_90a` asks for too; a lone Triton file and a Helion pick go with any arch."""
    return allowed is None or arch in allowed or f"{arch}a" in allowed or arch in ANY_ARCH
