"""The device binary's source compiled from its fast spelling (kcache/tilelang/packed_blob.py): only
TVM's exact format is respelled, the object is the one TVM's source gives (a probe proves it per
compiler and flags, and a compiler that disagrees is caught), and the library stays TVM's, byte for byte."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

pytest.importorskip("tilelang", reason="the link needs TileLang (and its TVM)")

from tilelang.jit import JITKernel  # noqa: E402

from kcache.tilelang import host_link, packed_blob  # noqa: E402
from stress.programs.kernels import CPU_TARGET, matmul  # noqa: E402
from tests.wrapped_cc import wrap_cc  # noqa: E402


def _compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, literal: str = ":") -> Path:
    """A C compiler that logs each run; a run whose source is spelled as one literal (the link's, the
    probe's) does what `literal` says first."""
    monkeypatch.setattr(packed_blob, "_verdicts", {})  # this test's compiler is probed afresh
    return wrap_cc(tmp_path, monkeypatch, f'for arg in "$@"; do case "$arg" in *literal/*.c) {literal} ;; esac; done')


@pytest.fixture(scope="module")
def executable() -> object:
    kernel = JITKernel(matmul(256, 256, 256, 64, 64, 32), out_idx=[2], execution_backend="tvm_ffi", target=CPU_TARGET)
    return kernel.adapter.get_exportable_executable()


def _export_both(executable: object, out: Path, log: Path | None = None) -> tuple[bytes, bytes, Path]:
    """TVM's library and kcache's, from the same sources; and TVM's `devc.c`. The log, if any, is
    emptied between the two: it then holds kcache's link alone."""
    workspace = out / "work"  # one workspace: the sources' names are in the objects' symbols
    workspace.mkdir(parents=True)
    executable.export_library(str(out / "tvm.so"), workspace_dir=str(workspace))  # type: ignore[attr-defined]
    if log is not None:
        log.write_text("")
    executable.export_library(str(out / "kcache.so"), workspace_dir=str(workspace),  # type: ignore[attr-defined]
                              fcompile=host_link.fcompile())
    assert sorted(os.listdir(out)) == ["kcache.so", "tvm.so", "work"]  # no object or directory left behind
    return (out / "tvm.so").read_bytes(), (out / "kcache.so").read_bytes(), workspace / "devc.c"


def _compiled_sources(log: Path) -> list[str]:
    """The source of each `-c` run: [compiler, -c, -fPIC, flags..., source, -o, object]."""
    return [line.split()[-3] for line in log.read_text().splitlines() if " -c " in f" {line} "]


def test_tvms_source_parses_and_renders_back(executable: object, tmp_path: Path) -> None:
    _tvm, _kcache, devc = _export_both(executable, tmp_path)
    text = devc.read_text()
    packed = packed_blob.parse(text)
    assert packed is not None and packed.symbol == "__tvm_ffi__library_bin"
    assert packed.braces() == text and len(packed.data) > 1000 and packed.data[-1] == 0
    literal = packed.literal()
    assert literal.startswith(packed.head[:-2]) and literal.endswith(packed.tail[3:]) and "0x" not in literal


@pytest.mark.parametrize("edit", ["a space", "a byte too many", "uppercase hex", "the last byte not zero", "a comment"])
def test_anything_but_tvms_exact_format_is_left_alone(executable: object, tmp_path: Path, edit: str) -> None:
    _tvm, _kcache, devc = _export_both(executable, tmp_path)
    text = devc.read_text()
    packed = packed_blob.parse(text)
    assert packed is not None
    edited = {
        "a space": text.replace("0x00,0x00", "0x00, 0x00", 1),
        "a byte too many": text.replace("\n};", "0x00,\n};", 1),
        "uppercase hex": text.replace("0xce", "0xCE", 1),
        "the last byte not zero": packed.with_data(packed.data[:-1] + b"\x01").braces(),
        "a comment": text.replace("\n};", "/* */\n};", 1),
    }[edit]
    assert edited != text and packed_blob.parse(edited) is None


def test_the_library_is_tvms_and_its_device_binary_compiled_from_the_literal(
        executable: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _compiler(tmp_path, monkeypatch)
    tvm_so, kcache_so, _devc = _export_both(executable, tmp_path / "out", log)
    assert kcache_so == tvm_so
    compiled = _compiled_sources(log)
    assert any(source.endswith("/literal/devc.c") for source in compiled), compiled
    assert any(source.endswith("/probe-braces/devc.c") for source in compiled)  # the first link probes
    assert not any(source.endswith("/work/devc.c") for source in compiled)  # TVM's own spelling is not compiled
    assert list(packed_blob._verdicts.values()) == [True]

    tvm_so, kcache_so, _devc = _export_both(executable, tmp_path / "again", log)  # the same command again
    assert kcache_so == tvm_so
    compiled = _compiled_sources(log)
    assert any(source.endswith("/literal/devc.c") for source in compiled)
    assert not any("/probe-" in source for source in compiled)  # the verdict holds: no probe


def test_a_compiler_that_spells_differently_is_caught_and_tvms_source_compiled(
        executable: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A compiler whose literal spelling gives another object (the fault: it puts each array in its
    own section): the probe sees it, the link compiles TVM's source, and the library is TVM's."""
    log = _compiler(tmp_path, monkeypatch, literal='set -- -fdata-sections "$@"; break')
    tvm_so, kcache_so, _devc = _export_both(executable, tmp_path / "out", log)
    assert list(packed_blob._verdicts.values()) == [False]  # the fault fired: the probe's objects differed
    assert "compiles the device binary's fast spelling into another object" in caplog.text
    assert kcache_so == tvm_so
    assert any(source.endswith("/work/devc.c") for source in _compiled_sources(log))


def test_a_literal_compile_that_fails_falls_back_to_tvms_source(
        executable: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _compiler(tmp_path, monkeypatch, literal='case "$*" in *" -o "*"/0-"*|*" -o "*"/1-"*) exit 7 ;; esac')
    tvm_so, kcache_so, _devc = _export_both(executable, tmp_path / "out", log)
    assert kcache_so == tvm_so
    kcache_runs = _compiled_sources(log)
    assert any(source.endswith("/literal/devc.c") for source in kcache_runs)  # it was tried, and failed
    assert any(source.endswith("/work/devc.c") for source in kcache_runs)


def test_a_respelling_that_cannot_be_written_compiles_tvms_source(
        executable: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full temporary directory as the link writes the fast spelling: TVM's source is compiled."""
    log = _compiler(tmp_path, monkeypatch)
    refused: list[str] = []

    def full(directory: str, name: str, text: str) -> str:
        refused.append(name)
        raise OSError(errno.ENOSPC, "No space left on device", directory)

    monkeypatch.setattr(packed_blob, "write_source", full)
    tvm_so, kcache_so, _devc = _export_both(executable, tmp_path / "out", log)
    assert refused == ["devc.c"]  # the fault fired
    assert kcache_so == tvm_so
    assert any(source.endswith("/work/devc.c") for source in _compiled_sources(log))
