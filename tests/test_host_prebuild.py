"""The host code compiled beside nvcc (kcache/tilelang/host_prebuild.py): its `g++ -c` really runs
while nvcc does, the library is still the one TVM links byte for byte, a host callback keeps
TileLang's order, and a compile that fails or a prebuilt compile that fails costs nothing else."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("tilelang", reason="the host code's compile needs TileLang (and its TVM)")

import tvm_ffi  # noqa: E402
from tilelang.contrib import nvcc  # noqa: E402

from kcache.errors import CompileError  # noqa: E402
from kcache.tilelang import compiler, host_link, host_prebuild  # noqa: E402
from kcache.tilelang.target import resolve_target  # noqa: E402
from stress.programs.kernels import CPU_TARGET, elementwise_add, matmul  # noqa: E402
from tests.faults import fill_filesystem, needs_root, tmpfs  # noqa: E402
from tests.test_host_link import _my_children_named  # noqa: E402
from tests.wrapped_cc import wrap_cc  # noqa: E402


def _compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: str = ":") -> Path:
    """A C compiler that logs each run; the prebuild's compile (its object is `host.o`) does what `ahead` says."""
    return wrap_cc(tmp_path, monkeypatch, f'case " $* " in *" -c "*"/host.o "*) {ahead} ;; esac')


def _compile(func: object, tmp_path: Path) -> compiler.CompiledKernel:
    return compiler.compile_kernel(func, resolve_target(CPU_TARGET, "tvm_ffi"), [2], {}, None, tmp_path / "logs")


def _private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own temporary directory, for the prebuild (and nvcc): the suite's background
    compiles make theirs in the shared one meanwhile."""
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    return private


def _prebuild_dirs(private: Path) -> list[str]:
    return [name for name in os.listdir(private) if name.startswith("kcache-host-")]


def _names(run: str, suffix: str) -> bool:
    return any(word.endswith(suffix) for word in run.split())


def _compiles_and_links(log: Path) -> list[str]:
    """The logged runs that compile or link (not TVM's `-dumpmachine` and the like)."""
    return [run for run in log.read_text().splitlines() if {"-c", "-shared"} & set(run.split())]


def _nvcc_meets_the_host_compile(fifo: Path, monkeypatch: pytest.MonkeyPatch, then_fail: bool = False) -> None:
    """nvcc, once started, waits (at most 20 s) until the host code's compile has started too."""
    real = nvcc.compile_cuda

    def meeting(*args: object, **kwargs: object) -> object:
        subprocess.run(["timeout", "20", "sh", "-c", f'echo met > "{fifo}"'], check=True)
        if then_fail:
            raise RuntimeError("Compilation error:\nnvcc failed on purpose\nCommand: nvcc")
        return real(*args, **kwargs)

    monkeypatch.setattr(nvcc, "compile_cuda", meeting)


def test_the_host_code_compiles_while_nvcc_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prebuild's compiler waits for nvcc's word and nvcc for the compiler's reader: run one
    after the other, either would time out and the compile would fail."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    log = _compiler(tmp_path, monkeypatch, ahead=f'timeout 20 cat "{fifo}" > "{tmp_path}/met" || exit 3')
    _nvcc_meets_the_host_compile(fifo, monkeypatch)
    private = _private_tmp(tmp_path, monkeypatch)
    compiled = _compile(elementwise_add(n=5120), tmp_path)
    assert len(_prebuild_dirs(private)) == 1
    library = compiler.linked_library(compiled.kernel.adapter, compiled.host_prebuild)
    assert (tmp_path / "met").read_text() == "met\n"
    assert library[:4] == b"\x7fELF"
    # lib0.c compiled once, ahead; devc.c at the link (from its fast spelling, and beside it, once a
    # process, the spelling's probe: tests/test_packed_blob.py); then the link itself, of the object made ahead.
    runs = [run for run in _compiles_and_links(log) if "/probe-" not in run]
    assert [(_names(run, "/lib0.c"), _names(run, "/devc.c"), "-shared" in run.split(), _names(run, "/host.o"))
            for run in runs] == [(True, False, False, True), (False, True, False, False), (False, False, True, True)], runs
    assert _prebuild_dirs(private) == [] and _my_children_named("cc") == _my_children_named("g++") == []


@pytest.mark.parametrize("which", ["add", "matmul"])
def test_the_library_is_the_one_tvm_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str) -> None:
    log = _compiler(tmp_path, monkeypatch)
    func = elementwise_add(n=6144) if which == "add" else matmul(256, 256, 256, 64, 64, 32)
    compiled = _compile(func, tmp_path)
    executable = compiled.kernel.adapter.get_exportable_executable()
    executable.export_library(str(tmp_path / "tvm.so"))  # TVM's own create_shared, no prebuild
    taken = []

    def take(compiler_path: str, flags: list[str], source: str) -> str | None:
        obj = compiled.host_prebuild.take(compiler_path, flags, source)
        taken.append((os.path.basename(source), obj is not None))
        return obj

    executable.export_library(str(tmp_path / "kcache.so"), fcompile=host_link.fcompile(take))
    compiled.host_prebuild.close()
    assert taken == [("lib0.c", True), ("devc.c", False)]
    assert (tmp_path / "kcache.so").read_bytes() == (tmp_path / "tvm.so").read_bytes()
    assert sum("host.o" in run and "lib0.c" in run for run in log.read_text().splitlines()) == 1


