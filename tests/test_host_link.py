"""kcache's link of a kernel's host library (kcache/tilelang/host_link.py): the library TVM's own
`create_shared` links, byte for byte, with the C sources compiled at once; TVM's error text kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("tilelang", reason="the host link needs TileLang (and its TVM)")

from tilelang.jit import JITKernel  # noqa: E402
from tvm.contrib import cc as tvm_cc  # noqa: E402

from kcache.tilelang import host_link  # noqa: E402
from stress.programs.kernels import CPU_TARGET, matmul, pool  # noqa: E402

# A compiler that proves its compiles overlap: the first `-c` run to start waits (at most 20 s) on a
# FIFO for the second one's word; run one after the other, the first would time out and fail the link.
# Later `-c` runs (the device binary's spelling probe) pass straight through.
OVERLAP_CC = """#!/bin/sh
case " $* " in
  *" -c "*)
    if mkdir "{marks}/first" 2>/dev/null; then
      timeout 20 cat "{fifo}" > "{marks}/met" || {{ echo "the other source's compile never started" >&2; exit 3; }}
    elif mkdir "{marks}/second" 2>/dev/null; then
      echo met | timeout 20 tee "{fifo}" > /dev/null || exit 3
    fi ;;
esac
exec "{real}" "$@"
"""


def _executable(kernel_func: object) -> object:
    kernel = JITKernel(kernel_func, out_idx=[2], execution_backend="tvm_ffi", target=CPU_TARGET)
    return kernel.adapter.get_exportable_executable()


@pytest.mark.parametrize("which", ["add", "matmul"])
def test_the_library_is_the_one_tvm_links(tmp_path: Path, which: str) -> None:
    func = pool(1)[0].build() if which == "add" else matmul(256, 256, 256, 64, 64, 32)
    executable = _executable(func)
    out = tmp_path / "out"
    workspace = out / "work"  # one workspace: the sources' names are in the objects' symbols
    workspace.mkdir(parents=True)
    executable.export_library(str(out / "tvm.so"), workspace_dir=str(workspace))
    sources = sorted(p.name for p in workspace.iterdir())
    assert sources == ["devc.c", "lib0.c"], sources  # what the parallel compile is for
    executable.export_library(str(out / "kcache.so"), workspace_dir=str(workspace), fcompile=host_link.fcompile())
    assert (out / "kcache.so").read_bytes() == (out / "tvm.so").read_bytes()
    assert sorted(os.listdir(out)) == ["kcache.so", "tvm.so", "work"]  # no object left behind


def test_the_sources_compile_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    wrapper = tmp_path / "cc"
    wrapper.write_text(OVERLAP_CC.format(marks=marks, fifo=fifo, real=tvm_cc.get_cc()))
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    _executable(pool(1)[0].build()).export_library(str(tmp_path / "k.so"), fcompile=host_link.fcompile())
    assert (marks / "met").read_text() == "met\n"  # the first compile heard from the second while it waited
    assert (tmp_path / "k.so").read_bytes()[:4] == b"\x7fELF"


def test_a_compile_error_reads_as_tvms(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.c", tmp_path / "bad.c"
    good.write_text("int good(void) { return 1; }\n")
    bad.write_text("int bad(void) { return nope; }\n")
    with pytest.raises(RuntimeError) as raised:
        host_link.create_shared(str(tmp_path / "k.so"), [str(good), str(bad)])
    text = str(raised.value)
    assert text.startswith("Compilation error:\n") and "nope" in text
    assert "Command line: " in text and str(bad) in text
    assert not list(tmp_path.glob("*.o")) and not (tmp_path / "k.so").exists()


def _my_children_named(comm: str) -> list[str]:
    """This process's children called `comm`, live or not yet reaped (a zombie keeps its name)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                head, _, tail = stat.read().rpartition(")")
        except OSError:  # gone meanwhile
            continue
        if head.partition("(")[2] == comm and int(tail.split()[1]) == os.getpid():
            found.append(pid)
    return found


def test_a_compiler_that_cannot_start_leaves_none_running(tmp_path: Path) -> None:
    """The first compile started, the second cannot: the first is killed and reaped, not left behind."""
    with pytest.raises(FileNotFoundError):
        host_link._run_all([["sleep", "600"], [str(tmp_path / "no-such-compiler"), "-c", "x.c"]])
    assert _my_children_named("sleep") == []
