"""Faults any machine can meet (issue 22) never kill or hang the caller: each is a real fault, made on
real files, and a fresh process asks for the kernel."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kcache.store.components import LIBRARY
from kcache.store.manifest import MANIFEST_NAME, build_manifest

from .faults import fill_filesystem, needs_root, tmpfs

PROJECT = Path(__file__).resolve().parent.parent

GET = """
import json, sys, kcache
from stress.programs.kernels import CPU_TARGET, elementwise_add
cache = kcache.KernelCache(sys.argv[1])
cache.get_or_compile(elementwise_add(n=1280), CPU_TARGET, out_idx=[2])
stats = cache.stats()
print("RESULT", json.dumps({"compiles": stats["compiles"], "corrupt": stats["corrupt_entries"]}))
"""


def fresh_get(root: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", GET, str(root)], capture_output=True, text=True, timeout=600,
                          cwd=str(PROJECT))
    assert done.returncode == 0, f"the process died ({done.returncode}): {done.stderr[-3000:]}"
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def damage(entry: Path, library: bytes) -> None:
    """Replace the entry's library and rewrite its manifest to match: the sha256 check passes."""
    for name in (LIBRARY, MANIFEST_NAME):
        (entry / name).unlink()
    (entry / LIBRARY).write_bytes(library)
    (entry / MANIFEST_NAME).write_bytes(build_manifest(entry))


def faults(good: bytes) -> dict[str, bytes]:
    other_machine = bytearray(good)
    other_machine[18:20] = (183).to_bytes(2, "little")  # e_machine: aarch64
    return {
        "cut to 1/2": good[: len(good) // 2],
        "cut to 1/4": good[: len(good) // 4],
        "cut to 3/4": good[: 3 * len(good) // 4],
        "zero-filled": bytes(len(good)),
        "garbage": os.urandom(len(good)),
        "another machine's": bytes(other_machine),
    }


@pytest.mark.tilelang
def test_a_library_cut_short_or_wrong_with_a_matching_manifest_is_a_corrupt_entry_not_a_dead_process(
        tmp_path: Path) -> None:
    pytest.importorskip("tilelang")
    root = tmp_path / "root"
    assert fresh_get(root) == {"compiles": 1, "corrupt": 0}
    (key,) = os.listdir(root / "kernels")
    entry = root / "kernels" / key
    good = (entry / LIBRARY).read_bytes()

    # The fault is real: loading the half library directly kills a process with SIGBUS.
    half = tmp_path / "half.so"
    half.write_bytes(good[: len(good) // 2])
    probe = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(half)!r})"],
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == -signal.SIGBUS, f"dlopen of the half library gave {probe.returncode}, not SIGBUS"

    for name, library in faults(good).items():
        # Each fault damages the entry the previous one's recompile published: found corrupt, it was whole.
        damage(entry, library)
        assert fresh_get(root) == {"compiles": 1, "corrupt": 1}, name  # quarantined, recompiled, no death
        quarantined = sorted((root / ".quarantine").iterdir(), key=lambda p: p.stat().st_mtime)[-1]
        assert (quarantined / LIBRARY).read_bytes() == library, name
    assert fresh_get(root) == {"compiles": 0, "corrupt": 0}  # and the next process hits


def test_a_fifo_as_an_entrys_meta_never_blocks_the_command_line(tmp_path: Path) -> None:
    """A FIFO where meta.json belongs would block any plain open for reading until a writer came:
    `kcache ls`, `show`, `gc` and `clear` read through O_NONBLOCK|O_NOFOLLOW and finish."""
    from .helpers import child_env
    from .test_eviction import POPULATE

    root = tmp_path / "root"
    subprocess.run([sys.executable, "-c", POPULATE.format(root=str(root), names=["a", "b"])], env=child_env(),
                   cwd=str(PROJECT), check=True, capture_output=True)
    (key, *_) = sorted(os.listdir(root / "kernels"))
    meta = root / "kernels" / key / "meta.json"
    meta.unlink()
    os.mkfifo(meta)
    for command in (["ls"], ["show", key[:12]], ["gc"], ["clear", "--all-versions"]):
        done = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), "--json", *command],
                              capture_output=True, text=True, env=child_env(), cwd=str(PROJECT), timeout=60)
        assert done.returncode in (0, 1), (command, done.stderr[-2000:])  # finished, whatever it found
        assert done.stdout, (command, done.stderr[-2000:])
    assert not (root / "kernels").exists() or not os.listdir(root / "kernels")  # clear removed it all


