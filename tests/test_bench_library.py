"""`python -m stress.bench --only triton-library` without its runs: pytest's verdicts read from JUnit XML,
the tests whose verdict differs between runs, and the rows, judged by their goals as the dataset records
them. The runs themselves (real pytest processes, kcache's and plain Triton's): test_bench_library_runs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from stress.bench.standalone import triton_library
from stress.bench.standalone.library_rows import bench_rows
from stress.bench.standalone.library_run import Library, Run
from stress.bench.standalone.library_verdicts import ABSENT, differing, summary, verdicts
from stress.bench.suite.dataset import reading
from stress.bench.suite.scenarios import scenario_of

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.ops.test_x" name="test_a[1]" time="0.1"/>
<testcase classname="tests.ops.test_x" name="test_b" time="0.1"><failure message="2 == 3">...</failure></testcase>
<testcase classname="tests.ops.test_x" name="test_c" time="0.1"><skipped message="no GPU">...</skipped></testcase>
<testcase classname="tests.ops.test_x" name="test_d" time="0.1"><error message="fixture">...</error></testcase>
<testcase classname="tests.ops.test_x" name="test_e" time="0.1"><failure message="call">...</failure></testcase>
<testcase classname="tests.ops.test_x" name="test_e" time="0.1"><error message="teardown">...</error></testcase>
</testsuite></testsuites>"""
LIBRARY = Library(Path("/nowhere"), "tests/ops/test_hgrn.py", None, "fla-core", "0.5.2")


def test_each_tests_outcome_is_read_from_pytests_junit_xml(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    found = verdicts(junit)
    assert found == {"tests.ops.test_x::test_a[1]": "passed", "tests.ops.test_x::test_b": "failed",
                     "tests.ops.test_x::test_c": "skipped", "tests.ops.test_x::test_d": "error",
                     "tests.ops.test_x::test_e": "error+failed"}  # a failure, then an error at its teardown
    assert summary(found) == "5 tests: 1 error, 1 error+failed, 1 failed, 1 passed, 1 skipped"


def test_a_verdict_that_differs_in_any_run_is_listed_with_every_runs_verdict() -> None:
    same = {"t::a": "passed", "t::b": "failed"}
    assert differing({"plain": same, "kcache": dict(same), "warm": dict(same)}) == {}
    found = differing({"plain": same, "kcache": {"t::a": "failed", "t::b": "failed"}, "warm": {"t::b": "failed"}})
    assert found == {"t::a": {"plain": "passed", "kcache": "failed", "warm": ABSENT}}


def runs(kcache_cold_verdict: str = "passed") -> list[Run]:
    """A turn's runs, every test passing unless said otherwise."""
    # Each just past or within its goal, so that a goal's limit is read as the issue states it.
    walls = {"plain cold": 100.0, "kcache cold": 62.0, "first machine": 70.0, "second machine": 29.0,
             "plain warm": 10.0, "kcache warm": 10.6}
    stats = {"first machine": 40, "second machine": 0}
    return [Run(f"{index:02d}", lane, 0, wall, {"t::a": kcache_cold_verdict if lane == "kcache cold" else "passed"},
                {"lookups": {"triton": {"compiles": stats[lane], "hits": 1}}} if lane in stats else {})
            for index, (lane, wall) in enumerate(walls.items())]


def test_the_rows_name_the_library_and_are_judged_by_their_goals() -> None:
    rows = bench_rows(LIBRARY, runs())
    judged = {r["metric"]: reading(r, device="NVIDIA H200", cores=16, date="2026-11-29T00:00:00Z", commit="c")
              for r in rows}
    for found in judged.values():
        assert found["scenario"] == "triton-library"
        assert found["label"] == "triton-library (fla-core 0.5.2: tests/ops/test_hgrn.py)"
    cold = judged["cold, wall median s"]
    assert (cold["ratio"], cold["met"], cold["goal"]) == (0.62, False, "<= 0.6x plain Triton's cold run")
    warm = judged["warm, wall median s"]
    assert warm["ratio"] == pytest.approx(1.06) and warm["met"] is False  # more than 1.05x
    second = judged["second machine (empty root, the first's entries in S3), wall median s"]
    assert (second["ratio"], second["met"]) == (0.29, True)
    first = judged["first machine (empty root, uploading to S3), wall median s"]
    assert (first["ratio"], first["goal"], first["met"]) == (0.7, None, None)  # what the tier costs: context
    compiles = judged["Triton compiles, second machine (most of a turn)"]
    assert (compiles["kcache"], compiles["baseline"], compiles["goal"]) == (0, 40, None)  # evidence, no goal
    same = judged["tests whose verdict differs between runs (6 runs)"]
    assert (same["kcache"], same["met"]) == (0, True)


def test_a_differing_verdict_is_a_missed_goal_and_the_report_fails(capsys: pytest.CaptureFixture[str]) -> None:
    differ = runs(kcache_cold_verdict="failed")
    rows = bench_rows(LIBRARY, differ)
    (counted,) = [r for r in rows if r["metric"].startswith("tests whose verdict differs")]
    assert reading(counted, device="CPU", cores=2, date="d", commit=None)["met"] is False
    assert triton_library.report(LIBRARY, differ, rows) == 1
    err = capsys.readouterr().err
    assert "VERDICTS DIFFER: 1 tests" in err and "t::a: 00: passed; 01: failed;" in err


def test_a_library_rows_label_is_its_own_scenario_and_tritons_stay_tritons() -> None:
    assert scenario_of(LIBRARY.label) == "triton-library"
    assert scenario_of("triton hit (fresh process)") == "triton"
    keyword = Library(Path("/x"), "tests/ops/test_hgrn.py", "chunk", "fla-core", "0.5.2")
    assert keyword.label == "triton-library (fla-core 0.5.2: tests/ops/test_hgrn.py -k 'chunk')"


def test_with_no_gpu_or_library_the_bench_says_why_and_measures_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    # No GPU here (the CPU machine), or on a GPU machine a distribution that is not installed: skipped either way.
    assert triton_library.main(["--dist", "kcache-no-such-library"]) == 0
    assert "triton-library: skipped:" in capsys.readouterr().out
