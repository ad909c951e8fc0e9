"""Reading a bundle file: opened once, safely, its tar headers parsed with every size capped before
a byte of what it sizes is read.

Opened once (`open_bundle`): without blocking (a FIFO at the path would block an open for reading
until someone writes it) and without following a link, then checked with fstat on that descriptor
(a regular file), then used blocking. Every read of the bundle is a pread on that descriptor, here
and in the stager processes, which inherit it (kcache.bundle.stager): nobody opens the path
again, so a file swapped in after the check is never read.

Why not tarfile: it reads a GNU long name's or a pax header's claimed size into memory before
anything can look at it (a 4 KB sparse file claiming 4 GB ends in a MemoryError), and follows GNU
sparse maps block after block. A bundle needs little of tar: ustar headers of regular files, pax
extended headers ('x': what tarfile writes for a long name or a large size) and GNU long names
('L'), whose payloads are capped at MAX_EXTENDED_HEADER_BYTES before they are read. Any other
member (a link, a device, a directory, a sparse file, a pax global header) is yielded as not
regular, and refused by name; a member's bytes are never read here, only located.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcache.bundle.entries import BundleError, read_exactly
from kcache.bundle.manifest import MANIFEST_MEMBER, MAX_MANIFEST_BYTES, MAX_SIGNATURE_BYTES, SIGNATURE_MEMBER
from kcache.store.components import KERNELS

BLOCK = 512
END_OF_ARCHIVE = bytes(BLOCK)  # the first of the two zero blocks that end an archive
# A member's long name or pax records: kcache's member names are under 100 bytes, so a header
# claiming more than this is no bundle of kcache's, and is refused before its payload is read.
MAX_EXTENDED_HEADER_BYTES = 4096
DIGEST_CHUNK = 1 << 20  # what a streamed digest holds at once
REGULAR_TYPES = (b"0", b"\0")
PAX_HEADER = b"x"
GNU_LONG_NAME = b"L"
GNU_LONG_LINK = b"K"  # a link's target: read (capped) and dropped, the link itself is refused
USTAR_MAGIC = b"ustar\0"  # POSIX ustar; GNU tar's "ustar  \0" header keeps other fields where ustar has its prefix
OCTAL_DIGITS = frozenset(b"01234567")
DAMAGED = "not a whole tar archive (truncated or damaged?)"
EXPORT_AGAIN = "export it again with kcache export"


@dataclass(frozen=True)
class BundleMember:
    """A member as its headers describe it; its bytes lie at `offset`, `size` long, unread."""

    name: str
    regular: bool  # a plain file: not a link, device, directory, or sparse file
    offset: int
    size: int


def tar_members(fd: int, file_size: int, path: Path) -> Iterator[BundleMember]:
    """The members of the tar archive on `fd`, in order, up to its end-of-archive block. Extended
    headers (pax, GNU long names) are applied to the member they precede, each read only once its
    claimed size is within MAX_EXTENDED_HEADER_BYTES. A member whose bytes would run past the end of
    the file, a damaged header, or a file that ends before the end-of-archive block: BundleError."""
    offset = 0
    # What the extended headers read so far say of the next member: its path, its size, whether it is
    # sparse. Only these are kept, so that a run of extended headers holds no more than one's worth.
    pending: dict[str, str] = {}
    while True:
        block = os.pread(fd, BLOCK, offset)
        if len(block) < BLOCK:
            raise BundleError(str(path), f"{DAMAGED}: it ends at byte {offset + len(block)}, before its "
                              f"end-of-archive block; {EXPORT_AGAIN}")
        if block == END_OF_ARCHIVE:
            return
        kind, name, size = _parse_header(block, offset, path)
        data = offset + BLOCK
        next_header = data + -(-size // BLOCK) * BLOCK
        if kind in (PAX_HEADER, GNU_LONG_NAME, GNU_LONG_LINK):
            payload = _read_extended(fd, data, size, offset, path)
            if kind == PAX_HEADER:
                records = _pax_records(payload, offset, path)
                pending.update({key: records[key] for key in ("path", "size") if key in records})
                if any(key.startswith("GNU.sparse.") for key in records):
                    pending["sparse"] = "yes"
            elif kind == GNU_LONG_NAME:
                pending["path"] = payload.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            offset = next_header
            continue
        if "size" in pending:
            size = int(pending["size"])
            next_header = data + -(-size // BLOCK) * BLOCK
        name = pending.get("path", name)
        regular = kind in REGULAR_TYPES and "sparse" not in pending
        pending = {}
        if data + size > file_size:
            raise BundleError(str(path), f"{name} is cut short: the archive is truncated; {EXPORT_AGAIN}")
        yield BundleMember(name, regular, data, size)
        offset = next_header


def _parse_header(block: bytes, offset: int, path: Path) -> tuple[bytes, str, int]:
    """A header block's type, name and size, its checksum verified."""
    stored = _number(block[148:156], offset, path)
    summed = block[:148] + block[156:]  # the checksum field itself counts as eight spaces
    unsigned = sum(summed) + 8 * 0x20
    if stored != unsigned and stored != unsigned - 256 * sum(byte >> 7 for byte in summed):  # old tars' signed sum
        raise BundleError(str(path), f"{DAMAGED}: the header at byte {offset} fails its checksum; {EXPORT_AGAIN}")
    name = block[:100].split(b"\0", 1)[0]
    if block[257:263] == USTAR_MAGIC:
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return block[156:157], name.decode("utf-8", "surrogateescape"), _number(block[124:136], offset, path)


