"""The manifest: size and sha256 of every file of an entry, written last.

An entry is trusted only through its manifest. Verification reads every
byte before anything is loaded, so a truncated .so is a miss, not a SIGBUS.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from hashlib import sha256
from pathlib import Path

from kcache.errors import CorruptEntry
from kcache.store.fsutil import read_nofollow, sha256_hex

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


_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a FIFO planted in an entry never hangs us


def _read_regular(dir_fd: int, name: str) -> bytes:
    """Read `name` under `dir_fd`: a regular file only, never through a symlink.

    Reads the st_size bytes fstat reports, in one read(2) for any entry file:
    no extra read to see EOF. A file that grows afterwards is caught by the
    size check and the sha256 (what is verified is exactly what was read).
    """
    fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        size = st.st_size
        data = os.read(fd, size)
        if len(data) < size:  # a short read (a file shrinking meanwhile, some network filesystems)
            chunks = [data]
            remaining = size - len(data)
            while remaining > 0:
                chunk = os.read(fd, remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            data = b"".join(chunks)
        return data
    finally:
        os.close(fd)


def verify_entry(directory: Path, required: frozenset[str]) -> dict[str, bytes]:
    """Return the verified contents of every file of the entry at `directory`.

    Raises FileNotFoundError when the entry does not exist (a miss, possibly
    because it vanished between lookup and read) and CorruptEntry when it
    exists but is not exactly what its manifest describes.

    The directory is opened once and every file is opened relative to it, so
    the whole verification is about the same directory even if the path is
    renamed meanwhile (quarantine), and no path is parsed per file.
    """
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise CorruptEntry(str(directory), f"cannot open the entry: {err.strerror or err}") from err
    try:
        return _verify_at(dir_fd, directory, required)
    finally:
        os.close(dir_fd)


def _verify_at(dir_fd: int, directory: Path, required: frozenset[str]) -> dict[str, bytes]:
    try:
        manifest_bytes = _read_regular(dir_fd, MANIFEST_NAME)
    except FileNotFoundError:
        raise CorruptEntry(str(directory), "manifest.json is missing") from None
    except OSError as err:
        raise CorruptEntry(str(directory), f"manifest.json cannot be read: {err}") from err
    files = _parse_manifest(directory, manifest_bytes)
    missing = required - files.keys()
    if missing:
        raise CorruptEntry(str(directory), f"manifest lacks required file(s) {sorted(missing)}")
    present = _list_files(dir_fd, directory)
    unexpected = present - files.keys() - {MANIFEST_NAME}
    if unexpected:
        raise CorruptEntry(str(directory), f"unexpected file(s) {sorted(unexpected)}")
    contents: dict[str, bytes] = {}
    for name, meta in files.items():
        try:
            data = _read_regular(dir_fd, name)
        except FileNotFoundError:
            if not _same_directory(dir_fd, directory):
                raise  # the whole entry vanished (evicted): a miss
            raise CorruptEntry(str(directory), f"{name} is missing") from None
        except OSError as err:
            raise CorruptEntry(str(directory), f"{name} cannot be read: {err.strerror or err}") from err
        if len(data) != meta["size"]:
            raise CorruptEntry(str(directory), f"{name} has {len(data)} bytes, manifest says {meta['size']}")
        if sha256(data).hexdigest() != meta["sha256"]:
            raise CorruptEntry(str(directory), f"{name} does not match its sha256")
        contents[name] = data
    return contents


def verify_contents(where: str, files: dict[str, bytes], required: frozenset[str]) -> None:
    """Check an entry held in memory (a remote value): exactly the manifest's files, each matching it.

    Raises CorruptEntry naming `where`."""
    if MANIFEST_NAME not in files:
        raise CorruptEntry(where, "manifest.json is missing")
    listed = _parse_manifest(Path(where), files[MANIFEST_NAME])
    missing = required - listed.keys()
    if missing:
        raise CorruptEntry(where, f"manifest lacks required file(s) {sorted(missing)}")
    if set(files) != set(listed) | {MANIFEST_NAME}:
        raise CorruptEntry(where, f"files {sorted(files)} differ from the manifest's {sorted(listed)}")
    for name, meta in listed.items():
        if len(files[name]) != meta["size"] or sha256(files[name]).hexdigest() != meta["sha256"]:
            raise CorruptEntry(where, f"{name} does not match the manifest")


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


def _same_directory(dir_fd: int, directory: Path) -> bool:
    try:
        here, there = os.fstat(dir_fd), os.stat(directory)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino) and here.st_nlink > 0


def _list_files(dir_fd: int, directory: Path) -> set[str]:
    names = set()
    try:
        entries = list(os.scandir(dir_fd))
    except OSError as err:
        raise CorruptEntry(str(directory), f"cannot list the entry: {err}") from err
    for item in entries:
        # d_type from getdents: no stat per file (DirEntry falls back to fstatat when unknown)
        if not item.is_file(follow_symlinks=False):
            raise CorruptEntry(str(directory), f"{item.name} is not a regular file")
        names.add(item.name)
    return names
