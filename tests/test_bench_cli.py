"""`python -m stress.bench`'s own command line, on the CPU: what --profile hands the profile, a
scenario with no profile refused in one line, what the Helion scenario needs, and the order and the
time budget of its lanes (its processes scripted: they need a GPU); the Triton precompile row, one
turn, for real."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stress.bench.__main__ import main, profile_arguments


def test_a_profile_gets_every_argument_but_only_and_profile() -> None:
    # --repeats and --json are also the bench's own options: the profile must still see them.
    argv = ["--only", "disk", "--profile", "--repeats", "2", "--json", "out.json", "--only=cold", "--kernel", "add"]
    assert profile_arguments(argv) == ["--repeats", "2", "--json", "out.json", "--kernel", "add"]


def test_a_scenario_without_a_profile_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--only", "memory", "--profile"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stress.bench: --profile needs --only with one of herd, disk, cold, triton, helion"]


def test_the_helion_profile_needs_a_gpu_and_helion_not_tilelang(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # Helion's scenario runs no TileLang: a machine without it may still profile a Helion tune.
    pytest.importorskip("helion", reason="the Helion scenario needs helion (pip install -e '.[test]')")
    import kcache.tilelang.installed
    import stress.gpu

    monkeypatch.setattr(kcache.tilelang.installed, "tilelang_installed", lambda: False)
    monkeypatch.setattr(stress.gpu, "gpu_missing", lambda: "no CUDA GPU visible (this test's)")
    assert main(["--only", "helion", "--profile"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["helion: profile skipped: no CUDA GPU visible (this test's)"]


def test_a_helion_bench_starts_no_turn_that_could_end_after_its_time() -> None:
    from stress.bench.standalone.helion import HELION_COMPILE_TIMEOUT_S, TurnBudget

    now = [0.0]
    budget = TurnBudget(300.0, clock=lambda: now[0])
    assert budget.next_fits(0)  # a kernel's first turn always runs, its length unknown
    now[0] = 100.0
    budget.took(60.0)
    assert budget.next_fits(1)  # 100 + 60 + a compile timeout's 60 <= 300
    now[0] = 300.0 - 60.0 - HELION_COMPILE_TIMEOUT_S + 1.0
    assert not budget.next_fits(2)
    assert budget.next_fits(0)  # the next kernel still gets one turn
    assert TurnBudget(None, clock=lambda: 1e9).next_fits(5)


class _ScriptedLane:
    """stress.bench.standalone.helion's Lane without a GPU: each process's reading scripted, each call kept in order."""

    calls: list[str] = []

    def __init__(self, work: object, kernel: str) -> None:
        self.work = self.logs = work
        self.last_own = None

    def one(self, name: str, root: str | None, seed: int, own: object = None) -> dict:
        self.calls.append(f"{name} {'kcache' if root else 'alone'} {seed}" + (f" on {own}'s caches" if own else ""))
        self.last_own = f"{name}-{seed}"
        return {"ready_s": 20.0, "compiles": 9, "timeouts": 0, "config": "c", "correct": True}

    def herd(self, procs: int, root: str | None) -> dict:
        self.calls.append(f"herd {procs} {'kcache' if root else 'alone'}")
        return {"wall_s": 30.0, "compiles": 9, "picks": 1, "correct": True}


@pytest.mark.parametrize("against_itself", [False, True])
def test_a_helion_bench_runs_its_herd_first_then_its_lanes_by_turns(
        against_itself: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from stress.bench.standalone import helion

    monkeypatch.setattr(helion, "Lane", _ScriptedLane)
    monkeypatch.setattr(helion.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    _ScriptedLane.calls = []
    found = helion.measure("softmax", 2, 8, helion.TurnBudget(None), against_itself)
    s = helion.SEED
    if against_itself:  # no kcache anywhere, no herd
        assert _ScriptedLane.calls == [f"plain alone {s}", f"plain-b alone {s}", f"plain alone {s + 1}",
                                       f"plain-b alone {s + 1}"]
        assert [r["metric"] for r in helion.bench_rows(found)][0] == "softmax: Helion alone against itself, ready"
    else:
        # Each turn's second processes: Helion alone on the plain process's warm local cache, and kcache's.
        assert _ScriptedLane.calls == ["herd 8 kcache", "herd 8 alone",
                                       f"plain alone {s}", f"plain-warm alone {s} on plain-{s}'s caches",
                                       f"first kcache {s}", f"second kcache {s}",
                                       f"plain alone {s + 1}", f"plain-warm alone {s + 1} on plain-{s + 1}'s caches",
                                       f"first kcache {s + 1}", f"second kcache {s + 1}"]
        rows = {r["metric"]: r for r in helion.bench_rows(found)}
        assert rows["softmax: second process, ready"]["baseline"] == "Helion alone on its warm local cache"
        assert rows["softmax: herd of 8, wall"]["baseline"] == "8 Helion processes on its local cache"
        assert len(rows) == 7 and found["correct"] and found["same_pick"]


def test_each_helion_bench_process_has_caches_of_its_own_and_an_autotune_log(tmp_path: Path) -> None:
    """Fresh processes: Helion's, Triton's and Inductor's caches new for each one (the plain lane, run
    first in a turn, must leave nothing the kcache lane reads), and Helion's per-config CSV kept in logs/."""
    from stress.bench.standalone.helion import KCACHE_ENV, Lane

    lane = Lane(tmp_path, "softmax")
    plain, first = lane.env("plain", None, 7), lane.env("first", str(tmp_path / "root"), 7)
    for cache in ("HELION_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "HELION_AUTOTUNE_LOG"):
        assert plain[cache] != first[cache] and plain[cache].startswith(str(tmp_path))
    assert Path(plain["HELION_AUTOTUNE_LOG"]).parent == lane.logs
    assert not KCACHE_ENV.keys() & plain.keys() and first["KCACHE_DIR"] == str(tmp_path / "root")
    assert plain["HELION_AUTOTUNE_RANDOM_SEED"] == first["HELION_AUTOTUNE_RANDOM_SEED"] == "7"
    # Helion alone's second process: the plain process's local caches, warm (the user's alternative)
    warm = lane.env("plain-warm", None, 7, own=Path(plain["HELION_CACHE_DIR"]).parent)
    for cache in ("HELION_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert warm[cache] == plain[cache]
    assert warm["HELION_AUTOTUNE_LOG"] != plain["HELION_AUTOTUNE_LOG"]


def test_a_helion_herd_is_held_to_the_plain_tune_of_its_own_draws() -> None:
    """The herd draws turn 1's configs (SEED): its compiles are compared with turn 1's plain tune, not
    with a median over turns whose draws had configs time out (fewer compiles, none of the herd's)."""
    from stress.bench.standalone.helion import bench_rows

    def reading(compiles: int) -> dict:
        return {"ready_s": 20.0, "compiles": compiles, "timeouts": 9 - compiles, "config": "c", "correct": True}

    found = {"kernel": "softmax", "plain": [reading(9), reading(6)], "first": [reading(9), reading(6)],
             "plain_warm": [reading(0), reading(0)], "second": [reading(0), reading(0)], "procs": 8,
             "against_itself": False, "herd": {"wall_s": 30.0, "compiles": 9, "picks": 1, "correct": True},
             "herd_alone": {"wall_s": 60.0, "compiles": 72, "picks": 3, "correct": True}}
    herd = next(r for r in bench_rows(found) if r["metric"] == "softmax: herd of 8, compiles")
    assert (herd["kcache"], herd["tilelang"]) == (9, 9)  # not 7.5: a median over both turns


def test_the_triton_precompile_row_compiles_its_8_forks_in_both_lanes(tmp_path: Path) -> None:
    """stress.bench --only triton's precompile row, one turn on the CPU: 8 forks of the caller compile a
    config each in both lanes (the program fails the row where a fork's compile failed), and under
    kcache each config lands in the root as a group of its own."""
    from stress.bench.triton import KCACHE, precompile_rows
    from stress.procs import worker_env

    base = {key: value for key, value in worker_env().items() if key != "TRITON_CACHE_MANAGER"}
    (found,) = precompile_rows(tmp_path, {"kcache": {**base, **KCACHE}, "triton": base}, 1)
    assert found["kcache"] > 0 and found["tilelang"] > 0 and found["baseline"] == "triton in the same forks"
    groups = [name for name in os.listdir(tmp_path / "precompile-kcache-0" / "triton") if not name.startswith(".")]
    assert len(groups) >= 9  # the caller's baseline and the 8 configs


def test_without_a_gpu_the_autotune_row_times_the_tunes_compiles_under_a_driver_that_launches_nothing(
        tmp_path: Path, runtime: Path) -> None:
    """stress.bench --only triton's autotune row, one turn on the CPU: a row of its own, with no goal,
    whose kcache lane compiled the tune's configs ahead into its root (16 groups) and Triton's into its
    own cache."""
    from stress.bench.suite.goals import judge
    from stress.bench.triton import autotune_rows
    from stress.procs import worker_env

    (found,) = autotune_rows(tmp_path, worker_env(), 1)
    assert found["metric"] == "tune's compiles median s" and found["kcache"] > 0 and found["tilelang"] > 0
    assert judge("triton", found) == (None, None)
    groups = [name for name in os.listdir(tmp_path / "cpu_tune-kcache-0" / "triton") if not name.startswith(".")]
    assert len(groups) >= 16


def test_kcaches_own_floor_in_the_tunes_row_is_first_compiles_alone_then_the_cpu_time_on_every_core(
        tmp_path: Path) -> None:
    """stress.bench's tunes-at-once row, kcache's own floor from its parts: 2 processes whose first compile
    runs 0.5 s alone, 10 s of the machine's CPU time over the window, spread on the usable cores; each
    turn's two lanes as a ratio; the window's ramp and tail, where fewer than 90% of the cores were busy.
    And the sampler reads this machine's /proc/stat: a busy loop of 0.3 s counts as at least 0.2 s of CPU."""
    import json as json_module
    import time

    from stress.bench.cpu_busy import CpuSampler
    from stress.bench.triton_tunes import own_work_floor, ramp_and_tail, turn_ratios

    for pid, spans in ((1, [[100.0, 101.0], [100.5, 102.0]]), (2, [[100.0, 101.5], [100.5, 103.0]])):
        (tmp_path / f"{pid}.json").write_text(json_module.dumps({"spans": spans}))
    cpu = CpuSampler()
    cpu.times, cpu.busy = [99.0, 104.0], [0, 10 * os.sysconf("SC_CLK_TCK")]  # 10 s over 99-104: 6 s in 100-103
    floor, spread = own_work_floor(tmp_path, cpu)
    cores = len(os.sched_getaffinity(0))
    assert floor == pytest.approx(0.5 + (6.0 - 2 * 0.5) / cores) and spread == pytest.approx(6.0 / cores)
    # The window 100-103: half the cores busy until 101, all of them 101-102, half again 102-103.
    tick, window = os.sysconf("SC_CLK_TCK"), CpuSampler()
    window.times = [99.0, 100.0, 101.0, 102.0, 103.0, 104.0]
    window.busy = [round(sum(share * cores * tick for share in (0, 0.5, 0.5, 1.0, 0.5, 0.2)[:n + 1])) for n in range(6)]
    assert ramp_and_tail(tmp_path, window) == pytest.approx((1.0, 1.0))
    assert window.full_between(100.0, 103.0, cores * 4) is None  # never 90% of 4 times the cores
    (tmp_path / "3.json").write_text(json_module.dumps({"spans": [[100.0, 101.0]]}))
    with pytest.raises(RuntimeError, match="fewer than 2 compile spans"):
        own_work_floor(tmp_path, cpu)

    assert turn_ratios([2.5, 3.0], [5.0, 4.0]) == "2.50/5.00 s 0.500x, 3.00/4.00 s 0.750x"

    with CpuSampler() as sampler:
        started = time.time()
        while time.time() - started < 0.3:
            pass
        ended = time.time()
    assert (sampler.core_seconds(started, ended) or 0.0) >= 0.2
