"""`python -m stress.bench --only NAME --record` for a scenario with a run of its own, on the CPU: the own
run writes its readings as the bench's rows (--rows FILE) and the bench appends them to the dataset,
judged by their goals, with this machine and commit; an own run that writes none records nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stress.bench.__main__ import main
from stress.bench.dataset import FIELDS, this_commit, this_machine


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
    commit = this_commit()
    assert commit is not None
    for r in readings:
        assert list(r) == list(FIELDS)
        assert (r["scenario"], r["label"], r["unit"], r["device"], r["cores"]) == ("bundle", "bundle", "GB/s", device, cores)
        assert r["commit"].split("+")[0] == commit.split("+")[0]
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
