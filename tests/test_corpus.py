"""The differential corpus: 40+ kernels written as real operator libraries write them (Hopper GEMMs
with TMA, mbarriers and warp specialization, swizzled and custom layouts, flash attention forward
and backward, decode, MoE, fp8, `@tilelang.jit`, `@tilelang.autotune`; tests/corpus), compiled by
plain TileLang in a fresh process and by kcache in every lane, each in a fresh process of its own:
the device source, the host source and the cubin's machine code must be equal byte for byte. On the
GPU machine each kernel also runs and is checked against torch in every lane.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stress.gpu import gpu_missing, gpu_target

from .background import Started, lane_environments, low_priority, take

pytestmark = [pytest.mark.tilelang, pytest.mark.gpu]  # on a CPU machine it compiles for sm_90a

DRIVER = Path(__file__).with_name("corpus_driver.py")
MODES = ("inprocess", "pool", "server", "fork")
# What the corpus must cover (its kernels' feature tags), as the issue lists it.
REQUIRED_FEATURES = {"swizzle", "custom_layout", "fragment", "pipelined", "tma", "mbarrier", "warp_specialize",
                     "wgmma", "transpose_a", "transpose_b", "fp8", "bf16", "flash_fwd", "flash_bwd", "decode", "mla",
                     "paged", "moe", "reduce", "softmax", "rmsnorm", "atomics", "alloc_var", "dynamic_shape",
                     "macro", "jit_lazy", "jit_eager", "autotune"}


def start(mode: str, work: Path, arch: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    out = work / f"{mode}.jsonl"
    with open(out.with_suffix(".stderr"), "wb") as stderr:  # a file: a pipe read later could fill and block it
        process = subprocess.Popen([*low_priority(), sys.executable, str(DRIVER), mode, str(work / f"{mode}-root"),
                                    str(out), arch], env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=stderr)
    return process, out


def finish(started: tuple[subprocess.Popen[bytes], Path]) -> list[dict[str, Any]]:
    process, out = started
    process.wait(timeout=3600)
    stderr = out.with_suffix(".stderr").read_text(errors="replace")
    assert process.returncode == 0, stderr[-4000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def start_corpus(work: Path) -> Started:
    """Plain TileLang's driver and one per lane, at once (tests/background.py starts them as the session
    starts, beside the other tests)."""
    arch = gpu_target()["arch"] if gpu_missing() is None else "sm_90a"
    env, _runtime, cleanups = lane_environments("kc-", work, ("tilelang", *MODES))
    drivers = {mode: start(mode, work, arch, {**HASH_SEED, **env[mode]}) for mode in ("tilelang", *MODES)}
    return Started(drivers, {"arch": arch}, cleanups)


BACKGROUND = {"corpus": start_corpus}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    started = take("corpus", start_corpus, tmp_path_factory)
    try:
        runs = {mode: finish(driver) for mode, driver in started.drivers.items()}
        if os.environ.get("KCACHE_CORPUS_RESULTS"):  # the GPU check keeps every row (.ci/gpu-check)
            Path(os.environ["KCACHE_CORPUS_RESULTS"]).write_text(
                json.dumps({"arch": started.facts["arch"], "runs": runs}, indent=1))
        yield {"runs": runs, "arch": started.facts["arch"]}
    finally:
        started.stop()


def kernels(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["kernel"]: row for row in rows if "kernel" in row}


def lane(rows: list[dict[str, Any]]) -> dict[str, Any]:
    (summary,) = [row for row in rows if "lane" in row]
    return summary


def test_the_corpus_covers_what_real_libraries_use(corpus: dict) -> None:
    plain = kernels(corpus["runs"]["tilelang"])
    assert len(plain) >= 40
    covered = {feature for row in plain.values() for feature in row["features"]}
    assert REQUIRED_FEATURES <= covered, f"not covered: {sorted(REQUIRED_FEATURES - covered)}"
    failed = {name: row["error"] for name, row in plain.items() if "error" in row}
    assert not failed, f"plain TileLang could not compile: {failed}"


FIELDS = ("device_source", "host_source", "machine_code")
# TileLang 0.1.15 compiles some kernels differently in different processes (docs/benchmarks/history.md,
# "The differential corpus"). Some of it follows the hash seed (a LayerNorm and a column reduction
# compile two ways under two PYTHONHASHSEEDs): every process here, plain or kcache's, and every
# worker it starts, runs under one seed, so that this variation cannot hide a difference. The rest
# follows the process's state (the MLA decode's two reduction workspaces swap names in about one
# compile in six, under one seed, in one process compiling it again and again): for a kernel whose
# output differs from kcache's, fresh processes of plain TileLang compile it PLAIN_REPEATS times
# each, and kcache's output must be one that plain TileLang gives.
HASH_SEED = {"PYTHONHASHSEED": "0"}
# TileLang's output for a few kernels varies from compile to compile, rarely (docs/benchmarks/history.md,
# 2026-11-27 07:18: one variant unseen in 49 compiles on a 16-core machine). A machine with more cores
# samples more processes in the same time; CI's two cores keep 8, two at a time (one by one they cost 133 s).
PLAIN_RETRIES = max(8, os.cpu_count() or 1)
PLAIN_REPEATS = 6
PLAIN_AT_ONCE = max(2, (os.cpu_count() or 1) // 2)  # fresh processes of plain TileLang at a time


def outputs(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(row[field] for field in FIELDS)


@pytest.fixture(scope="module")
def plain_outputs(corpus: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[tuple[str, ...]]]:
    """Every output plain TileLang gave for each kernel: the first run's, and, for a kernel whose
    output differs in some lane, those of up to PLAIN_RETRIES more fresh processes, PLAIN_REPEATS
    compiles each (until each lane's output has been seen), PLAIN_AT_ONCE at a time."""
    plain = kernels(corpus["runs"]["tilelang"])
    seen = {name: {outputs(row)} for name, row in plain.items() if "not_run" not in row and "error" not in row}
    wanted = {name: {outputs(kernels(corpus["runs"][mode])[name]) for mode in MODES} - seen[name]
              for name in seen if all("error" not in kernels(corpus["runs"][mode])[name] for mode in MODES)}
    wanted = {name: missing for name, missing in wanted.items() if missing}
    work = tmp_path_factory.mktemp("plain-again")
    at_once = PLAIN_AT_ONCE
    for first in range(0, PLAIN_RETRIES, at_once):
        if not wanted:
            break
        names = ",".join(sorted(wanted))
        runs: dict[Path, subprocess.Popen[str]] = {}
        try:
            for attempt in range(first, min(first + at_once, PLAIN_RETRIES)):
                out = work / f"plain-{attempt}.jsonl"
                runs[out] = subprocess.Popen(
                    [sys.executable, str(DRIVER), "tilelang", str(work / f"root-{attempt}"), str(out), corpus["arch"],
                     names], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                    env={**os.environ, **HASH_SEED, "KCACHE_CORPUS_REPEATS": str(PLAIN_REPEATS)})
            for out, process in runs.items():
                _, stderr = process.communicate(timeout=1800)
                assert process.returncode == 0, stderr[-3000:]
                for row in (json.loads(line) for line in out.read_text().splitlines()):
                    if "kernel" in row and "error" not in row:
                        seen[row["kernel"]].add(outputs(row))
        finally:  # a failed or hung attempt leaves none of its siblings running
            for process in runs.values():
                if process.poll() is None:
                    process.kill()
                    process.wait()
        wanted = {name: missing - seen[name] for name, missing in wanted.items()}
        wanted = {name: missing for name, missing in wanted.items() if missing}
    return seen


@pytest.mark.parametrize("mode", MODES)
def test_kcache_compiles_every_kernel_exactly_as_tilelang(corpus: dict, plain_outputs: dict, mode: str) -> None:
    """Byte for byte: the device source, the host source and the machine code are one of plain
    TileLang's (its only output, but for a kernel that plain TileLang itself compiles differently in
    different processes)."""
    plain = kernels(corpus["runs"]["tilelang"])
    ours = kernels(corpus["runs"][mode])
    assert ours.keys() == plain.keys()
    failed = {name: row["error"] for name, row in ours.items() if "error" in row}
    assert not failed, f"kcache ({mode}) could not compile: {failed}"
    for name, row in plain.items():
        if "not_run" in row:
            assert "not_run" in ours[name]
            continue
        assert row["machine_code"] is not None, name
        assert outputs(ours[name]) in plain_outputs[name], (
            f"{name}: kcache's output ({mode}) is none of plain TileLang's "
            f"({len(plain_outputs[name])} seen in {PLAIN_RETRIES * PLAIN_REPEATS + 1} compiles at most)")


def test_each_lane_compiled_its_kernels_itself(corpus: dict) -> None:
    """No fallback hid a lane: the service compiled the server mode's kernels and forks of the caller
    the fork mode's, and no kernel had to be compiled without serialization."""
    # The autotuned entry's configs are entries of their own, compiled before it: it may compile nothing.
    compiled = {mode: sum(1 for row in kernels(corpus["runs"][mode]).values() if row["style"] != "autotune")
                for mode in MODES}
    summaries = {mode: lane(corpus["runs"][mode])["lane"] for mode in MODES}
    for mode, summary in summaries.items():
        assert summary["unserialized"] == 0, (mode, lane(corpus["runs"][mode])["warnings"])
        assert summary["compiles"] >= compiled[mode], (mode, summary)
    assert summaries["server"]["service_jobs"] >= compiled["server"] and summaries["server"]["caller_forks"] == 0
    assert summaries["fork"]["caller_forks"] >= compiled["fork"] and summaries["fork"]["service_jobs"] == 0


@pytest.mark.parametrize("mode", ("tilelang", *MODES))
def test_on_the_gpu_every_kernel_matches_torch(corpus: dict, mode: str) -> None:
    missing = gpu_missing()
    if missing is not None:
        pytest.skip(f"launching kernels needs a GPU: {missing}")
    rows = kernels(corpus["runs"][mode])
    wrong = {name: row.get("gpu_check", row.get("error")) for name, row in rows.items() if row.get("gpu_check") != "ok"}
    assert not wrong, f"{mode}: kernels that did not match torch: {wrong}"