def test_a_failed_compile_ahead_is_compiled_again_at_the_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _compiler(tmp_path, monkeypatch, ahead="exit 1")
    compiled = _compile(elementwise_add(n=7168), tmp_path)
    executable = compiled.kernel.adapter.get_exportable_executable()
    executable.export_library(str(tmp_path / "tvm.so"))
    library = compiler.linked_library(compiled.kernel.adapter, compiled.host_prebuild)
    assert library == (tmp_path / "tvm.so").read_bytes()
    runs = _compiles_and_links(log)
    assert sum("host.o" in run for run in runs) == 1  # the failed one ahead; the link did not take it
    compiled_lib0 = [run.split()[-1] for run in runs if "lib0.c" in run and "-c" in run.split()]
    assert [os.path.basename(obj) for obj in compiled_lib0] == ["host.o", "0-lib0.c.o"]  # ahead, then kcache's link


def test_a_compile_that_fails_stops_the_host_compile_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # The host compile, once it has met nvcc, would run for ten minutes: it must be killed and reaped.
    _compiler(tmp_path, monkeypatch, ahead=f'timeout 20 cat "{fifo}" > "{tmp_path}/met" && exec sleep 600')
    _nvcc_meets_the_host_compile(fifo, monkeypatch, then_fail=True)
    private = _private_tmp(tmp_path, monkeypatch)
    with pytest.raises(CompileError, match="nvcc failed on purpose"):
        _compile(elementwise_add(n=9216), tmp_path)
    assert (tmp_path / "met").read_text() == "met\n"  # the host compile was running
    assert _my_children_named("sleep") == [] and _prebuild_dirs(private) == []


def test_with_a_host_callback_the_host_code_is_generated_after_nvcc_as_tilelang_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    order = []
    real = nvcc.compile_cuda

    def recording_nvcc(*args: object, **kwargs: object) -> object:
        order.append("nvcc")
        return real(*args, **kwargs)

    def host_callback(code: str, target: object) -> str:
        order.append("host callback")
        return code

    monkeypatch.setattr(nvcc, "compile_cuda", recording_nvcc)
    log = _compiler(tmp_path, monkeypatch)
    tvm_ffi.register_global_func("tilelang_callback_c_host_postproc", host_callback, override=True)
    try:
        compiled = _compile(elementwise_add(n=10240), tmp_path)
    finally:
        tvm_ffi.remove_global_func("tilelang_callback_c_host_postproc")
    compiler.linked_library(compiled.kernel.adapter, compiled.host_prebuild)
    assert order == ["nvcc", "host callback"]
    assert not any("host.o" in run for run in log.read_text().splitlines())  # nothing compiled ahead


@needs_root
def test_a_source_written_short_ahead_is_compiled_at_the_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host code's directory is on a full tmpfs (a real ENOSPC: TVM writes the source short and
    says nothing; nvcc's temporary files stay where they were): the object made from it is not the
    link's, so the link compiles the source itself, and the library is still TVM's."""
    log = _compiler(tmp_path, monkeypatch)
    with tmpfs(tmp_path / "full", size="1m") as mount:
        fill_filesystem(mount, leave_bytes=0)
        made: list[str] = []

        def mkdtemp_on_the_full_mount(prefix: str = "") -> str:
            made.append(tempfile.mkdtemp(prefix=prefix, dir=mount))
            return made[-1]

        with monkeypatch.context() as patch:  # the prebuild's own view of `tempfile` only
            patch.setattr(host_prebuild, "tempfile", SimpleNamespace(mkdtemp=mkdtemp_on_the_full_mount))
            compiled = _compile(elementwise_add(n=11264), tmp_path)
        written = (Path(made[0]) / "lib0.c").read_bytes()
        executable = compiled.kernel.adapter.get_exportable_executable()
        workspace = tmp_path / "work"
        workspace.mkdir()
        executable.export_library(str(tmp_path / "tvm.so"), workspace_dir=str(workspace))
        assert len(written) < len((workspace / "lib0.c").read_bytes())  # the fault fired
        library = compiler.linked_library(compiled.kernel.adapter, compiled.host_prebuild)
        assert not os.path.exists(made[0])
    assert library == (tmp_path / "tvm.so").read_bytes()
    compiled_lib0 = [run.split()[-1] for run in _compiles_and_links(log) if _names(run, "/lib0.c") and "-c" in run.split()]
    assert [os.path.basename(obj) for obj in compiled_lib0] == ["host.o", "0-lib0.c.o"]
