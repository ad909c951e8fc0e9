"""`python -m stress.bench --only NAME --record` for a scenario with a run of its own, on the CPU: the own
run writes its readings as the bench's rows (--rows FILE) and the bench appends them to the dataset,
judged by their goals, with this machine and commit; an own run that writes none records nothing. Each
own run's rows, from a result of its shape, carry the metrics its goals name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stress.bench.__main__ import main
from stress.bench.standalone import deploy, dropin, helion, multigpu, tune, tune_once
from stress.bench.suite.dataset import FIELDS, reading, this_commit, this_machine


def test_a_bundle_run_records_its_readings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text('{"an": "older line"}\n')  # appended to, never rewritten
    assert main(["--only", "bundle", "--entries", "20", "--entry-kb", "4", "--record", "--results", str(results)]) == 0
    lines = results.read_text().splitlines()
    assert lines[0] == '{"an": "older line"}'
    readings = [json.loads(line) for line in lines[1:]]
    assert [r["metric"] for r in readings] == ["import rate, 20 entries of 4 KiB",
                                               "import rate against GNU tar's extract and sync"]
    device, cores = this_machine()
    commit = this_commit()  # None outside a git checkout (an archive, an sdist): recorded as such
    for r in readings:
        assert list(r) == list(FIELDS)
        assert (r["scenario"], r["label"], r["unit"], r["device"], r["cores"]) == ("bundle", "bundle", "GB/s", device, cores)
        assert (r["commit"] or "").split("+")[0] == (commit or "").split("+")[0], (r["commit"], commit)
        assert r["kcache"] > 0 and r["baseline"] > 0 and r["ratio"] == pytest.approx(r["kcache"] / r["baseline"])
        assert r["goal"] == ">= 1 GB/s, or the disk's rate (a plain copy's)"
        assert r["met"] is (r["kcache"] >= 1.0 or r["ratio"] >= 1.0)
    assert [r["against"] for r in readings] == ["a plain copy of the bundle", "tar"]
    assert "2 readings of bundle appended to" in capsys.readouterr().out


def test_an_own_run_that_writes_no_rows_records_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No 2 GPUs here: the multi-GPU job says why and exits 0, with no rows.
    results = tmp_path / "results.jsonl"
    assert main(["--only", "multigpu", "--record", "--results", str(results)]) == 0
    assert not results.exists()
    assert "stress.bench: --record: multigpu wrote no rows (exit status 0): nothing recorded" in capsys.readouterr().err


def _judged(rows: list[dict[str, object]]) -> dict[str, tuple[object, object]]:
    found = [reading(r, device="GPU", cores=16, date="d", commit=None) for r in rows]
    return {r["metric"]: (r["goal"], r["met"]) for r in found}


def test_each_own_run_writes_the_metrics_its_goals_name() -> None:
    # The results below are of each own run's shape (the GPU runs' values); each goal of goals.py must
    # find its row, judged from the values the run measured.

    assert _judged(tune.bench_rows({"configs": 16, "kcache_s": 12.0, "tilelang_s": 12.5, "kcache_warm_pool_s": 5.0})) == {
        "cold tune of 16 configs": ("no slower than TileLang's AutoTuner", True),
        "tune of 16 configs, pool workers started": (None, None)}
    times = {"kcache_seen_call_us": 1.3, "tilelang_seen_call_us": 1.2, "kcache_first_call_ms_p50": 15.0,
             "tilelang_first_call_ms_p50": 17.0, "kcache_first_call_ms_p90": 16.0, "tilelang_first_call_ms_p90": 26.0}
    assert [met for _, met in _judged(dropin.bench_rows(times)).values()] == [False, True, True]
    herds = [{"scenario": "alone", "processes": 1, "wall_s": 10.0, "compiler_runs": 16},
             {"scenario": "herd", "processes": 8, "wall_s": 12.0, "compiler_runs": 17}]
    assert _judged(tune_once.bench_rows(herds)) == {
        "herd: 8 processes, wall": ("<= 1.15x one process tuning alone", False),
        "herd: compiler runs": ("16 compiles (one per config)", False)}
    served = {"compiles_on_b": 0, "import_plus_first_ready_s": 9.8, "cold_kcache_first_ready_s": 12.9,
              "plain_tilelang_first_ready_s": 8.4}
    assert _judged(deploy.bench_rows(served))["compiles on B"] == ("0 compiles on B", True)
    assert list(_judged(deploy.bench_rows({**served, "import_plus_first_ready_s": None}))) == ["compiles on B"]
    jobs = [{"scenario": "cold", "mode": "kcache", "finished": 2, "compiler_runs": 20, "ready_s": 28.0},
            {"scenario": "killed", "mode": "kcache", "finished": 0, "compiler_runs": 9, "ready_s": None},
            {"scenario": "tilelang", "mode": "tilelang", "finished": 2, "compiler_runs": 40, "ready_s": 30.0}]
    assert _judged(multigpu.bench_rows(jobs)) == {
        "compiler runs, cold": ("each kernel compiled once across ranks", True), "ready, cold": (None, None)}
    lanes = {"plain": [{"ready_s": 40.0, "compiles": 10, "timeouts": 1}],
             "first": [{"ready_s": 38.0, "compiles": 10, "timeouts": 0}],
             "second": [{"ready_s": 4.5, "compiles": 0, "timeouts": 0}],
             "plain_warm": [{"ready_s": 4.4, "compiles": 0, "timeouts": 0}]}  # Helion alone, its warm cache
    assert _judged(helion.bench_rows({"kernel": "matmul", "procs": 8, **lanes, "herd": {"compiles": 11, "picks": 1,
                                      "wall_s": 40.0}, "herd_alone": {"wall_s": 60.0}})) == {
        "matmul: first tune, ready": ("<= 1.0x Helion's fork default", True),
        "matmul: second process, ready": ("<= 1.0x Helion alone on its warm local cache", False),
        "matmul: second process, compiles": ("0 compiles", True),
        "matmul: herd of 8, compiles": ("one tune: at most one plain tune's compiles", False),
        "matmul: herd of 8, distinct picks": ("every pick equal", True),
        "matmul: herd of 8, wall": (None, None),
        "matmul: configs timed out in Helion's precompile, all turns": (None, None)}
    # The floor under the first-tune goal (--against-itself): Helion alone in both lanes, judged by no goal.
    floor = {"kernel": "softmax", "procs": 8, "against_itself": True, "herd": None, "second": [],
             "plain": lanes["plain"], "first": [{"ready_s": 44.0, "compiles": 10, "timeouts": 0}]}
    assert _judged(helion.bench_rows(floor)) == {
        "softmax: Helion alone against itself, ready": (None, None),
        "softmax: configs timed out in Helion's precompile, all turns": (None, None)}
