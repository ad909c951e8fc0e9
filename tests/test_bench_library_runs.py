"""`python -m stress.bench --only triton-library`'s runs on the CPU, with a small library of its own in
place of the real one: real pytest processes, plain Triton's and kcache's (`kcache run -m pytest`), whose
test compiles a real Triton kernel for sm_90 (no GPU needed), through every lane: cold, the first and
second machine over the project's S3 test server, warm. The verdicts match, the second machine compiles
nothing; a test whose verdict depends on the lane is found and fails the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from stress.bench.standalone.library_floors import compiled_at_once_s, fronts_in_turn_s, untuned
from stress.bench.standalone.library_rows import bench_rows, report
from stress.bench.standalone.triton_library import Lanes, Library, lane_base_env, measure

KERNEL_TEST = '''
import triton
from c_module import c_module
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out + offsets, tl.load(x + offsets, mask=mask) + tl.load(y + offsets, mask=mask), mask=mask)


def test_compiles():
    signature = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    compiled = triton.compile(ASTSource(add_kernel, signature, {"BLOCK": 1024}), target=GPUTarget("cuda", 90, 32))
    assert compiled.asm["cubin"]
    assert c_module("lone_module")  # as Triton's driver builds its module, outside any tune
'''
# A C extension built as Triton builds its driver's module and its launchers (the C compiler's run, cached).
C_MODULE = '''
from triton.runtime.build import compile_module_from_src


def c_module(name):
    source = ("#include <Python.h>\\nstatic struct PyModuleDef module = {PyModuleDef_HEAD_INIT, \\"%s\\", NULL, -1, NULL};\\n"
              "PyMODINIT_FUNC PyInit_%s(void) { return PyModule_Create(&module); }\\n" % (name, name))
    return compile_module_from_src(src=source, name=name)
'''
# A real `Autotuner.run` over two configs whose kernel call compiles for sm_90 (no GPU to launch on, none to
# benchmark on: its benchmark calls the kernel once), as a library's tune compiles each config it benchmarks.
TUNE_TEST = '''
import triton
from c_module import c_module
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.autotuner import Autotuner


@triton.jit
def scale_kernel(x, out, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offsets, tl.load(x + offsets, mask=offsets < n) * 2.0, mask=offsets < n)


class Compiling:
    fn = scale_kernel  # the autotuner finds the Python function below it

    def run(self, *args, BLOCK, num_warps, **options):
        signature = {"x": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
        triton.compile(ASTSource(scale_kernel, signature, {"BLOCK": BLOCK}), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps})
        c_module("tuned_module")  # as the first benchmark's load builds the kernel's launcher (then a hit)


def test_tunes():
    configs = [triton.Config({"BLOCK": block}, num_warps=4) for block in (256, 512)]
    tuner = Autotuner(Compiling(), ["x", "out", "n"], configs, ["n"], None, None,
                      do_bench=lambda kernel_call, quantiles: (kernel_call(), [1.0, 1.0, 1.0])[1])
    tuner.run(1, 2, 4096)
    assert tuner.best_config in configs
'''
OTHER_TESTS = '''
import os

import pytest


def test_passes():
    pass


def test_fails():
    assert 1 + 1 == 3


@pytest.mark.skip(reason="not here")
def test_skipped():
    pass
'''
UNDER_KCACHE_ONLY = '''
import os


def test_without_kcache():
    assert os.environ.get("TRITON_CACHE_MANAGER") is None
'''


def library(folder: Path, modules: dict[str, str]) -> Library:
    (folder / "tests" / "ops").mkdir(parents=True)
    (folder / "tests" / "conftest.py").write_text("")
    (folder / "tests" / "ops" / "c_module.py").write_text(C_MODULE)
    for name, text in modules.items():
        (folder / "tests" / "ops" / name).write_text(text)
    return Library(folder, "tests/ops", None, "kcache-test-library", "1.0")


def lanes(tmp_path: Path) -> Lanes:
    (tmp_path / "work" / "logs").mkdir(parents=True)
    return Lanes(tmp_path / "work", tmp_path / "work" / "logs", lane_base_env({}), timeout_s=300)


def test_three_ways_with_identical_verdicts_and_the_second_machine_compiling_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stress.servers.s3 import S3ServerMissing, check_installed

    try:
        check_installed()
    except S3ServerMissing as missing:
        pytest.skip(str(missing))
    found = library(tmp_path / "library", {"test_kernel.py": KERNEL_TEST, "test_tune.py": TUNE_TEST,
                                           "test_other.py": OTHER_TESTS})
    ran = lanes(tmp_path)
    measure(found, ran, turns=1, warm_runs=1, s3=True)
    assert [run.lane for run in ran.runs] == ["plain cold", "kcache cold", "first machine", "second machine",
                                              "tuning alone", "plain warm", "kcache warm"]
    expected = {"tests.ops.test_kernel::test_compiles": "passed", "tests.ops.test_tune::test_tunes": "passed",
                "tests.ops.test_other::test_passes": "passed",
                "tests.ops.test_other::test_fails": "failed", "tests.ops.test_other::test_skipped": "skipped"}
    for run in ran.runs:
        assert run.verdicts == expected, run.lane
        assert run.wall_s > 0
    triton = {run.lane: run.stats["lookups"]["triton"] for run in ran.runs if run.stats}
    assert triton["kcache cold"]["compiles"] == 3 and triton["first machine"]["compiles"] == 3
    assert (triton["second machine"]["compiles"], triton["second machine"]["hits"]) == (0, 4)  # from S3
    assert (triton["kcache warm"]["compiles"], triton["kcache warm"]["hits"]) == (3, 5)  # the root counts both runs
    # Plain Triton's cold run timed its compiles, by tune: the two configs', and the one outside a tune.
    spans = {run.lane: run.compile_spans for run in ran.runs if run.compile_spans is not None}
    assert list(spans) == ["plain cold"]
    tunes, alone = spans["plain cold"]["tunes"], spans["plain cold"]["alone"]
    assert len(tunes) == 1 and [len(times) for times in tunes.values()] == [2] and len(alone) == 1, spans
    assert all(0 < took < 60 for took in [*alone, *next(iter(tunes.values()))])
    # And its C builds: the tune's first benchmark's (a launcher's), and the one of no tune (a driver's module).
    builds = spans["plain cold"]["builds"]
    assert list(builds["tunes"]) == list(tunes) and [len(times) for times in builds["tunes"].values()] == [1], builds
    assert len(builds["alone"]) == 1 and all(0 < took < 60 for took in [*builds["alone"], *builds["tunes"][next(iter(tunes))]])
    rows = bench_rows(found, ran.runs)
    assert [r["metric"] for r in rows] == [
        "cold, wall median s", "warm, wall median s",
        "second machine (empty root, the first's entries in S3), wall median s",
        "first machine (empty root, uploading to S3), wall median s",
        "tuning alone (every kernel compiled, no tune's result), wall median s: the floor of a cold run",
        "tuning alone and each tune's longest compile or C build, s: the floor of a cold run whose tunes' configs "
        "compile at once",
        "tuning alone and each tune's compiles, their front halves in turn, s: the floor of a cold run that runs the "
        "program's code only in its process",
        "Triton compiles, second machine (most of a turn)", "tests whose verdict differs between runs (7 runs)"]
    alone_run = next(run for run in ran.runs if run.lane == "tuning alone")
    tune_spans = [*next(iter(tunes.values())), *next(iter(builds["tunes"].values()))]
    assert rows[5]["kcache"] == pytest.approx(alone_run.wall_s + max(tune_spans) + alone[0] + builds["alone"][0])
    # Its two configs are two sources (BLOCK differs): two front halves in turn, then the shorter back half.
    halves = spans["plain cold"]["halves"][next(iter(tunes))]
    assert len({source for source, _, _ in halves}) == 2 and all(0 < front < 60 and 0 < back < 60 for _, front, back in halves)
    in_turn = halves[0][1] + halves[1][1] + min(halves[0][2], halves[1][2])
    assert rows[6]["kcache"] == pytest.approx(rows[5]["kcache"] + max(0.0, in_turn - max(tune_spans)))
    assert rows[-1]["kcache"] == 0 and rows[-2]["kcache"] == 0
    assert report(found, ran.runs, rows) == 0
    out = capsys.readouterr().out
    assert "verdicts identical in all 7 runs: 5 tests: 1 failed, 3 passed, 1 skipped" in out
    logs = sorted(path.name for path in ran.logs.iterdir())
    assert len(logs) == 9 and logs[2] == "03-plain-cold-turn1.log"  # two warm-ups first, then each run's


def test_the_floor_lane_runs_on_triton_s_cache_less_its_tunes_results(tmp_path: Path) -> None:
    cache = tmp_path / "plain-triton"
    for name, data in {"KEY1/matmul_kernel.cubin": b"cubin", "KEY1/matmul_kernel.json": b"{}",
                       "KEY2/matmul_kernel.autotune.json": b'{"configs_timings": []}'}.items():
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        (cache / name).write_bytes(data)
    copy = untuned(cache)
    assert sorted(str(path.relative_to(copy)) for path in copy.rglob("*") if path.is_file()) == [
        "KEY1/matmul_kernel.cubin", "KEY1/matmul_kernel.json"]
    assert (cache / "KEY2" / "matmul_kernel.autotune.json").exists()  # the plain lane's own cache is left whole


def test_where_every_tunes_configs_compile_at_once_a_cold_run_adds_each_tunes_longest_and_every_lone_compile() -> None:
    spans = {"tunes": {"a (1024,)": [0.5, 2.0, 1.0], "a (2048,)": [0.25], "b (1024,)": []}, "alone": [0.5, 0.75]}
    assert compiled_at_once_s(spans) == 2.0 + 0.25 + 0.5 + 0.75
    # A tune's C build (its launcher) runs beside its compiles at best; one of no tune (the driver's module) adds.
    spans["builds"] = {"tunes": {"a (1024,)": [1.5], "a (2048,)": [0.375], "c (8,)": [0.125]}, "alone": [0.25]}
    assert compiled_at_once_s(spans) == 2.0 + 0.375 + 0.125 + 0.5 + 0.75 + 0.25


def test_where_the_programs_code_runs_only_in_its_process_a_tunes_front_halves_take_their_turns() -> None:
    # Three configs over two sources: s1's front once (the least of its two), s2's, then the shortest back half.
    halves = [["s1", 0.25, 1.0], ["s1", 0.375, 0.5], ["s2", 0.125, 0.75]]
    assert fronts_in_turn_s(halves) == 0.25 + 0.125 + 0.5
    spans = {"tunes": {"a": [1.25, 0.875, 0.875], "b": [0.5]}, "alone": [0.5],
             "halves": {"a": halves, "b": [["s3", 0.25, 0.25]]}}
    assert compiled_at_once_s(spans, one_gil=True) == 1.25 + 0.5 + 0.5  # a's longest compile outlasts its fronts
    halves.append(["s4", 0.5, 0.5])
    assert compiled_at_once_s(spans, one_gil=True) == (0.25 + 0.125 + 0.5 + 0.5) + 0.5 + 0.5  # now they outlast it


def test_a_verdict_that_depends_on_the_lane_fails_the_report(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    found = library(tmp_path / "library", {"test_lane.py": UNDER_KCACHE_ONLY})
    ran = lanes(tmp_path)
    measure(found, ran, turns=1, warm_runs=1, s3=False)
    assert {run.lane: run.verdicts["tests.ops.test_lane::test_without_kcache"] for run in ran.runs} == {
        "plain cold": "passed", "kcache cold": "failed", "tuning alone": "passed", "plain warm": "passed",
        "kcache warm": "failed"}
    rows = bench_rows(found, ran.runs)
    assert rows[-1]["metric"] == "tests whose verdict differs between runs (5 runs)" and rows[-1]["kcache"] == 1
    assert report(found, ran.runs, rows) == 1
    assert "VERDICTS DIFFER: 1 tests" in capsys.readouterr().err


def test_a_pytest_that_ran_no_tests_is_no_run(tmp_path: Path) -> None:
    found = library(tmp_path / "library", {"test_lane.py": UNDER_KCACHE_ONLY})
    found.tests = "tests/ops/test_missing.py"  # pytest's usage error: exit status 4
    with pytest.raises(RuntimeError, match="warm-up: pytest exited 4"):
        measure(found, lanes(tmp_path), turns=1, warm_runs=0, s3=False)