def _number(field: bytes, offset: int, path: Path) -> int:
    """A header's numeric field: octal digits (NUL or space ended), or GNU's base-256 for large ones."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip(b" ")
    if not set(digits) <= OCTAL_DIGITS:  # a negative base-256 number, or garbage
        raise BundleError(str(path), f"{DAMAGED}: the header at byte {offset} holds a bad number; {EXPORT_AGAIN}")
    return int(digits, 8) if digits else 0


def _read_extended(fd: int, data: int, size: int, offset: int, path: Path) -> bytes:
    if size > MAX_EXTENDED_HEADER_BYTES:
        raise BundleError(str(path), f"the tar header at byte {offset} claims {size} bytes of long name or pax "
                          f"records, more than the {MAX_EXTENDED_HEADER_BYTES} a bundle's may have: not a kcache "
                          f"bundle, or a damaged one; {EXPORT_AGAIN}")
    return read_exactly(fd, data, size, path, f"the tar header at byte {offset}")


def _pax_records(payload: bytes, offset: int, path: Path) -> dict[str, str]:
    """A pax extended header's records, "<length> <key>=<value>\\n" each; a "size" must be a number."""
    records: dict[str, str] = {}
    position = 0
    while position < len(payload):
        space = payload.find(b" ", position)
        length = payload[position:space]
        if space < 0 or not length.isdigit() or not position < position + int(length) <= len(payload):
            break
        record = payload[space + 1: position + int(length)]
        key, equals, value = record.partition(b"=")
        if not equals or not record.endswith(b"\n"):
            break
        records[key.decode("utf-8", "surrogateescape")] = value[:-1].decode("utf-8", "surrogateescape")
        position += int(length)
    size = records.get("size", "0")
    if position != len(payload) or not (size.isascii() and size.isdigit()):
        raise BundleError(str(path), f"{DAMAGED}: the pax header at byte {offset} is malformed; {EXPORT_AGAIN}")
    return records


