"""The manifest: size and sha256 of every file of an entry, written last.

An entry is trusted only through its manifest. Verification reads every
byte before anything is loaded, so a truncated .so is a miss, not a SIGBUS.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterable, Mapping
from hashlib import sha256
from pathlib import Path

from kcache.errors import CorruptEntry, UntrustedEntry
from kcache.store import dirfd, sharing, trust
from kcache.store.bounded_read import read_fd, read_regular_at

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1


def build_manifest(directory: Path) -> bytes:
    """Describe every regular file in `directory` (which must hold nothing else)."""
    fd = os.open(directory, dirfd.DIR_FLAGS)
    try:
        return build_manifest_at(fd, directory)
    finally:
        os.close(fd)


def build_manifest_at(dir_fd: int, directory: Path) -> bytes:
    """build_manifest of the directory open as `dir_fd` (`directory` names it in errors)."""
    files: dict[str, tuple[int, str]] = {}
    for item in sorted(os.scandir(dir_fd), key=lambda e: e.name):
        if item.name == MANIFEST_NAME:
            continue
        if not item.is_file(follow_symlinks=False):
            raise ValueError(f"{directory / item.name}: staging directories may hold only regular files")
        data = read_regular_at(dir_fd, item.name, MAX_COMPONENT_BYTES)
        files[item.name] = (len(data), sha256(data).hexdigest())
    return format_manifest(files)


def format_manifest(files: Mapping[str, tuple[int, str]]) -> bytes:
    """The manifest of files given as name -> (size, sha256 hex): what build_manifest writes, for a
    writer that already hashed the bytes it stages (a batch publish)."""
    listing = {name: {"size": size, "sha256": digest} for name, (size, digest) in sorted(files.items())}
    return json.dumps({"format": MANIFEST_FORMAT, "files": listing}, indent=1, sort_keys=True).encode()


_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a FIFO planted in an entry never hangs us
# Sizes come from fstat and are checked before a byte is read: a manifest is a few hundred bytes, and
# no component of a kernel comes near this (a sparse 1 TiB file is refused, not read into memory).
MAX_MANIFEST_BYTES = 1 << 20
MAX_COMPONENT_BYTES = 1 << 30


class _Trust:
    """Where trust is checked (the root and its group); None for a directory of our own (staging)."""

    __slots__ = ("root", "group")

    def __init__(self, root: Path) -> None:
        self.root = root
        self.group = sharing.trusted_group(root)


def _read_regular(dir_fd: int, directory: Path, name: str, expected: int | None, limit: int,
                  checked: _Trust | None) -> bytes:
    """Read `name` under `dir_fd`: a regular file only, never through a symlink, checked (trust, size)
    on its descriptor before anything is read, then exactly the bytes fstat promised."""
    fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    try:
        if checked is not None:
            info = trust.check_file(fd, lambda: str(directory / name), checked.group)
        else:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
        if expected is not None and info.st_size != expected:
            raise CorruptEntry(str(directory), f"{name} has {info.st_size} bytes, manifest says {expected}")
        if info.st_size > limit:
            raise CorruptEntry(str(directory), f"{name} has {info.st_size} bytes, more than kcache ever writes")
        return read_fd(fd, info.st_size)
    finally:
        os.close(fd)


def verify_entry(directory: Path, required: frozenset[str], *, trust_root: Path | None = None,
                 exact: bool = False) -> dict[str, bytes]:
    """Return the verified contents of every file of the entry at `directory`.

    Raises FileNotFoundError when the entry does not exist (a miss, possibly
    because it vanished between lookup and read) and CorruptEntry when it
    exists but is not exactly what its manifest describes.

    With `trust_root`, every directory from that root down to the entry and
    every file is opened by descriptor and trust-checked on it before it is
    read (UntrustedEntry otherwise): what is verified is what was checked.
    The directory is opened once and every file relative to it, so the whole
    verification is about the same directory even if the path is renamed
    meanwhile (quarantine).
    """
    checked = _Trust(trust_root) if trust_root is not None else None
    try:
        if checked is not None:
            dir_fd = trust.open_trusted_dir(checked.root, directory.parts[len(checked.root.parts):])
        else:
            dir_fd = os.open(directory, dirfd.DIR_FLAGS)
    except (FileNotFoundError, UntrustedEntry):
        raise
    except OSError as err:
        raise CorruptEntry(str(directory), f"cannot open the entry: {err.strerror or err}") from err
    try:
        return _verify_at(dir_fd, directory, required, checked, exact)
    finally:
        os.close(dir_fd)


def read_verified(directory: Path, required: frozenset[str], *, trust_root: Path | None = None,
                  exact: bool = False) -> dict[str, bytes] | None:
    """verify_entry, where an entry that does not exist (or vanished meanwhile) is a miss: None."""
    try:
        return verify_entry(directory, required, trust_root=trust_root, exact=exact)
    except FileNotFoundError:
        return None


def verify_entry_at(dir_fd: int, directory: Path, required: frozenset[str], *, exact: bool = False) -> dict[str, bytes]:
    """verify_entry of a directory of our own, open as `dir_fd` (a staging directory held since it
    was made): what is verified is that directory, whatever its path now leads to."""
    return _verify_at(dir_fd, directory, required, None, exact)


def _verify_at(dir_fd: int, directory: Path, required: frozenset[str], checked: _Trust | None,
               exact: bool) -> dict[str, bytes]:
    try:
        manifest_bytes = _read_regular(dir_fd, directory, MANIFEST_NAME, None, MAX_MANIFEST_BYTES, checked)
    except FileNotFoundError:
        raise CorruptEntry(str(directory), "manifest.json is missing") from None
    except (CorruptEntry, UntrustedEntry):
        raise
    except OSError as err:
        raise CorruptEntry(str(directory), f"manifest.json cannot be read: {err}") from err
    files = _parse_manifest(directory, manifest_bytes)
    _check_names(str(directory), files.keys(), required, exact)
    present = _list_files(dir_fd, directory)
    unexpected = present - files.keys() - {MANIFEST_NAME}
    if unexpected:
        raise CorruptEntry(str(directory), f"unexpected file(s) {sorted(unexpected)}")
    contents: dict[str, bytes] = {}
    for name, meta in files.items():
        try:
            data = _read_regular(dir_fd, directory, name, meta["size"], MAX_COMPONENT_BYTES, checked)
        except FileNotFoundError:
            if not _same_directory(dir_fd, directory):
                raise  # the whole entry vanished (evicted): a miss
            raise CorruptEntry(str(directory), f"{name} is missing") from None
        except (CorruptEntry, UntrustedEntry):
            raise
        except OSError as err:
            raise CorruptEntry(str(directory), f"{name} cannot be read: {err.strerror or err}") from err
        if sha256(data).hexdigest() != meta["sha256"]:
            raise CorruptEntry(str(directory), f"{name} does not match its sha256")
        contents[name] = data
    return contents


def verify_contents(where: str, files: dict[str, bytes], required: frozenset[str], exact: bool = True) -> None:
    """Check an entry held in memory (a remote value): exactly the manifest's files, which are exactly
    the `required` components (`exact=False`: at least them; the kind checks the rest), each matching it.

    Raises CorruptEntry naming `where`."""
    if MANIFEST_NAME not in files:
        raise CorruptEntry(where, "manifest.json is missing")
    listed = _parse_manifest(Path(where), files[MANIFEST_NAME])
    _check_names(where, listed.keys(), required, exact=exact)
    if set(files) != set(listed) | {MANIFEST_NAME}:
        raise CorruptEntry(where, f"files {sorted(files)} differ from the manifest's {sorted(listed)}")
    for name, meta in listed.items():
        if len(files[name]) != meta["size"] or sha256(files[name]).hexdigest() != meta["sha256"]:
            raise CorruptEntry(where, f"{name} does not match the manifest")


def _check_names(where: str, listed: Iterable[str], required: frozenset[str], exact: bool) -> None:
    """The manifest lists every required component; with `exact` (kernel entries) nothing else: an
    extra file would be published and served along with the entry, and verify would call it good."""
    names = set(listed)
    if not required <= names or (exact and names != required):
        missing, extra = sorted(required - names), sorted(names - required)
        raise CorruptEntry(where, "manifest " + "; ".join(filter(None, [
            f"lacks required file(s) {missing}" if missing else "", f"lists unexpected file(s) {extra}" if extra else ""])))


# An entry's file name: 1 to 128 of these ASCII characters, the first not "." or "-". Sets, not a
# regular expression: compiling one costs 0.1-0.2 ms at import, on a fresh process's hit.
_NAME_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_NAME_CHARS = _NAME_FIRST | {".", "-"}


def is_entry_file_name(name: str) -> bool:
    """Whether `name` may name a file of an entry: one plain path component (no `/`, no `..`, not
    hidden), never the manifest itself."""
    return (isinstance(name, str) and 0 < len(name) <= 128 and name[0] in _NAME_FIRST and _NAME_CHARS.issuperset(name)
            and name != MANIFEST_NAME)


def _parse_manifest(directory: Path, raw: bytes) -> dict[str, dict]:
    try:
        doc = json.loads(raw)
        files = doc["files"]
        if doc.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError("unknown manifest format")
        for name, meta in files.items():
            if not is_entry_file_name(name):
                raise ValueError(f"bad file name {name!r}")
            if not isinstance(meta.get("size"), int) or meta["size"] < 0 or not isinstance(meta.get("sha256"), str):
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
