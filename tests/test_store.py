"""The entry store: publish protocol, verification, quarantine, errno filtering, real faults."""

from __future__ import annotations

import errno
import json
import os
import re
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcache.errors import CorruptEntry, PublishError
from kcache.maintenance.gc import collect_garbage
from kcache.store import publish_batch
from kcache.store.entries import PUBLISH_STEPS, EntryStore, PublishOutcome
from kcache.store.fsutil import fsync_tree_at, sha256_hex, sync_filesystem, write_durable
from kcache.store.layout import StagingName
from kcache.store.manifest import MANIFEST_NAME, build_manifest, is_entry_file_name
from kcache.store.publish_batch import BATCH_STEPS
from kcache.store.publish_batch import publish_batch as batch_of

from .faults import fill_filesystem, needs_root, readonly_bind, tmpfs
from .helpers import expect_line, snapshot, spawn

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


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet=string.ascii_letters + string.digits + "._-/ \n\x00\u00e9", max_size=140))
def test_an_entry_file_name_is_one_plain_component_as_the_manifest_format_says(name: str) -> None:
    # The check is written with sets (a regular expression costs its compile on a hit); it means this one.
    plain = re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}", name) is not None and name != MANIFEST_NAME
    assert is_entry_file_name(name) == plain
    assert not is_entry_file_name(MANIFEST_NAME) and is_entry_file_name("a" * 128) and not is_entry_file_name("a" * 129)


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


# ---------------------------------------------------------------- batch publish (bundle import)

BATCH = {f"{index:02x}" * 32: dict(FILES, **{"kernel.so": os.urandom(3000) + bytes([index])}) for index in range(4)}


class Crash(BaseException):
    """A crash injected through fault_hook: not an Exception, so nothing on the way catches it."""


def test_a_batch_publishes_every_entry_with_the_stores_own_manifest(cache_root: Path) -> None:
    store = make_store(cache_root)
    first = next(iter(BATCH))
    store.publish(first, filler(BATCH[first]))  # already there: the batch loses that race
    with batch_of(store) as batch:
        for key, files in BATCH.items():
            batch.stage(key, {**files, MANIFEST_NAME: b"not copied"},
                        {name: sha256_hex(data) for name, data in files.items()})
        assert store.keys() == [first]  # staged, verified: still invisible
        outcomes = batch.publish()
    assert outcomes == {key: PublishOutcome.LOST_RACE if key == first else PublishOutcome.PUBLISHED for key in BATCH}
    for key, files in BATCH.items():
        assert store.read(key) == files
        entry = store.entry_path(key)
        assert (entry / MANIFEST_NAME).read_bytes() == build_manifest(entry)  # one format, shared
        assert all(path.stat().st_mode & 0o222 == 0 for path in entry.iterdir())  # written once: read-only
    assert staging_leftovers(cache_root) == []


