"""A kcache compile is TileLang's compile: the differential table of tests/fidelity_driver.py.

Each mode runs the whole table in one fresh process: plain TileLang (its cache off), kcache
compiling in the caller (`inprocess`) and in a pool worker started before the context was set up
(`pool`). For every step, kcache's kernel has the target, device source, host source and machine
code that TileLang produced in that context; kcache's key differs wherever the output differs and
is the same where the context only looks different (the same target asked for another way, an
unrelated variable); a second run of the table in fresh processes against the same roots compiles
nothing. On the GPU machine the table runs with the device's arch and each kernel of that arch is
run and checked against torch.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stress.gpu import gpu_missing, gpu_target
from stress.nvcc_counter import shadow_cuda_home

from .background import Started, lane_environments, low_priority, take

# Also run by the GPU check (`-m gpu`), where it uses the device's arch and runs the kernels; on a CPU
# machine it runs too, with sm_90a, comparing everything but results.
pytestmark = [pytest.mark.tilelang, pytest.mark.gpu]

DRIVER = Path(__file__).with_name("fidelity_driver.py")
OUTPUT = ("target", "device_source", "host_source", "machine_code", "marks", "host_mark")
# Steps that ask for one context in different words: one key each group.
SAME_KEY = [
    {"baseline", "auto_in_own_scope", "none_in_own_scope", "explicit_target_ignores_scope", "unrelated_env",
     "baseline_again"},
    {"auto_in_other_scope", "auto_in_other_scope_again", "none_in_other_scope", "default_target_env",
     "default_target_env_beats_scope"},
    {"postproc_a", "postproc_a_again"},
]
def start_driver(mode: str, root: Path, out: Path, arch: str, extra_env: dict[str, str] | None = None, *,
                 background: bool = False) -> tuple[subprocess.Popen[bytes], Path]:
    """`background`: at the low priority of the drivers that run beside other tests (tests/background.py);
    a driver that a test waits on at once runs as the test does."""
    env = {**os.environ, **(extra_env or {})}
    env.pop("TILELANG_DEFAULT_TARGET", None)  # the table sets it where a step asks for it
    command = [*(low_priority() if background else []), sys.executable, str(DRIVER), mode, str(root), str(out), arch]
    with open(out.with_suffix(".stderr"), "wb") as stderr:  # a file: a pipe read later could fill and block it
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr), out


def finish_driver(started: tuple[subprocess.Popen[bytes], Path]) -> list[dict]:
    process, out = started
    process.wait(timeout=900)
    stderr = out.with_suffix(".stderr").read_text(errors="replace")
    assert process.returncode == 0, stderr[-4000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows:
        row["stderr"] = stderr
    return rows


def run_driver(mode: str, root: Path, out: Path, arch: str, extra_env: dict[str, str] | None = None) -> list[dict]:
    return finish_driver(start_driver(mode, root, out, arch, extra_env))


MODES = ("inprocess", "pool", "server", "fork")


def start_table(work: Path) -> Started:
    """The four tables' first runs, at once (tests/background.py starts them as the session starts,
    beside the other tests). The server mode's compile service is started by the first run's first
    miss (in its environment as it was then: no context set up), reused by the second run (which may
    come many minutes later, at the session's end), and stopped at the end; the fork mode finds no
    service and compiles in forks of the driver."""
    arch = gpu_target()["arch"] if gpu_missing() is None else "sm_90a"
    mode_env, runtime, cleanups = lane_environments("kf-", work, ("tilelang", *MODES))
    drivers = {mode: start_driver(mode, work / f"{mode}-root", work / f"{mode}.jsonl", arch, mode_env[mode],
                                  background=True) for mode in ("tilelang", *MODES)}
    return Started(drivers, {"arch": arch, "runtime": runtime, "mode_env": mode_env, "work": work}, cleanups)


BACKGROUND = {"table": start_table}


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    started = take("table", start_table, tmp_path_factory)
    arch, work, mode_env = started.facts["arch"], started.facts["work"], started.facts["mode_env"]
    # The four tables at once, then the three second runs at once (their roots are independent; each
    # run is its own process): the same work as one after another, in about half the time on 2 cores.
    try:
        runs = {name: finish_driver(driver) for name, driver in started.drivers.items()}
        again = {f"{mode}-again": start_driver(mode, work / f"{mode}-root", work / f"{mode}-again.jsonl", arch,
                                               mode_env[mode]) for mode in MODES}
        runs.update({name: finish_driver(driver) for name, driver in again.items()})
        yield {"runs": runs, "arch": arch, "runtime": started.facts["runtime"]}
    finally:
        started.stop()


def test_the_server_mode_compiled_in_the_service_and_the_fork_mode_in_forks(table: dict) -> None:
    """The server rows were compiled by the compile service, not by a fallback pool nor a fork; the
    fork rows by forks of the driver, one per compile of the table."""
    logs = list(table["runtime"].glob("kcache/*.log"))
    server = table["runs"]["server"][0]["stderr"]
    assert server.count("compile service is unavailable") == 0 and "0 compile(s) in a fork" in server
    assert len(list(table["runtime"].glob("kcache/*.sock"))) == 1 and len(logs) == 1
    fork = table["runs"]["fork"][0]["stderr"]
    compiled = sum(row["compiled"] for row in table["runs"]["fork"])
    assert "compile service is unavailable" in fork and f"{compiled} compile(s) in a fork" in fork


def by_step(rows: list[dict]) -> dict[str, dict]:
    return {row["step"]: row for row in rows}


def test_the_table_exercises_what_it_claims(table: dict) -> None:
    """Plain TileLang's own outputs differ where the table says the context matters (the faults fired)."""
    tilelang = by_step(table["runs"]["tilelang"])
    base = tilelang["baseline"]
    assert f'"arch":"{table["arch"]}"' in base["target"].replace(" ", "")
    assert '"arch":"sm_80"' in tilelang["auto_in_other_scope"]["target"].replace(" ", "")
    assert '"arch":"sm_80"' in tilelang["default_target_env_beats_scope"]["target"].replace(" ", "")
    assert tilelang["postproc_a"]["marks"] == ["fidelity-mark-a"]
    assert tilelang["postproc_b"]["marks"] == ["fidelity-mark-b"]
    assert tilelang["postproc_global_changed"]["marks"] == ["fidelity-mark-c"]
    assert tilelang["host_postproc"]["host_mark"]
    for step in ("nvcc_append_flags", "nvcc_prepend_flags"):  # -G: device debug code
        assert tilelang[step]["machine_code"] != base["machine_code"]
        assert ".debug_info" in tilelang[step]["sections"] and ".debug_info" not in base["sections"]


@pytest.mark.parametrize("mode", [*MODES, *(f"{mode}-again" for mode in MODES)])
def test_kcache_gives_tilelangs_kernel_in_every_context(table: dict, mode: str) -> None:
    tilelang = by_step(table["runs"]["tilelang"])
    ours = by_step(table["runs"][mode])
    assert ours.keys() == tilelang.keys()
    for step, expected in tilelang.items():
        got = {field: ours[step][field] for field in OUTPUT}
        assert got == {field: expected[field] for field in OUTPUT}, step
        if expected["result"] is not None:  # the GPU machine: the kernels ran, and agree
            assert ours[step]["result"] == expected["result"], step


@pytest.mark.parametrize("mode", MODES)
def test_the_key_differs_exactly_where_the_output_does(table: dict, mode: str) -> None:
    rows = by_step(table["runs"][mode])
    for (a, row_a), (b, row_b) in itertools.combinations(rows.items(), 2):
        if any(row_a[field] != row_b[field] for field in OUTPUT):
            assert row_a["key"] != row_b["key"], f"{a} and {b} differ in output but share a key"
    for group in SAME_KEY:
        assert len({rows[step]["key"] for step in group}) == 1, sorted(group)
    # A pass config set through its variable is in the key, whether or not this kernel's code changes.
    assert rows["layout_cost_model_env"]["key"] != rows["baseline"]["key"]


@pytest.mark.parametrize("mode", MODES)
def test_each_key_compiles_once_and_a_second_run_compiles_nothing(table: dict, mode: str) -> None:
    seen: set[str] = set()
    for row in table["runs"][mode]:  # in the table's order
        assert row["compiled"] == (row["key"] not in seen), row["step"]
        seen.add(row["key"])
    assert len(seen) == 9  # the table's distinct kernels (the scopes' two targets, 3 callbacks, ...)
    again = by_step(table["runs"][f"{mode}-again"])
    assert {step: row["compiled"] for step, row in again.items() if row["compiled"]} == {}
    assert all(row["disk_hit"] or row["memory_hit"] for row in again.values())


CALLBACK_STEPS = ("postproc_a", "postproc_b", "postproc_global_changed", "host_postproc")


@pytest.mark.parametrize("mode", MODES)
def test_callbacks_run_in_the_caller_once_per_compile_and_never_on_a_hit(table: dict, mode: str) -> None:
    """As plain TileLang: each compile calls its postproc callback once, in the caller's process (its
    side effects are the caller's), whichever lane compiled; a memory hit and a fresh process's disk
    hit call it not at all."""
    plain = by_step(table["runs"]["tilelang"])
    first = by_step(table["runs"][mode])
    for step in CALLBACK_STEPS:
        assert plain[step]["callback_calls"] == 1, step
        assert first[step]["compiled"] == 1 and first[step]["callback_calls"] == 1, (step, first[step])
        assert first[step]["callbacks_in_caller"], step
    assert first["postproc_a_again"]["compiled"] == 0 and first["postproc_a_again"]["callback_calls"] == 0
    again = by_step(table["runs"][f"{mode}-again"])
    assert {step: row["callback_calls"] for step, row in again.items() if row["callback_calls"]} == {}


def test_callbacks_that_cannot_travel_compile_in_the_caller_with_their_edit(tmp_path: Path) -> None:
    """Registered before kcache was imported (its Python function is out of reach), or a closure over a
    lock (unpicklable): the compile runs in the caller, the edit is in the kernel, nothing is stored
    on disk, and one warning says why."""
    rows = by_step(run_driver("opaque", tmp_path / "root", tmp_path / "opaque.jsonl", "sm_90a"))
    assert rows["registered_before_kcache"]["marks"] == ["fidelity-mark-a"]
    assert rows["unpicklable_closure"]["marks"] == ["fidelity-mark-b"]
    assert rows["unpicklable_closure"]["compiles"] == 2
    assert rows["registered_before_kcache"]["entries"] == 0 and rows["unpicklable_closure"]["entries"] == 0
    stderr = rows["unpicklable_closure"]["stderr"]
    assert "registered before kcache started watching" in stderr
    assert "cannot be fingerprinted" in stderr


HANGING_NVCC = """#!/bin/sh
case " $* " in
  *" --version "*) ;;
  *) [ -e "{marker}" ] && exec sleep 600 ;;
esac
exec "{real}" "$@"
"""


def test_the_callers_nvcc_timeout_applies_when_set_after_the_first_compile(tmp_path: Path) -> None:
    """The pool's worker started without TILELANG_COMPILE_TIMEOUT_SECONDS; the caller sets it (3 s)
    later, and nvcc then never returns: TileLang's "timed out" error, as a CompileError, within
    seconds, not the worker's own (absent) limit."""
    marker = tmp_path / "hang"
    home = shadow_cuda_home(tmp_path / "cuda-home", HANGING_NVCC.replace("{marker}", str(marker)))
    extra = {"CUDA_HOME": str(home), "CUDA_PATH": str(home), "FIDELITY_NVCC_HANG_MARKER": str(marker)}
    (row,) = run_driver("timeout", tmp_path / "root", tmp_path / "timeout.jsonl", "sm_90a", extra)
    assert marker.exists()  # the fault was armed
    assert row["error"] == "CompileError" and row["runtime_error"], row
    assert "timed out" in row["message"], row["message"]
    assert row["command_line"], "TileLang's message, its nvcc `Command:` line included, must survive"
    assert row["seconds"] < 30, row
