"""The manifest: size and sha256 of every file of an entry, written last.

An entry is trusted only through its manifest. Verification reads every
byte before anything is loaded, so a truncated .so is a miss, not a SIGBUS.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from .errors import CorruptEntry
from .fsutil import read_nofollow, sha256_hex

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1


def build_manifest(directory: Path) -> bytes:
    """Describe every regular file in `directory` (which must hold nothing else)."""
    files: dict[str, dict[str, object]] = {}
    for item in sorted(os.scandir(directory), key=lambda e: e.name):
        if item.name == MANIFEST_NAME:
            continue
        if not item.is_file(follow_symlinks=False):
            raise ValueError(f"{item.path}: staging directories may hold only regular files")
        data = read_nofollow(Path(item.path))
        files[item.name] = {"size": len(data), "sha256": sha256_hex(data)}
    return json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1, sort_keys=True).encode()


def verify_entry(directory: Path, required: frozenset[str]) -> dict[str, bytes]:
    """Return the verified contents of every file of the entry at `directory`.

    Raises FileNotFoundError when the entry does not exist (a miss, possibly
    because it vanished between lookup and read) and CorruptEntry when it
    exists but is not exactly what its manifest describes.
    """
    try:
        manifest_bytes = read_nofollow(directory / MANIFEST_NAME)
    except FileNotFoundError:
        if os.path.isdir(directory):
            raise CorruptEntry(str(directory), "manifest.json is missing") from None
        raise
    except OSError as err:
        raise CorruptEntry(str(directory), f"manifest.json cannot be read: {err}") from err
    files = _parse_manifest(directory, manifest_bytes)
    missing = required - files.keys()
    if missing:
        raise CorruptEntry(str(directory), f"manifest lacks required file(s) {sorted(missing)}")
    present = _list_files(directory)
    unexpected = present - files.keys() - {MANIFEST_NAME}
    if unexpected:
        raise CorruptEntry(str(directory), f"unexpected file(s) {sorted(unexpected)}")
    contents: dict[str, bytes] = {}
    for name, meta in files.items():
        try:
            data = read_nofollow(directory / name)
        except FileNotFoundError:
            if not os.path.isdir(directory):
                raise  # the whole entry vanished (quarantined or evicted): a miss
            raise CorruptEntry(str(directory), f"{name} is missing") from None
        except OSError as err:
            raise CorruptEntry(str(directory), f"{name} cannot be read: {err.strerror or err}") from err
        if len(data) != meta["size"]:
            raise CorruptEntry(str(directory), f"{name} has {len(data)} bytes, manifest says {meta['size']}")
        if sha256_hex(data) != meta["sha256"]:
            raise CorruptEntry(str(directory), f"{name} does not match its sha256")
        contents[name] = data
    return contents


def _parse_manifest(directory: Path, raw: bytes) -> dict[str, dict]:
    try:
        doc = json.loads(raw)
        files = doc["files"]
        if doc.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError("unknown manifest format")
        for name, meta in files.items():
            if "/" in name or name in ("", ".", "..") or name == MANIFEST_NAME:
                raise ValueError(f"bad file name {name!r}")
            if not isinstance(meta.get("size"), int) or not isinstance(meta.get("sha256"), str):
                raise ValueError(f"bad record for {name!r}")
        return files
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CorruptEntry(str(directory), f"manifest.json is unreadable: {err}") from None


def _list_files(directory: Path) -> set[str]:
    names = set()
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        raise
    except OSError as err:
        raise CorruptEntry(str(directory), f"cannot list the entry: {err}") from err
    for item in entries:
        mode = item.stat(follow_symlinks=False).st_mode
        if not stat.S_ISREG(mode):
            raise CorruptEntry(str(directory), f"{item.name} is not a regular file")
        names.add(item.name)
    return names
