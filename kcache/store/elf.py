"""A structural check of a shared object before `dlopen` maps it.

The manifest's sha256 proves that a library is the file that was saved, not that the file is a whole
library: a `kernel.so` cut short by a writer bug or an older tool, saved with a manifest that
matches, passes the hash, and `dlopen` then maps segments that reach past the end of the file; the
first touch of such a page kills the process with SIGBUS. Checked here, on the bytes about to be
loaded (the verified copy): the ELF header, and that the program headers and every segment they
map or point at lie inside the file; that it is a shared object of this machine's class, byte order
and architecture. Microseconds: only headers are parsed.
"""

from __future__ import annotations

import platform
import struct
import sys

from kcache.errors import CorruptEntry
from kcache.store.components import LIBRARY

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB, ELFDATA2MSB = 1, 2
ET_DYN = 3
PT_LOAD, PT_DYNAMIC = 1, 2
# e_machine of this machine's architecture (the ELF spec's numbers).
MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "ppc64le": 21, "ppc64": 21, "s390x": 22}

_HEADER = struct.Struct("16sHHIQQQIHHHHHH")  # Elf64_Ehdr
_PROGRAM_HEADER = struct.Struct("IIQQQQQQ")  # Elf64_Phdr


def shared_object_problem(data: bytes) -> str | None:
    """What makes `data` not a loadable shared object for this machine, or None."""
    if len(data) < _HEADER.size or not data.startswith(ELF_MAGIC):
        return f"not an ELF file ({len(data)} bytes, starting {data[:4]!r})"
    if data[4] != ELFCLASS64:
        return f"ELF class {data[4]}, not 64-bit"
    order = {ELFDATA2LSB: "<", ELFDATA2MSB: ">"}.get(data[5])
    if order is None or (order == "<") != (sys.byteorder == "little"):
        return f"ELF byte order {data[5]} is not this machine's"
    (_ident, e_type, e_machine, _version, _entry, e_phoff, _shoff, _flags, _ehsize, e_phentsize, e_phnum,
     _shentsize, _shnum, _shstrndx) = struct.unpack(order + _HEADER.format, data[:_HEADER.size])
    if e_type != ET_DYN:
        return f"ELF type {e_type}, not a shared object"
    expected = MACHINES.get(platform.machine().lower())
    if expected is not None and e_machine != expected:
        return f"built for ELF machine {e_machine}, this machine is {platform.machine()} ({expected})"
    if e_phentsize != _PROGRAM_HEADER.size or e_phnum == 0:
        return f"bad program header table ({e_phnum} entries of {e_phentsize} bytes)"
    table_end = e_phoff + e_phnum * e_phentsize
    if table_end > len(data):
        return f"the program headers end at byte {table_end}, past the file's {len(data)} bytes"
    loads = 0
    for index in range(e_phnum):
        start = e_phoff + index * e_phentsize
        p_type, _flags, p_offset, _vaddr, _paddr, p_filesz, _memsz, _align = struct.unpack(
            order + _PROGRAM_HEADER.format, data[start:start + _PROGRAM_HEADER.size])
        if p_type in (PT_LOAD, PT_DYNAMIC) and p_offset + p_filesz > len(data):
            what = "a loaded segment" if p_type == PT_LOAD else "the dynamic section"
            return f"{what} ends at byte {p_offset + p_filesz}, past the file's {len(data)} bytes (cut short?)"
        loads += p_type == PT_LOAD
    if loads == 0:
        return "no loadable segment"
    return None


def require_loadable(where: str, files: dict[str, bytes]) -> None:
    """CorruptEntry (quarantine, recompile) when the entry's library would not load: called before
    `dlopen` by the TileLang loader, and by `kcache verify`. Not by the store itself: it keeps
    entries of any backend (stress's synthetic one writes no ELF)."""
    library = files.get(LIBRARY)
    problem = None if library is None else shared_object_problem(library)
    if problem is not None:
        raise CorruptEntry(where, f"{LIBRARY} is not a loadable shared object here: {problem}")
