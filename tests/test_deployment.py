"""Deployment (issue 18): recording the keys a run asks for, checking a bundle covers them, the JIT
guard, and the two-machine path (record on A, export, import on B, serve with no compile)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import kcache
from kcache.bundle.importer import export_bundle, missing_coverage, read_key_records
from kcache.cache import deployment
from stress.programs import synthetic

from .helpers import PROJECT, child_env


@pytest.fixture(autouse=True)
def _process_wide_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """record() and guard() are process-wide: each test starts from the environment's (unset) choice."""
    monkeypatch.setattr(deployment, "_recorder", None)
    monkeypatch.setattr(deployment, "_recorder_from_env", False)
    monkeypatch.setattr(deployment, "_guard", None)
    monkeypatch.setattr(deployment, "_warned", set())
    for name in ("KCACHE_RECORD", "KCACHE_JIT_GUARD"):
        monkeypatch.delenv(name, raising=False)


def get(cache: kcache.KernelCache, name: str):
    return cache.get_or_compile(synthetic.SyntheticFunc(name), "synthetic")


def test_record_appends_each_key_asked_for_once_per_process_hit_or_miss(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.jsonl"
    kcache.record(keys_file)
    cache = kcache.KernelCache(tmp_path / "root", backend=synthetic)
    for name in ("k0", "k1", "k0"):  # the second k0 is a memory hit
        get(cache, name)
    other = kcache.KernelCache(tmp_path / "root", backend=synthetic)
    get(other, "k1")  # a disk hit in another cache of the process: recorded already
    records = [json.loads(line) for line in keys_file.read_text().splitlines()]
    assert [r["kernel"] for r in records] == ["k0", "k1"]
    assert sorted(r["key"] for r in records) == sorted(other.store.keys())
    kcache.record(None)
    get(cache, "k2")
    assert len(keys_file.read_text().splitlines()) == 2


def test_processes_recording_into_one_file_through_the_environment(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.jsonl"
    code = (f"import kcache; from stress.programs import synthetic; c = kcache.KernelCache({str(tmp_path / 'root')!r}, "
            "backend=synthetic); [c.get_or_compile(synthetic.SyntheticFunc(n), 'synthetic') for n in ('k0', 'k1')]")
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], check=True, env=child_env(KCACHE_RECORD=str(keys_file)),
                       cwd=str(PROJECT), timeout=120)
    assert len(keys_file.read_text().splitlines()) == 4  # each process records its keys once
    assert [r["kernel"] for r in read_key_records(keys_file)] == ["k0", "k1"]


def test_verify_coverage_names_exactly_the_keys_removed_from_a_bundle(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.jsonl"
    kcache.record(keys_file)
    cache = kcache.KernelCache(tmp_path / "root", backend=synthetic)
    for index in range(6):
        get(cache, f"k{index}")
    records = read_key_records(keys_file)
    removed = [records[1]["key"], records[4]["key"]]
    bundle = tmp_path / "partial.kcb"
    export_bundle(bundle, root=tmp_path / "root", keys=[r["key"] for r in records if r["key"] not in removed],
                  secret="s")
    assert [r["key"] for r in missing_coverage(records, bundle=bundle)] == removed

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kcache", *argv], capture_output=True, text=True,
                              env=child_env(), cwd=str(PROJECT), timeout=120, check=False)

    done = cli("verify-coverage", "--keys", str(keys_file), str(bundle))
    assert done.returncode == 1 and "2 keys of 6 would compile" in done.stdout, done.stdout + done.stderr
    assert {line.split()[0] for line in done.stdout.splitlines()[2:]} == {k[:16] for k in removed}
    assert {line.split()[1] for line in done.stdout.splitlines()[2:]} == {"k1", "k4"}
    whole = cli("--dir", str(tmp_path / "root"), "verify-coverage", "--keys", str(keys_file))
    assert whole.returncode == 0 and "covers all 6 keys" in whole.stdout, whole.stdout