class BundleReader:
    """A bundle's members in archive order, each checked as it is reached: a regular file with a
    plain relative name, seen once. A link, a device, an absolute or `..` name or a duplicate refuses
    the bundle. A member's bytes are read with one pread at its offset (a member is contiguous)."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path
        self._members = tar_members(fd, os.fstat(fd).st_size, path)
        self._put_back: BundleMember | None = None
        self.seen: set[str] = set()

    def __iter__(self) -> Iterator[BundleMember]:
        return self

    def __next__(self) -> BundleMember:
        if self._put_back is not None:
            member, self._put_back = self._put_back, None
            return member
        member = next(self._members)
        name = member.name
        parts = name.split("/")
        if name.startswith("/") or ".." in parts or "" in parts or "." in parts:
            raise BundleError(str(self.path), f"member {name!r} is not a plain relative path")
        if not member.regular:
            raise BundleError(str(self.path), f"member {name!r} is not a regular file (a link or a device)")
        if name in self.seen:
            raise BundleError(str(self.path), f"member {name!r} appears twice")
        self.seen.add(name)
        return member

    def read_manifest(self) -> bytes:
        """The bundle manifest: the first member, always."""
        return self.read(self.manifest_member(), MAX_MANIFEST_BYTES)

    def manifest_member(self) -> BundleMember:
        """The manifest's header, its bytes not read (the first member, always)."""
        first = next(self, None)
        if first is None or first.name != MANIFEST_MEMBER:
            raise BundleError(str(self.path), f"its first member is not {MANIFEST_MEMBER}: not a kcache bundle")
        if first.size > MAX_MANIFEST_BYTES:
            raise BundleError(str(self.path), f"{first.name} is {first.size} bytes, more than a bundle's manifest "
                              "may be")
        return first

    def digest_of(self, member: BundleMember, digest: Any) -> Any:
        """`digest` (hashlib's or hmac's) updated with the member's bytes, read a chunk at a time: a
        signature is checked before a manifest is held whole."""
        for offset in range(0, member.size, DIGEST_CHUNK):
            digest.update(self.read_at(member.name, member.offset + offset, min(DIGEST_CHUNK, member.size - offset)))
        return digest

    def read_signature(self) -> bytes | None:
        """The signature, the member right after the manifest where the bundle is signed."""
        second = next(self, None)
        if second is not None and second.name == SIGNATURE_MEMBER:
            return self.read(second, MAX_SIGNATURE_BYTES)
        self._put_back = second
        return None

    def read(self, member: BundleMember, cap: int) -> bytes:
        """A member's bytes, refused before they are read when it claims more than `cap`."""
        name = member.name
        if member.size > cap:
            raise BundleError(str(self.path), f"{name} is {member.size} bytes, more than a bundle's "
                              f"{name.rsplit('/', 1)[-1]} may be")
        return self.read_at(name, member.offset, member.size)

    def read_at(self, name: str, offset: int, size: int, key: str | None = None) -> bytes:
        return read_exactly(self.fd, offset, size, self.path, f"{KERNELS}/{key}/{name}" if key is not None else name)


def open_bundle_fd(path: Path) -> int:
    """A descriptor of the bundle file at `path`, opened once: without blocking and without following
    a link, checked to be a regular file on that descriptor, then made blocking. A FIFO, a device, a
    directory or a symlink at the path is a BundleError at once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP and os.path.islink(path):
            raise BundleError(str(path), "it is a symbolic link, which kcache does not follow to a bundle: "
                              "name the bundle file itself") from None
        raise BundleError(str(path), f"cannot open it: {err.strerror or err}") from err
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise BundleError(str(path), f"it is {_kind(mode)}, not a regular file: name the bundle file that "
                              "kcache export wrote")
        os.set_blocking(fd, True)  # the stagers inherit its open file: a plain one
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    kinds = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device",
             stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}
    return kinds.get(stat.S_IFMT(mode), "not a plain file")


@contextmanager
def open_bundle(path: Path) -> Iterator[BundleReader]:
    """The bundle's members, read as they come (`BundleReader`), from one descriptor (`open_bundle_fd`)
    held for the block."""
    fd = open_bundle_fd(path)
    try:
        yield BundleReader(fd, path)
    finally:
        os.close(fd)
