"""A cache root on a real noexec mount: kernels still load (from copies), nothing is deleted or
recompiled for it, and unrelated load failures are not disguised as noexec."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

import kcache  # noqa: E402
from kcache.store import exec_copy  # noqa: E402
from kcache.store.manifest import MANIFEST_NAME, build_manifest  # noqa: E402
from stress.programs.kernels import CPU_TARGET, elementwise_add  # noqa: E402

from .faults import needs_root, tmpfs  # noqa: E402

pytestmark = [pytest.mark.tilelang, needs_root]


def get(cache: kcache.KernelCache, n: int = 1024):
    return cache.get_or_compile(elementwise_add(n=n), CPU_TARGET, out_idx=[2])


@pytest.fixture(scope="module")
def compiled_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root holding two real kernels (n = 1024 and 2048), compiled once for the module."""
    root = tmp_path_factory.mktemp("compiled") / "root"
    cache = kcache.KernelCache(root)
    get(cache), get(cache, n=2048)
    return root


@pytest.fixture
def noexec_root(tmp_path: Path, compiled_root: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "noexec", size="64m", options="noexec") as mount:
        root = mount / "root"
        shutil.copytree(compiled_root, root, symlinks=True)
        yield root


def assert_own_library(kernel, mine: str, other: str) -> None:
    """The kernel's library is its own: glibc hands out an already loaded library by name, so two
    loads through one reused /proc/self/fd/N path would give the second kernel the first's code."""
    executable = kernel.adapter.executable
    assert executable.implements_function(mine) and not executable.implements_function(other)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_noexec_root_serves_hits_and_publishes_misses_loaded_from_copies(noexec_root: Path, caplog) -> None:
    mount = noexec_root.parent
    assert exec_copy.noexec_mount(noexec_root) == mount
    library = entry_of(noexec_root, "add_1024_256_float32") / "kernel.so"
    with pytest.raises(OSError, match="failed to map segment"):  # the fault is real: in place, it does not map
        import ctypes

        ctypes.CDLL(str(library))
    cache = kcache.KernelCache(noexec_root)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        first, second = get(cache), get(cache, n=2048)  # two loads in a row, from copies
        miss = get(cache, n=4096)
    assert (cache.stats()["disk_hits"], cache.stats()["compiles"]) == (2, 1)
    assert first.adapter.libpath.startswith(str(noexec_root)) and miss.adapter.libpath.startswith(str(noexec_root))
    assert_own_library(first, "add_1024_256_float32", "add_2048_256_float32")
    assert_own_library(second, "add_2048_256_float32", "add_1024_256_float32")
    assert_own_library(miss, "add_4096_256_float32", "add_2048_256_float32")
    warned = warnings_of(caplog)
    assert len(warned) == 1 and str(mount) in warned[0] and "KCACHE_DIR" in warned[0]
    assert not (noexec_root / ".quarantine").exists()
    # TileLang deletes and recompiles its noexec entries on every run; here the next process hits.
    again = kcache.KernelCache(noexec_root)
    get(again), get(again, n=4096)
    assert (again.stats()["disk_hits"], again.stats()["compiles"]) == (2, 0)


def test_where_memfd_is_refused_a_private_exec_directory_serves(noexec_root: Path, monkeypatch, caplog) -> None:
    refused: list[str] = []

    def no_memfd(name: str, flags: int = 0) -> int:
        refused.append(name)
        raise OSError(errno.EACCES, "memfd refused by policy")

    monkeypatch.setattr(exec_copy.os, "memfd_create", no_memfd)
    cache = kcache.KernelCache(noexec_root)
    kernel, other = get(cache), get(cache, n=2048)
    assert refused == ["kernel.so", "kernel.so"]
    assert_own_library(kernel, "add_1024_256_float32", "add_2048_256_float32")
    assert_own_library(other, "add_2048_256_float32", "add_1024_256_float32")
    assert cache.stats()["compiles"] == 0
    assert not [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("kcache-exec-*")]  # the copy is gone


def test_where_no_copy_may_be_mapped_either_the_error_says_how_to_move_the_cache(
    noexec_root: Path, monkeypatch, caplog
) -> None:
    monkeypatch.setattr(exec_copy.os, "memfd_create",
                        lambda name, flags=0: (_ for _ in ()).throw(OSError(errno.EACCES, "memfd refused by policy")))
    monkeypatch.setenv("KCACHE_EXEC_DIR", str(noexec_root.parent))  # the only place allowed: noexec too
    before = sorted(p.name for p in (noexec_root / "kernels").iterdir())
    with pytest.raises(kcache.NoExecError) as caught:
        get(kcache.KernelCache(noexec_root))
    message = str(caught.value)
    for words in (str(noexec_root.parent), "noexec", "memfd refused", "KCACHE_DIR", "KCACHE_EXEC_DIR"):
        assert words in message
    assert sorted(p.name for p in (noexec_root / "kernels").iterdir()) == before  # left alone
    assert not (noexec_root / ".quarantine").exists()


def test_a_corrupt_library_on_a_noexec_root_is_corruption_not_noexec(noexec_root: Path, caplog) -> None:
    entry = entry_of(noexec_root, "add_1024_256_float32")
    plant(entry, b"\x7fELF not really a library" * 100)
    cache = kcache.KernelCache(noexec_root)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        kernel = get(cache)
    assert kernel.adapter.executable is not None
    assert cache.stats()["corrupt_entries"] == 1 and cache.stats()["compiles"] == 1
    assert any("quarantined" in w for w in warnings_of(caplog))
    assert not any("NoExec" in w for w in warnings_of(caplog))


def test_a_library_that_links_something_missing_here_is_left_alone(tmp_path: Path, compiled_root: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(compiled_root, root, symlinks=True)
    entry = entry_of(root, "add_1024_256_float32")
    plant(entry, library_linking_a_missing_library(tmp_path))
    with pytest.raises(kcache.LocalLoadError, match="cannot open shared object file") as caught:
        get(kcache.KernelCache(root))
    assert "libkcache_gone.so" in str(caught.value) and "left alone" in str(caught.value)
    assert entry.is_dir() and not (root / ".quarantine").exists()


def entry_of(root: Path, kernel: str) -> Path:
    return next(e for e in (root / "kernels").iterdir() if json.loads((e / "meta.json").read_text())["kernel"] == kernel)


def plant(entry: Path, library: bytes) -> None:
    """Replace an entry's library, its manifest rewritten to match: verification passes, loading not."""
    (entry / "kernel.so").unlink()
    (entry / "kernel.so").write_bytes(library)
    (entry / MANIFEST_NAME).unlink()
    (entry / MANIFEST_NAME).write_bytes(build_manifest(entry))


def library_linking_a_missing_library(work: Path) -> bytes:
    """A real shared object that needs libkcache_gone.so, which is then removed."""
    (work / "gone.c").write_text("int gone(void) { return 1; }\n")
    (work / "uses.c").write_text("int gone(void);\nint uses(void) { return gone(); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(work / "libkcache_gone.so"), str(work / "gone.c")], check=True)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(work / "uses.so"), str(work / "uses.c"),
                    f"-L{work}", "-lkcache_gone"], check=True)
    (work / "libkcache_gone.so").unlink()
    return (work / "uses.so").read_bytes()
