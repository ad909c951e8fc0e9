"""AutotuneResult.save_to_disk / load_from_disk: the kernel entries' protocol, for tune results."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import pytest

from autotuner import AutotuneResult, result_path
from kcache.errors import KCacheError
from kcache.maintenance.gc import collect_garbage
from kcache.results.autotune import COMPONENTS, FUNCTION
from kcache.store.manifest import MANIFEST_NAME, build_manifest

from .helpers import expect_line, spawn

MAKE_RESULT = """
from autotuner import AutotuneResult, ConfigOutcome, result_path
scale = 3
result = AutotuneResult(
    config={"block_m": 128, "threads": 256}, latency=0.42, ref_latency=0.97,
    configs=[ConfigOutcome({"block_m": 64, "threads": 384}, "out_of_resources", None, "threads: Required: 384, Hardware limit: 256"),
             ConfigOutcome({"block_m": 128, "threads": 256}, "ok", 0.42)],
    kernel_key="ab" * 32, out_idx=[2], target={"kind": "cuda", "arch": "sm_90a"},
    func=lambda x: x * scale, metadata={"device": "NVIDIA H200"},
)
"""


def make_result() -> AutotuneResult:
    namespace: dict = {}
    exec(MAKE_RESULT, namespace)
    return namespace["result"]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_result_saved_in_one_process_loads_in_another(tmp_path: Path) -> None:
    path = result_path(tmp_path, "matmul-4096")
    child = spawn(MAKE_RESULT + f"print(result.save_to_disk({str(path)!r}), flush=True)")
    assert child.communicate()[0].strip() == "True"
    loaded = AutotuneResult.load_from_disk(path)
    assert loaded is not None
    assert (loaded.config, loaded.latency, loaded.ref_latency) == ({"block_m": 128, "threads": 256}, 0.42, 0.97)
    assert loaded.configs[0].status == "out_of_resources" and loaded.configs[1].latency == 0.42
    assert (loaded.kernel_key, loaded.out_idx, loaded.target["arch"]) == ("ab" * 32, [2], "sm_90a")
    assert loaded.func(5) == 15 and loaded.metadata["device"] == "NVIDIA H200"
    assert sorted(os.listdir(path)) == sorted(COMPONENTS | {MANIFEST_NAME})
    assert AutotuneResult.load_from_disk(result_path(tmp_path, "never-saved")) is None


def test_concurrent_saves_of_one_key_publish_once_and_every_load_succeeds(tmp_path: Path) -> None:
    path = result_path(tmp_path, "same-tune")
    savers = [spawn(MAKE_RESULT + f"""
