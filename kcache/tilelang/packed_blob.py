"""The device binary's C source (`devc.c`), spelled so that the compiler reads it in a tenth of the time.

TVM packs a kernel's device binary into a C array, one `0x..,` per byte, and the library's link
compiles that source: for a 1024³ matmul (a 100 KB cubin, 500 KB of C) `g++ -c devc.c` takes
0.1-0.25 s, most of what is left of the link once the host code was compiled beside nvcc
(kcache/tilelang/host_prebuild.py), and it runs after nvcc, on the first compile's critical path. The
compiler spends that time on the tokens: the same bytes as one string literal compile in 0.01-0.02 s.

The respelled source is compiled by the same command from a file of the same name (the name is in
the object's symbols), and differs from TVM's only in the initializer's spelling; GCC turns both into
the same constant. That claim is not taken on trust: once per process, compiler and flags, a probe
array (every byte value, ending in a zero) is compiled in both spellings, and the objects must be
equal byte for byte, or the link compiles TVM's source as it is. A source that is not exactly TVM's
format (each byte rendered back must give the file's text) is left alone, and so is an array whose
last byte is not zero: C++ needs the literal's terminating zero to fit in the array.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable

# TVM's ModulePackImportsToC: a header, the array (20 bytes a line, each `0x%02x,`), a footer.
_DECLARATION = re.compile(r"\bconst unsigned char (?P<symbol>[A-Za-z_][A-Za-z0-9_]*)\[(?P<size>[0-9]+)\] = \{\n")
_CLOSE = "\n};\n"
_PER_LINE = 20
_LITERAL_CHUNK = 64
# Every byte value, a run of zeros, ending in zero: what a real blob may hold, in small.
PROBE_BYTES = bytes(range(256)) + bytes(range(255, -1, -1)) + bytes(48) + b"\x7f\x80\xff\x00"

log = logging.getLogger("kcache")

_verdicts: dict[tuple[object, ...], bool] = {}
_verdicts_lock = threading.Lock()


class PackedSource:
    """A parsed `devc.c`: TVM's text around the array, and the array's bytes."""

    __slots__ = ("head", "symbol", "data", "tail")

    def __init__(self, head: str, symbol: str, data: bytes, tail: str) -> None:
        self.head = head  # up to and including "] = {\n", the array's size in it
        self.symbol = symbol
        self.data = data
        self.tail = tail  # from "\n};\n" on

    def with_data(self, data: bytes) -> PackedSource:
        """The same source around another array (the probe's)."""
        head = re.sub(r"\[[0-9]+\] = \{\n\Z", f"[{len(data)}] = {{\n", self.head)
        return PackedSource(head, self.symbol, data, self.tail)

    def braces(self) -> str:
        """The text TVM writes for this array."""
        tokens = "0x" + self.data.hex(",").replace(",", ",0x") + ","  # "0xce,0x37,...": 5 characters a byte
        width = 5 * _PER_LINE
        return self.head + "\n".join("  " + tokens[i:i + width] for i in range(0, len(tokens), width)) + self.tail

    def literal(self) -> str:
        """The same array as one string literal (its implicit zero is the array's last byte). Each
        byte is a `\\xNN` escape: every escape is followed by a backslash or a quote, so none runs
        into the next byte."""
        data = self.data[:-1]
        chunks = ['  "\\x' + data[i:i + _LITERAL_CHUNK].hex(" ").replace(" ", "\\x") + '"'
                  for i in range(0, len(data), _LITERAL_CHUNK)] or ['  ""']
        head = self.head[:-len("{\n")] + "\n"  # "... ] = \n"
        return head + "\n".join(chunks) + ";" + self.tail[len("\n};"):]

    def key(self) -> tuple[str, str, str]:
        """What the probe's verdict depends on besides the command: the text around the array."""
        return (re.sub(r"\[[0-9]+\]", "[]", self.head), self.symbol, self.tail)


def parse(text: str) -> PackedSource | None:
    """`text` as TVM's packed array, or None where it is anything else (or its last byte is not zero)."""
    opening = text.find("] = {\n") + len("] = {\n")  # the array's definition: the first initializer
    line_start = text.rfind("\n", 0, opening - 1) + 1
    declaration = _DECLARATION.match(text, line_start, opening)
    close = text.rfind(_CLOSE)
    if declaration is None or declaration.end() != opening or close < opening:
        return None
    try:
        data = bytes.fromhex(text[declaration.end():close].replace("0x", "").replace(",", "").replace("\n  ", ""))
    except ValueError:
        return None
    if not data or len(data) != int(declaration.group("size")) or data[-1] != 0:
        return None
    packed = PackedSource(text[:declaration.end()], declaration.group("symbol"), data, text[close:])
    return packed if packed.braces() == text else None  # exactly TVM's rendering of these bytes


def read(path: str, limit: int = 1 << 30) -> PackedSource | None:
    """The packed source at `path`, if it is one (a file over `limit` bytes is left alone)."""
    try:
        with open(path, encoding="ascii") as source:
            text = source.read(limit + 1)
    except (OSError, UnicodeDecodeError):
        return None
    return parse(text) if len(text) <= limit else None


def write_source(directory: str, name: str, text: str) -> str:
    """`text` as `directory/name`, a fresh private directory's file (the name stays the source's)."""
    os.mkdir(directory, 0o700)
    path = os.path.join(directory, name)
    with open(path, "x", encoding="ascii") as out:
        out.write(text)
    return path


def verdict(key: tuple[object, ...]) -> bool | None:
    """The probe's verdict for this command and text around the array, if one was reached."""
    with _verdicts_lock:
        return _verdicts.get(key)


def record(key: tuple[object, ...], equal: bool) -> None:
    with _verdicts_lock:
        _verdicts[key] = equal


class Respelled:
    """The link's compiles of packed sources from their fast spelling, with the probe that proves the
    spelling gives TVM's object where this process has no verdict yet for the command."""

    def __init__(self, command: Callable[[str, str], list[str]], command_key: tuple[str, ...], workspace: str) -> None:
        self.command = command  # (source, object) -> the link's compile command
        self.command_key = command_key  # the compiler and flags
        self.workspace = workspace
        self.directory: str | None = None
        self.commands: list[list[str]] = []  # to run beside the link's other compiles
        self.pending: list[tuple[tuple[object, ...], list[list[str]], str, str]] = []  # key, own commands, source, object
        self.probes: list[tuple[tuple[object, ...], str, str]] = []  # key, the two spellings' objects

    def add(self, source: str, obj: str) -> bool:
        """Plan `source`'s compile into `obj` from its fast spelling; False where it compiles as it is."""
        packed = read(source) if source.endswith(".c") else None
        if packed is None:
            return False
        key = (*self.command_key, *packed.key())
        known = verdict(key)
        if known is False:
            return False
        try:
            own, objects = self._write(packed, os.path.basename(source), obj, probe=known is None)
        except OSError as err:  # a full or unwritable temporary directory: TVM's source, as it is
            log.debug("kcache: the device binary's source was not respelled: %s", err)
            return False
        if objects is not None:
            self.probes.append((key, *objects))
        self.commands += own
        self.pending.append((key, own, source, obj))
        return True

    def _write(self, packed: PackedSource, name: str, obj: str, *, probe: bool) -> tuple[list[list[str]], tuple[str, str] | None]:
        """Write the fast spelling (and the probe's two) under this link's private directory: the
        commands that compile them, and the probe's two objects."""
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="kcache-respelled-", dir=self.workspace)
        place = os.path.join(self.directory, str(len(self.pending)))
        os.mkdir(place, 0o700)
        own = [self.command(write_source(os.path.join(place, "literal"), name, packed.literal()), obj)]
        if not probe:
            return own, None
        example = packed.with_data(PROBE_BYTES)
        objects = (os.path.join(place, "probe-braces.o"), os.path.join(place, "probe-literal.o"))
        own.append(self.command(write_source(os.path.join(place, "probe-braces"), name, example.braces()), objects[0]))
        own.append(self.command(write_source(os.path.join(place, "probe-literal"), name, example.literal()), objects[1]))
        return own, objects

    def owed(self, failed: set[tuple[str, ...]]) -> list[list[str]]:
        """Once the commands ran (`failed`: those that did not succeed), record the probes' verdicts and
        return the plain compiles still owed: where the probe refuted the spelling, or one of the
        source's own compiles failed (the plain compile then reports TVM's error, if there is one)."""
        for key, braces, literal in self.probes:
            equal = _same_bytes(braces, literal)
            record(key, equal)
            if not equal:
                log.warning("kcache: %s compiles the device binary's fast spelling into another object; "
                            "its source is compiled as TVM wrote it", key[0])
        self.probes = []
        return [self.command(source, obj) for key, own, source, obj in self.pending
                if verdict(key) is not True or any(tuple(command) in failed for command in own)]

    def close(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def _same_bytes(first: str, second: str) -> bool:
    try:
        with open(first, "rb") as one, open(second, "rb") as other:
            return one.read() == other.read()
    except OSError:  # a probe that did not compile proves nothing
        return False