@pytest.mark.parametrize("planted", ["directory", "symlink"])
def test_a_lock_file_replaced_by_a_directory_or_a_link_costs_a_warning_not_the_call(
        tmp_path: Path, planted: str, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    import kcache
    from stress.programs import synthetic

    root = tmp_path / "root"
    cache = kcache.KernelCache(root, backend=synthetic)
    cache.get_or_compile(synthetic.SyntheticFunc("x"), "synthetic")
    (key,) = cache.store.keys()
    lock = root / ".locks" / f"{key}.lock"
    assert lock.is_file()
    lock.unlink()
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    if planted == "directory":
        lock.mkdir()
    else:
        lock.symlink_to(victim)
    shutil.rmtree(root / "kernels" / key)  # a miss: the compile has to take that lock
    fresh = kcache.KernelCache(root, backend=synthetic)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        kernel = fresh.get_or_compile(synthetic.SyntheticFunc("x"), "synthetic")
        fresh.gc()
    assert kernel.name == "x"
    assert any("cannot take the compile lock" in r.getMessage() and str(lock) in r.getMessage()
               for r in caplog.records)
    assert victim.read_text() == "untouched"
    assert lock.is_symlink() if planted == "symlink" else lock.is_dir()  # not ours to remove


SAVE_TUNED = """
import sys
from autotuner import AutotuneResult
from stress.programs.kernels import elementwise_add
result = AutotuneResult(config={"n": 1024}, latency=0.1, ref_latency=None, configs=[], kernel_key="cd" * 32,
                        out_idx=[2], target={"kind": "cuda", "arch": "sm_90a"}, func=elementwise_add(n=1024),
                        metadata={})
print(result.save_to_disk(sys.argv[1]))
"""

LOAD_TUNED_FIRST = """
import sys
from kcache.results.autotune import AutotuneResult
assert "tilelang" not in sys.modules and "tvm" not in sys.modules  # what a server that loads its configs first has
result = AutotuneResult.load_from_disk(sys.argv[1])
print("LOADED", result is not None and type(result.func).__name__, result is not None and result.func.attrs["global_symbol"])
"""


@pytest.mark.tilelang
def test_a_tuned_result_loads_in_a_process_that_has_not_imported_tilelang(tmp_path: Path) -> None:
    pytest.importorskip("tilelang")
    path = tmp_path / "root" / "autotuner" / "add"
    saved = subprocess.run([sys.executable, "-c", SAVE_TUNED, str(path)], capture_output=True, text=True,
                           timeout=300, cwd=str(PROJECT))
    assert saved.stdout.strip().endswith("True"), saved.stderr[-2000:]
    loaded = subprocess.run([sys.executable, "-c", LOAD_TUNED_FIRST, str(path)], capture_output=True, text=True,
                            timeout=300, cwd=str(PROJECT))
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert "LOADED PrimFunc" in loaded.stdout and "cannot be read back" not in loaded.stderr


@needs_root
@pytest.mark.tilelang
def test_a_cache_filesystem_that_fills_up_at_any_step_still_returns_the_kernel(tmp_path: Path) -> None:
    """Free space from 0 to 96 KiB in 8 KiB steps, on a real 1 MiB tmpfs: whichever write runs out
    (a component, the linker's output, the manifest, the publish), the caller gets its kernel, with
    no partial entry and no staging left after gc. (The entry, its lock and the miss log take about
    80 KiB of tmpfs pages: the top step saves, which the test checks, so every write was reached.)"""
    pytest.importorskip("tilelang")
    import kcache
    from kcache.tilelang.backend import toolchain_fingerprint
    from stress.programs.kernels import CPU_TARGET, elementwise_add

    unsaved = 0
    saved_at_the_top = False
    with tmpfs(tmp_path / "tiny", size="1m") as mount:
        for leave_kib in range(0, 97, 8):
            root = mount / f"cache-{leave_kib}"
            cache = kcache.KernelCache(root)
            toolchain_fingerprint(cache.root)  # the small files that come before the entry
            filler = fill_filesystem(mount, leave_bytes=leave_kib * 1024)
            try:
                kernel = cache.get_or_compile(elementwise_add(n=1024 + 8 * leave_kib), CPU_TARGET, out_idx=[2])
                assert kernel is not None, leave_kib
                stats = cache.stats()
                unsaved += stats["publish_failures"] > 0
                saved_at_the_top = stats["publish_failures"] == 0
                if stats["publish_failures"] == 0:
                    assert len(cache.store.keys()) == 1 and cache.store.read(cache.store.keys()[0]), leave_kib
                else:
                    assert cache.store.keys() == [], leave_kib  # nothing half-published
            finally:
                filler.unlink()
            cache.gc()
            assert not any((root / ".staging").iterdir()), leave_kib
            shutil.rmtree(root)
    assert unsaved >= 1  # the fault fired: at the low levels nothing could be saved
    assert saved_at_the_top  # and the steps reached past the last write


def test_a_message_that_stops_half_way_is_a_dead_peer_within_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker (or the service) that writes the start of a message and no more is given up on within
    the message deadline, never waited on forever; whole messages still pass."""
    from kcache.compile import protocol

    monkeypatch.setattr(protocol, "MESSAGE_DEADLINE_S", 0.3)
    read_end, write_end = os.pipe()
    try:
        protocol.send(write_end, ("whole", 1))
        assert protocol.receive_reply(read_end, 5.0, "testing") == ("whole", 1)
        os.write(write_end, (64).to_bytes(8, "big") + b"only the beginning")
        with pytest.raises(protocol.WorkerDied, match="stopped in the middle of a message"):
            protocol.receive_reply(read_end, 5.0, "testing")
    finally:
        os.close(read_end)
        os.close(write_end)