import sys
print("ready", flush=True); sys.stdin.readline()
published = result.save_to_disk({str(path)!r})
loaded = AutotuneResult.load_from_disk({str(path)!r})
print(published, loaded is not None and loaded.func(2), flush=True)
""") for _ in range(8)]
    for saver in savers:
        expect_line(saver, "ready")
    for saver in savers:  # released together: all stage at once
        saver.stdin.write("go\n")
        saver.stdin.flush()
    outcomes = [saver.communicate()[0].split() for saver in savers]
    assert sorted(published for published, _ in outcomes) == ["False"] * 7 + ["True"]
    assert all(value == "6" for _, value in outcomes)
    assert os.listdir(path.parent / ".staging") == []


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
@pytest.mark.parametrize("victim", sorted(COMPONENTS | {MANIFEST_NAME}))
def test_damage_to_any_file_is_a_miss_with_one_warning_and_a_save_repairs_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, victim: str, damage: str
) -> None:
    path = result_path(tmp_path, "damaged")
    assert make_result().save_to_disk(path)
    target = path / victim
    data = target.read_bytes()
    if damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        target.write_bytes(data[:-1] + bytes([data[-1] ^ 0x01]))
    else:
        target.unlink()

    with caplog.at_level(logging.WARNING, logger="kcache"):
        assert AutotuneResult.load_from_disk(path) is None
    assert len(warnings_of(caplog)) == 1 and str(path) in warnings_of(caplog)[0]

    assert make_result().save_to_disk(path)  # the damaged entry is moved aside, a fresh one published
    assert AutotuneResult.load_from_disk(path).func(1) == 3
    assert len(os.listdir(path.parent / ".quarantine")) == 1


def _tamper(path: Path, marker: Path) -> None:
    """Replace function.pkl with a pickle that runs code, and rewrite the manifest to match."""

    class Payload:
        def __reduce__(self):  # noqa: ANN204 - the pickle protocol
            return (open, (str(marker), "w"))

    import cloudpickle

    (path / FUNCTION).write_bytes(cloudpickle.dumps(Payload()))
    (path / MANIFEST_NAME).unlink()
    (path / MANIFEST_NAME).write_bytes(build_manifest(path))


@pytest.mark.parametrize("untrusted", ["world-writable entry", "world-writable parent", "owned by another user"])
def test_a_tampered_pickle_in_an_untrusted_directory_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, untrusted: str
) -> None:
    path = result_path(tmp_path, "tampered")
    assert make_result().save_to_disk(path)
    marker = tmp_path / "pickle-ran"
    _tamper(path, marker)
    if untrusted == "world-writable entry":
        path.chmod(0o777)
    elif untrusted == "world-writable parent":
        path.parent.chmod(0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        os.chown(path, 65534, 65534)

    with caplog.at_level(logging.WARNING, logger="kcache"):
        assert AutotuneResult.load_from_disk(path) is None
    assert not marker.exists()  # never unpickled
    assert len(warnings_of(caplog)) == 1 and "refusing to unpickle" in warnings_of(caplog)[0]

    # The control: the same entry verifies, so only the trust check stood in the way.
    path.chmod(0o755)
    path.parent.chmod(0o755)
    os.chown(path, os.geteuid(), os.getegid())
    AutotuneResult.load_from_disk(path)
    assert marker.exists()


def test_a_saver_killed_mid_save_leaves_nothing_partial_and_gc_cleans_its_staging(tmp_path: Path) -> None:
    path = result_path(tmp_path, "killed")
    saver = spawn(MAKE_RESULT + f"""
import sys
from kcache.store.entries import EntryStore
def pause(step):
    if step == "components_written":
        print("paused", flush=True); sys.stdin.readline()
EntryStore.fault_hook = staticmethod(pause)
result.save_to_disk({str(path)!r})
""")
    expect_line(saver, "paused")
    os.kill(saver.pid, signal.SIGKILL)
    saver.wait()
    assert not path.exists() and AutotuneResult.load_from_disk(path) is None
    (left,) = os.listdir(path.parent / ".staging")
    assert str(saver.pid) in left
    report = collect_garbage(tmp_path, staging_ttl_s=3600)  # the cache root: gc walks into autotuner/
    assert report.staging_removed == 1 and os.listdir(path.parent / ".staging") == []
    assert make_result().save_to_disk(path) and AutotuneResult.load_from_disk(path) is not None


def test_bad_names_and_unpicklable_functions_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid entry directory name"):
        result_path(tmp_path, "../escape")
    result = make_result()
    result.func = (x for x in range(3))  # a generator does not pickle
    with pytest.raises(KCacheError, match="does not pickle"):
        result.save_to_disk(result_path(tmp_path, "unpicklable"))
    assert not result_path(tmp_path, "unpicklable").exists()


def test_the_files_are_plain_json_a_person_can_read(tmp_path: Path) -> None:
    path = result_path(tmp_path, "readable")
    make_result().save_to_disk(path)
    assert json.loads((path / "best_config.json").read_text()) == {"block_m": 128, "threads": 256}
    assert json.loads((path / "latency.json").read_text()) == {"latency": 0.42, "ref_latency": 0.97}
