"""Tune once per job (issue 16): processes and nodes that tune one identity at once get one pick, from
one tune; a dead tuner is taken over; results of one device model never load on another.

The tuners are fresh interpreters (tests/tune_jobs.py) compiling a real TileLang kernel on CPU, with a
profiler whose latencies depend on the process: two tunes would pick differently.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

import kcache  # noqa: E402
from kcache.results.autotune import AutotuneResult  # noqa: E402
from kcache.store.locks import read_note  # noqa: E402

from .helpers import PROJECT, child_env  # noqa: E402
from .tune_jobs import CONFIGS, scale  # noqa: E402

pytestmark = pytest.mark.tilelang


@pytest.fixture(scope="module")
def compiled_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root holding the three configs' kernels: tests about claims and picks start from a copy of it
    rather than compiling them again (the first test and the cluster test compile for themselves)."""
    from stress.programs.kernels import CPU_TARGET

    root = tmp_path_factory.mktemp("compiled") / "root"
    cache = kcache.KernelCache(root)
    for config in CONFIGS:
        cache.get_or_compile(scale(**config), CPU_TARGET, out_idx=[1])
    return root


@pytest.fixture
def warm_root(compiled_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "warm-root"
    shutil.copytree(compiled_root, root, symlinks=True, ignore=shutil.ignore_patterns(".locks", ".stats"))
    return root


def tuner(root: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.tune_jobs", "--root", str(root), *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(**env), cwd=str(PROJECT))


def wait_for_stdout(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == word:
            return
    raise AssertionError(f"exited before printing {word!r}: rc={proc.wait()} {proc.stderr.read()[-3000:]}")


def wait_for_stderr(proc: subprocess.Popen[str], words: str) -> str:
    """Block until the process logs a line with `words` (its waiting message): a handshake, not a sleep."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if words in line:
            return line
    raise AssertionError(f"exited before logging {words!r}: rc={proc.wait()} {''.join(seen)[-3000:]}")


def result_of(proc: subprocess.Popen[str], timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    line = next(line for line in out.splitlines() if line.startswith("result "))
    return json.loads(line[len("result "):])


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def test_processes_tuning_one_identity_at_once_get_one_pick_from_one_tune_and_waits_are_bounded(
        cache_root: Path) -> None:
    holder = tuner(cache_root, "--hold")
    wait_for_stdout(holder, "benchmarking")
    waiters = [tuner(cache_root) for _ in range(2)]
    for waiter in waiters:
        said = wait_for_stderr(waiter, "waiting for its result")
        # Whom for, and how far it got: the holder's note in its lock file.
        assert f"pid {holder.pid} on " in said and "benchmarking 0/3" in said, said
    # A waiter that may wait half a second gives up, naming the holder and the setting.
    impatient = tuner(cache_root, KCACHE_TUNE_WAIT="0.5")
    _out, err = impatient.communicate(timeout=120)
    assert impatient.returncode != 0
    assert "TuneWaitTimeout" in err and f"pid {holder.pid} on " in err and "KCACHE_TUNE_WAIT" in err, err[-2000:]
    release(holder)
    first, *others = [result_of(p) for p in [holder, *waiters]]
    assert first["timed"] == len(CONFIGS) and first["compiles"] == len(CONFIGS)
    for other in others:
        assert other["config"] == first["config"]
        assert other["timed"] == 0 and other["compiles"] == 0  # they neither benchmarked nor compiled
    notes = [read_note(p) for p in (cache_root / ".locks").glob("tune-*.lock")]
    assert notes == [b""], notes  # the note ends with the hold


def test_a_tuner_killed_while_benchmarking_is_taken_over_and_all_survivors_agree(warm_root: Path) -> None:
    cache_root = warm_root
    victim = tuner(cache_root, "--hold")
    wait_for_stdout(victim, "benchmarking")
    heir = tuner(cache_root)
    wait_for_stderr(heir, f"pid {victim.pid} on ")
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    took_over = result_of(heir)
    assert took_over["timed"] == len(CONFIGS)  # it tuned, after the kernel released the dead one's lock
    assert took_over["compiles"] == 0  # the compiles are in the cache: none repeated
    later = result_of(tuner(cache_root))
    assert later["config"] == took_over["config"] and later["timed"] == 0


@contextlib.contextmanager
def cluster(kind: str, workdir: Path):
    """The environment of nodes sharing a real redis-server, or a real S3-protocol server's bucket
    (whose lease objects then make the tune once)."""
    if kind == "redis":
        pytest.importorskip("redis", reason="the remote tier needs redis-py (pip install -e '.[test]')")
        from .redis_server import redis_server

        with redis_server(workdir) as (url, _server):
            yield {"KCACHE_REMOTE": url}
    else:
        pytest.importorskip("obstore", reason="the S3 tier needs obstore (pip install -e '.[test]')")
        from .s3_server import s3_server

        with s3_server() as bucket:
            yield {"KCACHE_REMOTE": bucket.url("tune-once"), **bucket.env}


@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_two_nodes_sharing_a_remote_tier_tune_once(tmp_path: Path, kind: str) -> None:
    with cluster(kind, tmp_path) as shared:
        remote = {**shared, "KCACHE_REMOTE_SECRET": "cluster-secret"}
        first = tuner(tmp_path / "node-a", "--hold", **remote)
        wait_for_stdout(first, "benchmarking")
        second = tuner(tmp_path / "node-b", **remote)
        wait_for_stderr(second, "another node holds the tune lease")
        release(first)
        a, b = result_of(first), result_of(second)
    assert b["config"] == a["config"] and b["timed"] == 0 and b["compiles"] == 0
    assert a["compiles"] == len(CONFIGS)  # the configs compiled once in the cluster
    assert (tmp_path / "node-b" / "autotuner").is_dir()  # the remote result was published locally
    assert b["after_load"]["compiles"] == 0 and b["after_load"]["remote_hits"] == 1  # its best kernel too


def test_a_forced_retune_shares_its_result_and_best_kernel_compiled_before_the_remote(tmp_path: Path,
                                                                                       warm_root: Path) -> None:
    """Node a tuned before the cluster had Redis (its kernels are local only); a forced re-tune with
    Redis uploads the result and its best kernel, and node b compiles nothing."""
    pytest.importorskip("redis", reason="the remote tier needs redis-py (pip install -e '.[test]')")
    from .redis_server import redis_server

    shutil.copytree(warm_root, tmp_path / "node-a", symlinks=True)  # its kernels, compiled without Redis
    local = result_of(tuner(tmp_path / "node-a"))
    assert local["compiles"] == 0 and local["timed"] == len(CONFIGS)
    with redis_server(tmp_path) as (url, _server):
        remote = {"KCACHE_REMOTE": url, "KCACHE_REMOTE_SECRET": "cluster-secret"}
        forced = result_of(tuner(tmp_path / "node-a", "--force", **remote))
        assert forced["timed"] == len(CONFIGS) and forced["compiles"] == 0  # re-timed, nothing recompiled
        b = result_of(tuner(tmp_path / "node-b", **remote))
    assert b["config"] == forced["config"] and b["timed"] == 0
    assert b["after_load"]["compiles"] == 0 and b["after_load"]["remote_hits"] == 1


def fixed_profiler(fastest: int, calls: list):
    def measure(kernel, inputs):
        block = int(str(kernel.prim_func.attrs["global_symbol"]).rsplit("_", 1)[1])
        calls.append(block)
        return 0.1 if block == fastest else 1.0

    return measure


def tune_scale(root: Path, fastest: int, calls: list, **options) -> AutotuneResult:
    import autotuner
    from stress.programs.kernels import CPU_TARGET

    return autotuner.tune(scale, CONFIGS, inputs=[], target=CPU_TARGET, out_idx=[1], cache=kcache.KernelCache(root),
                          profiler=fixed_profiler(fastest, calls), verbose=False, **options)


def test_a_result_of_one_device_model_is_not_loaded_on_another(warm_root: Path) -> None:
    cache_root = warm_root
    h100 = {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "sms": 132, "memory_gib": 80}
    h200 = {"name": "NVIDIA H200", "capability": "9.0", "sms": 132, "memory_gib": 141}
    calls: list = []
    on_h100 = tune_scale(cache_root, 128, calls, device=h100)
    assert on_h100.config == {"block": 128} and len(calls) == 3
    on_h200 = tune_scale(cache_root, 256, calls, device=h200)  # same arch, another model: tuned again
    assert on_h200.config == {"block": 256} and len(calls) == 6
    assert tune_scale(cache_root, 512, calls, device=h100).config == {"block": 128} and len(calls) == 6
    saved_on_h100 = next(p for p in (cache_root / "autotuner").iterdir()
                         if AutotuneResult.load_from_disk(p, device=None).device == {"kind": "cuda", **h100})
    assert AutotuneResult.load_from_disk(saved_on_h100, device=h200) is None
    assert AutotuneResult.load_from_disk(saved_on_h100, device=h100).config == {"block": 128}


def test_a_saved_pick_is_replaced_only_by_force(warm_root: Path) -> None:
    cache_root = warm_root
    calls: list = []
    assert tune_scale(cache_root, 128, calls).config == {"block": 128}
    assert tune_scale(cache_root, 256, calls).config == {"block": 128} and len(calls) == 3  # loaded
    forced = tune_scale(cache_root, 256, calls, force=True)
    assert forced.config == {"block": 256} and len(calls) == 6
    assert tune_scale(cache_root, 512, calls).config == {"block": 256} and len(calls) == 6


def test_the_cli_lists_tunes_and_untune_makes_the_next_tune_run(warm_root: Path) -> None:
    cache_root = warm_root
    calls: list = []
    tune_scale(cache_root, 128, calls)

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kcache", "--dir", str(cache_root), *argv], capture_output=True,
                              text=True, env=child_env(), cwd=str(PROJECT), timeout=120, check=False)

    listed = json.loads(cli("tunes", "--json").stdout)
    assert [(e["factory"], e["config"]) for e in listed] == [("tests.tune_jobs.scale", {"block": 128})]
    done = cli("untune", listed[0]["key"][:12])
    assert done.returncode == 0 and "the next tune of it runs again" in done.stdout, done.stdout + done.stderr
    assert tune_scale(cache_root, 256, calls).config == {"block": 256} and len(calls) == 6
    missing = cli("untune", "ffffffff")
    assert missing.returncode == 1 and "no autotune result matches 'ffffffff'" in missing.stderr  # one line there
    assert missing.stdout == ""


def test_a_result_saved_without_its_device_loads_on_any(cache_root: Path) -> None:
    """save_to_disk by code that does not say where it measured (TileLang's API, say) records the
    current CUDA device where torch runs one, and nothing elsewhere: such a result loads anywhere."""
    from kcache.results.device import current_device_identity

    path = cache_root / "autotuner" / "by-hand"
    AutotuneResult(config={"block": 128}, latency=0.1, func=None).save_to_disk(path)
    loaded = AutotuneResult.load_from_disk(path, device={"name": "NVIDIA H200"})
    here = current_device_identity()
    if here["kind"] == "none":
        assert loaded is not None and loaded.device is None
    else:  # on the GPU machine it records the GPU it ran on, which is no H200
        assert loaded is None and AutotuneResult.load_from_disk(path).device == here