def test_the_jit_guard_refuses_or_warns_before_compiling_and_lets_hits_through(tmp_path: Path, caplog) -> None:
    cache = kcache.KernelCache(tmp_path / "root", backend=synthetic)
    get(cache, "warm")
    kcache.guard("error")
    assert get(kcache.KernelCache(tmp_path / "root", backend=synthetic), "warm") is not None  # a hit passes
    with pytest.raises(kcache.UnexpectedCompile) as refused:
        get(cache, "cold")
    assert refused.value.kernel == "cold" and refused.value.key[:16] in str(refused.value)
    assert "KCACHE_JIT_GUARD" in str(refused.value) and cache.stats()["compiles"] == 1  # "warm" only
    kcache.guard("warn")
    get(cache, "cold")
    get(cache, "colder")
    get(kcache.KernelCache(tmp_path / "root2", backend=synthetic), "cold")
    warned = [r.getMessage() for r in caplog.records if "under the JIT guard" in r.getMessage()]
    assert len(warned) == 2 and "kernel cold" in warned[0] and "kernel colder" in warned[1]  # once per kernel
    with pytest.raises(ValueError, match="the JIT guard is one of"):
        kcache.guard("strict")


def test_a_bad_jit_guard_setting_is_named_when_the_cache_opens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCACHE_JIT_GUARD", "strict")
    with pytest.raises(ValueError, match="KCACHE_JIT_GUARD='strict' must be one of off, warn, error"):
        kcache.KernelCache(tmp_path / "root", backend=synthetic)  # not at the first compile, hours later
    with pytest.raises(ValueError, match="the JIT guard is one of off, warn, error, not 'strict'"):
        kcache.guard("strict")


SERVE = """
import json, sys, kcache
from stress.programs.kernels import CPU_TARGET, pool
cache = kcache.KernelCache(sys.argv[1])
sources = {}
for spec in pool(3):
    kernel = cache.get_or_compile(spec.build(), CPU_TARGET, out_idx=spec.out_idx)
    sources[spec.name] = kernel.get_kernel_source()
print("RESULT " + json.dumps({"sources": sources, "compiles": cache.stats()["compiles"]}))
"""


@pytest.mark.tilelang
def test_two_machines_record_export_import_and_serve_with_no_compile(tmp_path: Path) -> None:
    """Machine A runs the programs recording their keys; the bundle of exactly those keys is imported
    on machine B (another root), where a fresh process under KCACHE_JIT_GUARD=error gets every kernel,
    the same kernels, without compiling. (The GPU machine runs the same path with launches.)"""
    pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

    def serve(root: Path, **env: str) -> dict:
        done = subprocess.run([sys.executable, "-c", SERVE, str(root)], capture_output=True, text=True,
                              env=child_env(**env), cwd=str(PROJECT), timeout=900, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])

    keys_file = tmp_path / "keys.jsonl"
    on_a = serve(tmp_path / "a", KCACHE_RECORD=str(keys_file))
    assert on_a["compiles"] == 3 and len(read_key_records(keys_file)) == 3

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kcache", *argv], capture_output=True, text=True,
                              env=child_env(KCACHE_BUNDLE_SECRET="deploy"), cwd=str(PROJECT), timeout=600,
                              check=False)

    bundle = tmp_path / "serve.kcb"
    exported = cli("--dir", str(tmp_path / "a"), "export", str(bundle), "--keys", str(keys_file))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert cli("verify-coverage", "--keys", str(keys_file), str(bundle)).returncode == 0
    imported = cli("--dir", str(tmp_path / "b"), "import", str(bundle))  # the toolchain check included
    assert imported.returncode == 0 and "imported 3 entries" in imported.stdout, imported.stdout + imported.stderr
    on_b = serve(tmp_path / "b", KCACHE_JIT_GUARD="error")
    assert on_b["compiles"] == 0 and on_b["sources"] == on_a["sources"]
