"""The stress harness end to end: short runs with kills and corruption must keep every invariant."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import PROJECT, child_env


def run_stress(tmp_path: Path, *args: str, root: Path | None = None) -> dict:
    """One run (on a fresh root in the temporary directory unless `root`): it must pass, and remove
    what it made there: its logs, its fresh root, its service's runtime directory, and its children's
    temporary files (nvcc's of a compile killed by the chaos among them)."""
    out = tmp_path / "summary.json"
    where = ["--cache-dir", str(root)] if root is not None else ["--fresh"]
    # The run's own temporary directory, so that other processes' files cannot be taken for its
    # own; its service's runtime directory is in /tmp itself (a socket's path is short).
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "stress", *where, "--quiet", "--seed", "7", "--json", str(out), *args],
        capture_output=True, text=True, env=child_env(TMPDIR=str(scratch)), cwd=str(PROJECT), timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "invariants checked: no partial entry observed;" in done.stdout
    summary = json.loads(out.read_text())
    left = os.listdir(scratch) + ([summary["service_runtime"]] if os.path.exists(summary["service_runtime"]) else [])
    assert not left, f"the stress run left {left} behind"
    return summary


def test_synthetic_run_with_kills_and_corruption_keeps_every_invariant(tmp_path: Path) -> None:
    summary = run_stress(tmp_path, "--synthetic", "--procs", "4", "--duration", "8", "--kill-rate", "1", "--corrupt-rate", "4")
    assert summary["invariants"]["pass"]
    assert summary["ops"] > 1000 and summary["kills"] >= 1
    assert summary["corruptions"]["injected"] >= 5
    assert summary["corruptions"]["detected"] == summary["corruptions"]["injected"]


def test_synthetic_run_with_an_s3_tier_kills_and_corruption_keeps_every_invariant(tmp_path: Path) -> None:
    """`--remote local-s3`: the workers share a bucket of a real S3-protocol server process besides the
    root; a corrupted local entry is then mended from the bucket or by a compile. Its throughput is
    not asserted: it moves with the bucket's server (131 to over 1,000 operations in 8 s here)."""
    pytest.importorskip("obstore", reason="the S3 tier needs obstore (pip install -e '.[test]')")
    summary = run_stress(tmp_path, "--synthetic", "--procs", "4", "--duration", "8", "--kill-rate", "1",
                         "--corrupt-rate", "4", "--remote", "local-s3")
    assert summary["invariants"]["pass"]
    assert summary["kills"] >= 1 and summary["corruptions"]["injected"] >= 5
    assert summary["corruptions"]["detected"] == summary["corruptions"]["injected"]
    assert summary["hits"]["remote"] >= 1


@pytest.mark.tilelang
def test_short_real_tilelang_run_keeps_every_invariant(tmp_path: Path) -> None:
    pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")
    summary = run_stress(tmp_path, "--procs", "3", "--kernels", "2", "--duration", "20", "--kill-rate", "0.1", "--corrupt-rate", "0.5")
    assert summary["invariants"]["pass"]
    assert summary["nvcc_compiles"] == summary["compiles"] or summary["compiles_interrupted"] > 0
    assert summary["ops"] > 0


def test_a_second_run_on_one_root_reports_only_its_own_detections_and_repairs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    first = run_stress(tmp_path, "--synthetic", "--procs", "3", "--duration", "4", "--kill-rate", "0",
                       "--corrupt-rate", "6", root=root)
    assert first["repairs"] >= 1  # the root now holds quarantined entries of the first run
    second = run_stress(tmp_path, "--synthetic", "--procs", "3", "--duration", "4", "--kill-rate", "0",
                        "--corrupt-rate", "6", root=root)
    c = second["corruptions"]
    assert c["by_workers"] + c["at_final_check"] == c["detected"] == c["injected"]
    assert second["repairs"] < len(os.listdir(root / ".quarantine"))  # the first run's are not its own
    assert second["compiles"] <= second["kernels"] + second["compiles_interrupted"] + second["repairs"]


