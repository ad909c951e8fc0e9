"""The machine code of a device binary, for byte-for-byte comparisons across compiles."""

from __future__ import annotations

import hashlib
import struct
from typing import Any


def text_sections(binary: bytes) -> tuple[str, list[str]]:
    """(sha256 of the ELF's .text* sections, every section name): the machine code, without the
    debug-line sections that hold the compile's temporary directory."""
    if binary[:4] != b"\x7fELF":
        return hashlib.sha256(binary).hexdigest(), []
    shoff, = struct.unpack_from("<Q", binary, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", binary, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", binary, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]

    def name_of(offset: int) -> str:
        end = binary.index(b"\0", names_at + offset)
        return binary[names_at + offset:end].decode()

    digest, names = hashlib.sha256(), []
    for header in headers:
        name = name_of(header[0])
        names.append(name)
        if name.startswith(".text"):
            digest.update(name.encode() + binary[header[4]:header[4] + header[5]])
    return digest.hexdigest(), sorted(n for n in names if n)


def capture_tilelang_binaries(into: list[tuple[str, bytes]]) -> None:
    """Plain TileLang: append each nvcc run's (CUDA source, the binary its callback returns) to `into`
    (the test's instrument, not kcache's)."""
    import tvm_ffi
    from tilelang.cuda import backend

    original = backend.tilelang_callback_cuda_compile

    def compile_callback(code: str, target: Any, pass_config: Any = None) -> Any:
        binary = original(code, target, pass_config)
        into.append((code, bytes(binary)))
        return binary

    tvm_ffi.register_global_func("tilelang_callback_cuda_compile", compile_callback, override=True)


def binary_of(captured: list[tuple[str, bytes]], kernel: Any) -> bytes | None:
    """The binary nvcc made from `kernel`'s own device source: an autotuner compiles every config, and
    the one it returns need not be the last compiled (the last binary then is another config's)."""
    source = kernel.get_kernel_source()
    for code, binary in reversed(captured):
        if code == source:
            return binary
    return captured[-1][1] if captured else None
