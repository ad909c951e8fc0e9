"""The entry store: publish protocol, verification, quarantine, errno filtering, real faults."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from kcache.errors import CorruptEntry, PublishError
from kcache.store.entries import PUBLISH_STEPS, EntryStore, PublishOutcome
from kcache.store.fsutil import write_durable
from kcache.store.layout import StagingName
from kcache.store.manifest import MANIFEST_NAME

from .faults import fill_filesystem, needs_root, readonly_bind, tmpfs

REQUIRED = frozenset({"kernel.so", "params.json"})
KEY = "ab" * 32
FILES = {"kernel.so": b"\x7fELF" + os.urandom(4000), "params.json": b'{"params": []}', "device.cu": b"// source"}


def filler(files: dict[str, bytes] = FILES):
    def fill(staging: Path) -> None:
        for name, data in files.items():
            write_durable(staging / name, data)
    return fill


def make_store(root: Path) -> EntryStore:
    return EntryStore(root, "kernels", REQUIRED)


def staging_leftovers(root: Path) -> list[str]:
    staging = root / ".staging"
    return sorted(os.listdir(staging)) if staging.exists() else []


def test_publish_then_read_returns_verified_files(cache_root: Path) -> None:
    store = make_store(cache_root)
    assert store.read(KEY) is None
    assert store.publish(KEY, filler()) is PublishOutcome.PUBLISHED
    files = store.read(KEY)
    assert files is not None
    assert files == FILES
    manifest = json.loads((store.entry_path(KEY) / MANIFEST_NAME).read_bytes())
    assert set(manifest["files"]) == set(FILES)
    assert staging_leftovers(cache_root) == []


def test_second_publish_of_same_key_loses_the_race_and_keeps_the_first(cache_root: Path) -> None:
    store = make_store(cache_root)
    store.publish(KEY, filler())
    other = dict(FILES, **{"device.cu": b"// another writer"})
    assert store.publish(KEY, filler(other)) is PublishOutcome.LOST_RACE
    assert store.read(KEY)["device.cu"] == b"// source"
    assert staging_leftovers(cache_root) == []


def test_missing_required_component_publishes_nothing(cache_root: Path) -> None:
    store = make_store(cache_root)
    with pytest.raises(Exception, match="lacks required component"):
        store.publish(KEY, filler({"kernel.so": b"x"}))
    assert not store.entry_path(KEY).exists()
    assert staging_leftovers(cache_root) == []


def test_a_failing_writer_leaves_nothing_and_its_error_is_not_hidden(cache_root: Path) -> None:
    store = make_store(cache_root)

    def broken(staging: Path) -> None:
        write_durable(staging / "kernel.so", b"half")
        raise RuntimeError("exporter crashed")

    with pytest.raises(RuntimeError, match="exporter crashed"):
        store.publish(KEY, broken)
    assert not store.entry_path(KEY).exists()
    assert staging_leftovers(cache_root) == []


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "extra", "symlink", "manifest", "no-manifest"])
def test_damaged_entries_are_corrupt_never_partial(cache_root: Path, damage: str) -> None:
    store = make_store(cache_root)
    store.publish(KEY, filler())
    entry = store.entry_path(KEY)
    so = entry / "kernel.so"
    if damage == "truncate":
        os.truncate(so, 100)
    elif damage == "flip":
        data = bytearray(so.read_bytes())
        data[len(data) // 2] ^= 0xFF
        so.write_bytes(bytes(data))
    elif damage == "delete":
        (entry / "params.json").unlink()
    elif damage == "extra":
        (entry / "evil.so").write_bytes(b"x")
    elif damage == "symlink":
        so.unlink()
        so.symlink_to("/bin/true")
    elif damage == "manifest":
        (entry / MANIFEST_NAME).write_text("{not json")
    elif damage == "no-manifest":
        (entry / MANIFEST_NAME).unlink()
    with pytest.raises(CorruptEntry) as caught:
        store.read(KEY)
    assert str(entry) in str(caught.value)


def test_quarantine_moves_the_entry_aside_and_records_why(cache_root: Path) -> None:
    store = make_store(cache_root)
    store.publish(KEY, filler())
    moved = store.quarantine(KEY, "kernel.so does not match its sha256")
    assert moved is not None and moved.parent == cache_root / ".quarantine"
    assert (moved / "QUARANTINED.txt").read_text().startswith("kernel.so does not match")
    assert store.read(KEY) is None
    assert store.quarantine(KEY, "again") is None  # already gone: nothing to move


@needs_root
def test_rename_errors_other_than_races_are_raised_with_context(cache_root: Path) -> None:
    # A real EXDEV: the entries directory is another filesystem (a tmpfs mounted over it), so the
    # publishing rename out of .staging crosses devices.
    store = make_store(cache_root)
    store.entries_dir.mkdir(parents=True)
    with tmpfs(store.entries_dir):
        assert os.stat(store.entries_dir).st_dev != os.stat(cache_root).st_dev  # the fault is real
        with pytest.raises(PublishError) as caught:
            store.publish(KEY, filler())
        assert caught.value.errno == errno.EXDEV
        assert str(store.entry_path(KEY)) in str(caught.value) and "EXDEV" in str(caught.value)
        assert staging_leftovers(cache_root) == [] and not store.entry_path(KEY).exists()


def test_keys_must_be_hex_so_no_name_escapes_the_root(cache_root: Path) -> None:
    store = make_store(cache_root)
    for bad in ["../../etc", "AB" * 32, "g" * 64, "", "ab/cd" * 8]:
        with pytest.raises(ValueError, match="invalid cache key"):
            store.entry_path(bad)


def test_staging_names_round_trip_even_with_dotted_hostnames() -> None:
    name = StagingName(KEY, "node_1_cluster", 4242, "f00d")
    assert StagingName.parse(str(name)) == name
    assert StagingName.parse("junk") is None


@pytest.mark.parametrize("step", PUBLISH_STEPS[:-1])
def test_a_crash_before_the_rename_never_publishes(cache_root: Path, step: str) -> None:
    store = make_store(cache_root)

    class Crash(BaseException):
        pass

    def crash_at(name: str) -> None:
        if name == step:
            raise Crash(name)

    store.fault_hook = crash_at
    with pytest.raises(Crash):
        store.publish(KEY, filler())
    assert store.read(KEY) is None


@needs_root
def test_real_enospc_removes_staging_and_names_the_cause(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "tiny", size="1m") as mount:
        root = mount / "cache"
        root.mkdir()
        fill_filesystem(mount, leave_bytes=16 * 1024)
        store = make_store(root)
        big = dict(FILES, **{"kernel.so": os.urandom(200 * 1024)})
        with pytest.raises(PublishError) as caught:
            store.publish(KEY, filler(big))
        assert caught.value.errno == errno.ENOSPC
        assert "ENOSPC" in str(caught.value) and "full" in str(caught.value)
        assert not store.entry_path(KEY).exists()
        assert staging_leftovers(root) == []


@needs_root
def test_real_read_only_filesystem_is_a_publish_error_and_hits_still_work(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    store = make_store(root)
    store.publish(KEY, filler())
    other = "cd" * 32
    with readonly_bind(root):
        assert store.read(KEY) is not None
        with pytest.raises(PublishError) as caught:
            store.publish(other, filler())
        assert caught.value.errno == errno.EROFS
    assert not store.entry_path(other).exists()