def test_the_default_run_loads_a_throwaway_root_not_the_users_cache(tmp_path: Path) -> None:
    """Issue 37: with KCACHE_DIR set, and the platform's cache directory in a HOME of the test's, a run
    that names no root writes into neither. It names its throwaway root, in the temporary directory,
    and removes it at the end, unless --keep-root."""
    home, configured, scratch = tmp_path / "home", tmp_path / "configured", tmp_path / "tmp"
    home.mkdir()
    scratch.mkdir()
    env = child_env(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), KCACHE_DIR=str(configured),
                    TMPDIR=str(scratch))
    argv = [sys.executable, "-m", "stress", "--synthetic", "--quiet", "--procs", "2", "--duration", "2",
            "--kill-rate", "0", "--corrupt-rate", "1"]
    for extra, fate in (([], "removed at the end, --keep-root keeps it"), (["--keep-root"], "kept at the end")):
        done = subprocess.run([*argv, *extra], capture_output=True, text=True, env=env, cwd=str(PROJECT), timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert not configured.exists() and not (home / ".cache").exists()  # the user's roots: untouched
        root = Path(re.search(rf"; root (\S+) \(throwaway: {fate}\);", done.stdout).group(1))
        assert root.parent == scratch
        if extra:
            assert f"root kept: {root}" in done.stdout and (root / "kernels").is_dir()
            shutil.rmtree(root)
        else:
            assert not root.exists()
    assert os.listdir(scratch) == []


def test_a_worker_that_cannot_start_is_one_line_with_its_reason_and_nothing_is_left(tmp_path: Path) -> None:
    """A TileLang that is there but broken (a package whose import fails, first on the path): the run
    names the worker, the last line of its stderr and its log, keeps the logs and says where, removes
    its throwaway root, and leaves nothing else (issue 37: it used to raise `worker 0 failed before the
    barrier: ''`)."""
    broken = tmp_path / "broken" / "tilelang"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("libtvm.so: cannot open shared object file")\n')
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = child_env(TMPDIR=str(scratch))
    env["PYTHONPATH"] = os.pathsep.join([str(broken.parent), env["PYTHONPATH"]])
    done = subprocess.run([sys.executable, "-m", "stress", "--procs", "2", "--duration", "5", "--quiet"],
                          capture_output=True, text=True, env=env, cwd=str(PROJECT), timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    logs = Path(re.search(r"workers' logs kept in (\S+);", line).group(1))
    assert re.match(r"stress: worker \d failed before the barrier: ImportError: libtvm.so: cannot open shared object "
                    rf"file \(its stderr: {logs}/worker-\d-0.err\); workers' logs kept in {logs}; throwaway root "
                    r"\S+ removed$", line), line
    assert os.listdir(scratch) == [logs.name]


def test_a_violation_fails_the_run(tmp_path: Path) -> None:
    # An entry corrupted before the run, not by chaos, must be reported as a violation.
    root = tmp_path / "root"
    (root / "kernels" / ("ab" * 32)).mkdir(parents=True)
    out = tmp_path / "summary.json"
    done = subprocess.run(
        [sys.executable, "-m", "stress", "--synthetic", "--quiet", "--cache-dir", str(root), "--procs", "2",
         "--duration", "2", "--kill-rate", "0", "--corrupt-rate", "0", "--json", str(out)],
        capture_output=True, text=True, env=child_env(), cwd=str(PROJECT), timeout=300,
    )
    assert done.returncode == 1
    summary = json.loads(out.read_text())
    assert any("without injected corruption" in v for v in summary["invariants"]["violations"])
    logs = Path(summary["run_dir"])  # kept for the failed run, and named
    assert f"workers' logs: {logs}" in done.stdout and list(logs.glob("worker-*.jsonl"))
    shutil.rmtree(logs)


def test_the_chaos_mix_finds_the_compile_server_not_its_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server kill must hit the server: its template and workers are forks with its command line
    (the H100's stress run with server kills killed workers instead, and called it a crash)."""
    from kcache.compile.pool.process_pool import CompilePool
    from kcache.compile.service import client as service_client
    from kcache.compile.service import connection as service_connection
    from stress.service_runtime import fresh_runtime, service_pids, stop_services

    runtime = fresh_runtime("kt-")
    runtime.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    pool = service_client.ServicePool(2, None, (), 60.0, lambda: CompilePool(1, None, preload=()))
    try:
        pool.warm(2, wait=True)
        served = service_connection.request(pool.name, ("status",))
        assert served["template_pid"] is not None and len(served["worker_pids"]) == 2
        assert service_pids(runtime) == [pool.server_pid]
    finally:
        pool.close()
        stop_services(runtime)