def test_syncfs_is_what_makes_a_batch_durable_here(cache_root: Path) -> None:
    fd = os.open(cache_root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert sync_filesystem(fd) is True  # this Linux has syncfs: the batch path the tests run is the real one
    finally:
        os.close(fd)


def test_without_syncfs_a_batch_fsyncs_every_staged_entry(cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []

    def record(dir_fd: int, name: str) -> None:
        synced.append(name)
        fsync_tree_at(dir_fd, name)

    monkeypatch.setattr(publish_batch, "sync_filesystem", lambda fd: False)
    monkeypatch.setattr(publish_batch, "fsync_tree_at", record)
    store = make_store(cache_root)
    with batch_of(store) as batch:
        for key, files in BATCH.items():
            batch.stage(key, files)
        assert set(batch.publish().values()) == {PublishOutcome.PUBLISHED}
    assert sorted(StagingName.parse(name).key for name in synced) == sorted(BATCH)
    assert store.keys() == sorted(BATCH)


def test_a_batch_with_one_bad_entry_publishes_none_and_leaves_no_staging(cache_root: Path) -> None:
    store = make_store(cache_root)
    keys = list(BATCH)
    with pytest.raises(CorruptEntry, match="does not match its sha256") as caught:
        with batch_of(store) as batch:
            for key in keys[:2]:
                batch.stage(key, BATCH[key])
            wrong = {name: sha256_hex(data) for name, data in BATCH[keys[2]].items()}
            wrong["kernel.so"] = sha256_hex(b"other bytes")  # a digest not of the bytes staged
            batch.stage(keys[2], BATCH[keys[2]], wrong)
    assert keys[2][:16] in str(caught.value)  # the original error, naming the bad entry's staging
    assert store.keys() == [] and staging_leftovers(cache_root) == []


def test_a_batch_whose_failed_stage_was_caught_is_never_published(cache_root: Path) -> None:
    store = make_store(cache_root)
    keys = list(BATCH)
    with batch_of(store) as batch:
        batch.stage(keys[0], BATCH[keys[0]])
        with pytest.raises(Exception, match="lacks required component"):
            batch.stage(keys[1], {"kernel.so": b"x"})
        with pytest.raises(RuntimeError, match="published once"):
            batch.publish()
    assert store.keys() == [] and staging_leftovers(cache_root) == []


@pytest.mark.parametrize("step", PUBLISH_STEPS[:-1] + BATCH_STEPS)
def test_a_crash_anywhere_before_the_renames_publishes_nothing(cache_root: Path, step: str) -> None:
    store = make_store(cache_root)
    fired = []

    def crash_at(name: str) -> None:
        fired.append(name)
        if name == step and fired.count(step) == (1 if step in BATCH_STEPS else 3):  # the third entry's
            raise Crash(name)

    store.fault_hook = crash_at
    with pytest.raises(Crash):
        with batch_of(store) as batch:
            for key, files in BATCH.items():
                batch.stage(key, files)
            batch.publish()
    assert step in fired and "renamed" not in fired
    assert store.keys() == [] and staging_leftovers(cache_root) == []


BATCH_WRITER = """
import os, sys
from pathlib import Path
from kcache.store.entries import EntryStore
from kcache.store.publish_batch import publish_batch
store = EntryStore(Path(os.environ["BATCH_ROOT"]), "kernels", frozenset({"kernel.so", "params.json"}))
def stop(step):
    if step == "synced":
        print("synced", flush=True)
        sys.stdin.readline()
store.fault_hook = stop
with publish_batch(store) as batch:
    for index in range(3):
        batch.stage(f"{index:02x}" * 32, {"kernel.so": os.urandom(2000), "params.json": b"{}"})
    batch.publish()
"""


def test_a_batch_killed_after_its_sync_leaves_staging_only_which_gc_removes(cache_root: Path) -> None:
    writer = spawn(BATCH_WRITER, BATCH_ROOT=str(cache_root))
    expect_line(writer, "synced")
    writer.kill()
    writer.wait()
    store = make_store(cache_root)
    assert store.keys() == []
    assert len(staging_leftovers(cache_root)) == 3  # whole, synced, never renamed
    assert collect_garbage(cache_root, staging_ttl_s=3600).staging_removed == 3  # its process is dead
    assert staging_leftovers(cache_root) == []


@pytest.mark.parametrize("swapped", [".staging", "kernels"])
def test_a_link_swapped_in_during_a_batch_is_never_written_or_renamed_through(tmp_path: Path, swapped: str) -> None:
    """Between two entries of a batch, the directory is moved away and a link to elsewhere put in its
    place: the batch stages into, syncs and renames between the directories it opened, never the link."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = make_store(root)
    keys = list(BATCH)
    before = snapshot(elsewhere), os.stat(elsewhere).st_mtime_ns
    with batch_of(store) as batch:
        batch.stage(keys[0], BATCH[keys[0]])
        os.rename(root / swapped, root / f"{swapped}.moved")
        os.symlink(elsewhere, root / swapped)
        for key in keys[1:]:
            batch.stage(key, BATCH[key])
        assert set(batch.publish().values()) == {PublishOutcome.PUBLISHED}
    assert (root / swapped).is_symlink()  # the link stayed in place all along
    assert (snapshot(elsewhere), os.stat(elsewhere).st_mtime_ns) == before
    moved = root / f"{swapped}.moved"
    if swapped == "kernels":  # every entry landed in the directory the batch held
        assert sorted(os.listdir(moved)) == sorted(keys)
    else:  # every entry was staged in the held .staging, and renamed out of it
        assert os.listdir(moved) == []
        assert sorted(os.listdir(root / "kernels")) == sorted(keys)


@pytest.mark.parametrize("xdg", [None, "", "  ", "/x/cache", "relative/dir", "~/c"])
def test_the_default_root_is_where_platformdirs_puts_the_users_cache(xdg: str | None,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """kcache computes the per-user cache directory itself on Linux (a hit loads no platformdirs): the
    same directory platformdirs names, whatever XDG_CACHE_HOME holds."""
    import platformdirs

    from kcache.setting_values import default_root
    from kcache.store.user_dirs import user_cache_dir

    monkeypatch.delenv("KCACHE_DIR", raising=False)
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    expected = platformdirs.user_cache_dir("kcache", appauthor=False)
    assert user_cache_dir("kcache") == expected and default_root() == Path(expected)
