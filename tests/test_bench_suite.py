"""What the benchmark scenarios share, on the CPU: the environment of a block, the gate that lets gated
programs go at once, a fresh process's one result line, lanes taking turns, the runtime directory whose
services stop with the block, the stress workers' herd, and what an own run prints and writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stress.bench.suite.children import run_workers
from stress.bench.suite.own_run import own_parser, print_readings, skipped, write_rows
from stress.bench.suite.rows import row
from stress.bench.suite.timing import percentile, seconds_of, take_turns
from stress.bench.suite.tune_notes import killed_note
from stress.procs import WorkerFailedToStart, environ, release_gated, run_for_result, worker_env
from stress.service_runtime import own_services

# A program at its gate, as the Triton and Helion programs are with KT_GATE=1: "ready", then a line.
GATED = "import sys, time; print('ready', flush=True); sys.stdin.readline(); print(time.perf_counter(), flush=True)"


def test_a_blocks_environment_is_set_and_unset_within_it_and_restored_however_it_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRESS_SUITE_KEPT", "before")
    monkeypatch.delenv("STRESS_SUITE_ADDED", raising=False)
    with pytest.raises(KeyError), environ({"STRESS_SUITE_KEPT": None, "STRESS_SUITE_ADDED": "within"}):
        assert "STRESS_SUITE_KEPT" not in os.environ and os.environ["STRESS_SUITE_ADDED"] == "within"
        raise KeyError("the block fails")
    assert os.environ["STRESS_SUITE_KEPT"] == "before" and "STRESS_SUITE_ADDED" not in os.environ


def test_gated_programs_go_together_and_one_that_dies_first_raises_with_its_last_words() -> None:
    gated = [subprocess.Popen([sys.executable, "-c", GATED], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    released = release_gated(gated)
    went = [float(process.communicate(timeout=60)[0]) for process in gated]
    assert all(process.returncode == 0 for process in gated) and min(went) >= released
    dying = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('no gate here')"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match="no gate here"):
        release_gated([dying])


def test_a_fresh_process_reports_its_last_result_line_and_one_that_reports_none_raises() -> None:
    code = "print('result 1'); print('noise'); print('result ' + __import__('json').dumps({'seconds': 2.5}))"
    assert run_for_result([sys.executable, "-c", code], "two results") == {"seconds": 2.5}
    with pytest.raises(RuntimeError, match=r"silent failed \(exit status 0\)"):
        run_for_result([sys.executable, "-c", "print('no result')"], "silent")
    with pytest.raises(RuntimeError, match=r"(?s)failing failed \(exit status 3\).*its output: result 1"):
        run_for_result([sys.executable, "-c", "print('result 1'); raise SystemExit(3)"], "failing")


def test_lanes_take_turns_and_percentiles_are_nearest_rank() -> None:
    calls: list[tuple[str, int]] = []
    found = take_turns(("a", "b"), 3, lambda lane, turn: calls.append((lane, turn)) or turn * 10 + len(lane))
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert found == {"a": [1, 11, 21], "b": [1, 11, 21]}
    assert percentile([float(v) for v in range(10, 0, -1)], 50) == 5.0  # of 10, the lower middle one
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 3.0  # round(1.5): half to even
    assert percentile([4.0, 1.0, 3.0, 2.0], 90) == 4.0


def test_a_processs_wall_time_is_taken_to_its_end_and_a_failure_raises(tmp_path: Path) -> None:
    assert 0 < seconds_of([sys.executable, "-c", "pass"], worker_env(), tmp_path) < 60
    with pytest.raises(subprocess.CalledProcessError):
        seconds_of([sys.executable, "-c", "raise SystemExit(1)"], worker_env())


def test_the_runtime_directory_of_a_blocks_services_goes_with_the_block() -> None:
    with pytest.raises(KeyError), own_services("kt-") as runtime:
        assert runtime.is_dir() and len(os.fsencode(runtime / "kcache" / f"compile-{'0' * 20}.sock")) <= 107
        raise KeyError("the block fails")
    assert not runtime.exists()


def test_a_herd_of_stress_workers_on_one_root_is_released_together_and_reports(tmp_path: Path) -> None:
    wall, results = run_workers("kcache", tmp_path / "root", 2, 1, {"KCACHE_SYNTHETIC_COMPILE_S": "0"},
                                ("--synthetic",))
    assert wall > 0 and [r.index for r in results] == [0, 1]
    assert sum(r.result["stats"]["compiles"] for r in results) == 1  # one kernel, one compile
    with pytest.raises(WorkerFailedToStart, match="worker 0 failed before the barrier: ValueError"):
        run_workers("kcache", tmp_path / "root", 1, 1, {"KCACHE_SYNTHETIC_COMPILE_S": "not a number"},
                    ("--synthetic",))


def test_an_own_run_has_its_rows_option_says_skipped_in_one_line_and_prints_its_readings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = own_parser("tune").parse_args(["--rows", str(tmp_path / "rows.json")])
    readings = [row("tune", "cold tune of 16 configs", 2.0, 4.0, "s", "TileLang's AutoTuner"),
                row("tune", "compiler runs", 16, None, "runs", "")]
    write_rows(args.rows, readings)
    assert json.loads(args.rows.read_text()) == readings
    assert skipped("tune", "no CUDA GPU visible") and not skipped("tune", None)
    print_readings(readings, 24)
    assert capsys.readouterr().out.splitlines() == [
        "tune: skipped: no CUDA GPU visible",
        "  cold tune of 16 configs          2 s     vs        4  0.500x",
        "  compiler runs                   16 runs  vs        -  -"]
    assert killed_note({"killed": {"pid": 7, "benchmarked_before_kill": 3, "of": 16}}) == (
        "  killed pid 7 after 3/16 configs")
    assert killed_note({"killed": None}) == ""
