"""Linking a kernel's host library: TVM's `create_shared`, with its C sources compiled at once.

TVM exports a TileLang kernel as C sources (the host code, `lib0.c`, and the device binary packed
into `devc.c`) and links them with one `g++ -shared -fPIC -o kernel.so <options> lib0.c devc.c`,
which compiles the sources one after the other. The same compiler with the same flags on the same
sources gives the same objects whether one driver runs both or each gets its own, and the link takes
them in the same order: the library is the one TVM would link (tests/test_host_link.py compares
them byte for byte). Each source's `g++ -c` runs beside the others, then one link: on an H100 the
link is 0.2-0.5 s of a first compile, the bigger part of it the device binary's source.

A source whose object was compiled ahead, beside nvcc, with the same command and the same bytes
(`prebuilt`, kcache/tilelang/host_prebuild.py) is not compiled again: the object is the one this
command would give.

The device binary's source is compiled from its fast spelling, one string literal instead of a
token a byte (kcache/tilelang/packed_blob.py), where a probe proved that the command gives the same
object for both spellings.

Anything else (one source, an object among the inputs, not Linux, a compiler set to nvcc) goes to
TVM's `create_shared` unchanged. A failure reads as TVM's: "Compilation error:", the compiler's
output, "Command line:".
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence

from tvm.contrib import cc as tvm_cc

from kcache.tilelang import packed_blob

_SOURCES = (".c", ".cc", ".cpp", ".cxx")

# (compiler, flags, source path) -> the path of that source's object compiled ahead, or None.
Prebuilt = Callable[[str, list[str], str], str | None]


def fcompile(prebuilt: Prebuilt | None = None) -> Callable[..., None]:
    """The `fcompile` to pass to `export_library`: `create_shared` below, with the attributes that
    steer `export_library` (the output format, the target triple that decides how the device binary
    is packed) copied from TVM's own, so that it exports exactly what TVM's default would."""

    def export_shared(output: str, objects: Sequence[str], options: Sequence[str] | None = None,
                      cc: str | None = None, **kwargs: object) -> None:
        create_shared(output, objects, options, cc, prebuilt=prebuilt, **kwargs)

    for attribute in ("output_format", "get_target_triple"):
        if hasattr(tvm_cc.create_shared, attribute):
            setattr(export_shared, attribute, getattr(tvm_cc.create_shared, attribute))
    return export_shared


def compile_command(compiler: str, flags: Sequence[str], source: str, obj: str) -> list[str]:
    """One source's compile, as the link runs it (and as a prebuilt object was compiled)."""
    return [compiler, "-c", "-fPIC", *flags, source, "-o", obj]


def compiler_for(cc: str | None = None) -> str | None:
    """The compiler this module runs itself, or None where TVM's `create_shared` must link."""
    get_cc = getattr(tvm_cc, "get_cc", None)  # without it (another TVM), TVM's create_shared links
    compiler = cc or (get_cc() if get_cc is not None else None)
    if not sys.platform.startswith("linux") or compiler is None or os.path.basename(compiler) == "nvcc":
        return None
    return compiler


def create_shared(output: str, objects: Sequence[str], options: Sequence[str] | None = None,
                  cc: str | None = None, *, prebuilt: Prebuilt | None = None, **kwargs: object) -> None:
    """`tvm.contrib.cc.create_shared`'s signature and result."""
    compiler = compiler_for(cc)
    sources = [objects] if isinstance(objects, str) else list(objects)
    if kwargs or compiler is None or len(sources) < 2 or not all(source.endswith(_SOURCES) for source in sources):
        tvm_cc.create_shared(output, objects, options, cc, **kwargs)
        return
    flags = list(options or [])
    workspace = os.path.dirname(os.path.abspath(output))
    linked: list[str] = []
    compiled: list[str] = []  # this call's own objects, removed at the end
    commands: list[list[str]] = []
    respelled = packed_blob.Respelled(lambda source, obj: compile_command(compiler, flags, source, obj),
                                      (compiler, *flags), workspace)
    try:
        for index, source in enumerate(sources):
            ahead = prebuilt(compiler, flags, source) if prebuilt is not None else None
            if ahead is not None:
                linked.append(ahead)
                continue
            obj = os.path.join(workspace, f"{index}-{os.path.basename(source)}.o")
            compiled.append(obj)
            linked.append(obj)
            if not respelled.add(source, obj):
                commands.append(compile_command(compiler, flags, source, obj))
        results = _run_all(commands + respelled.commands)  # the probe's too: all at once
        _raise_first_failure(results[:len(commands)])
        failed = {tuple(command) for command, returncode, _output in results if returncode != 0}
        _raise_first_failure(_run_all(respelled.owed(failed)))
        _raise_first_failure(_run_all([[compiler, "-shared", "-fPIC", "-o", output, *flags, *linked]]))
    finally:
        respelled.close()
        for obj in compiled:
            try:
                os.unlink(obj)
            except FileNotFoundError:
                pass


def _run_all(commands: list[list[str]]) -> list[tuple[list[str], int, bytes]]:
    """Start every command, wait for all: each one's exit status and output. Whatever stops the wait
    (a start that fails, a Ctrl-C) kills and reaps the compilers still running."""
    running: list[tuple[list[str], subprocess.Popen[bytes]]] = []
    try:
        for command in commands:
            running.append((command, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
        results = []
        for command, process in running:
            out, _ = process.communicate()  # every process is waited for, whatever failed before it
            results.append((command, process.returncode, out))
        return results
    finally:
        for _command, process in running:
            if process.poll() is None:
                process.kill()
                process.wait()


def _raise_first_failure(results: list[tuple[list[str], int, bytes]]) -> None:
    """The first failed command's error, as TVM's compile error reads."""
    for command, returncode, out in results:
        if returncode != 0:
            raise RuntimeError("Compilation error:\n" + out.decode(errors="replace")
                               + "\nCommand line: " + " ".join(command))
