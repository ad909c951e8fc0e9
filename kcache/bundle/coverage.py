"""`kcache verify-coverage`: which recorded keys a bundle (or a root) lacks, that is, what would compile."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kcache.bundle.manifest import parse_manifest
from kcache.bundle.reader import open_bundle
from kcache.bundle.sections import SECTIONS
from kcache.store import owned_files
from kcache.store.components import COMPONENTS, KERNELS
from kcache.store.entries import EntryStore
from kcache.store.layout import is_key


def read_key_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The keys of a file, as records {"key", "kernel", "target"}: one key per line, or JSON lines with
    a "key" (what KCACHE_RECORD writes). Each key once, in the file's order. The file is read once,
    bounded, never through a link, and refused if anybody may write it (`owned_files.read_key_file`)."""
    records: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(owned_files.read_key_file(path).splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            record = json.loads(line) if line.startswith("{") else {"key": line}
        except ValueError:
            record = {}
        key = record.get("key") if isinstance(record, dict) else None
        if not isinstance(key, str) or not is_key(key):
            raise ValueError(f"{path}:{number}: {line[:80]!r} is not a cache key (64 hex digits, or a JSON line "
                             'with a "key")')
        records.setdefault(key, record)
    return list(records.values())


def read_key_list(path: str | os.PathLike[str]) -> list[str]:
    return [record["key"] for record in read_key_records(path)]


def bundle_keys(bundle: str | os.PathLike[str]) -> dict[str, str]:
    """The keys a bundle holds (its sections' entries too: Triton's, Helion's), with their archs, from its
    manifest (checked in form, not in content: `import_bundle` verifies the rest)."""
    path = Path(bundle)
    with open_bundle(path) as reader:
        manifest = parse_manifest(reader.read_manifest(), path)
    return {key: entry["arch"] for listing in ("entries", *(section.folder for section in SECTIONS))
            for key, entry in manifest[listing].items()}


def missing_coverage(records: list[dict[str, Any]], *, bundle: str | os.PathLike[str] | None = None,
                     root: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """The records whose key is in neither `bundle` nor `root` (one of them, at least, is given): what
    would compile."""
    held: set[str] = set()
    if bundle is not None:
        held |= set(bundle_keys(bundle))
    if root is not None:
        held |= set(EntryStore(Path(root), KERNELS, COMPONENTS, bind_key=True).keys())
        for section in SECTIONS:  # Triton's groups, Helion's picks
            held |= set(section.store_of(Path(root)).keys())
    return [record for record in records if record["key"] not in held]
