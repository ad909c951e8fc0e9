"""Every compiler counted, logged, listed and cleared (issue 58): Triton's lookups through kcache.triton's
CacheManager (compiles counted by the runs of Triton's assembler, tests/test_triton.py's wrappers) and
Helion's through kcache.helion.Backend's get and put, each in fresh processes, as `kcache stats`,
`KCACHE_LOG`, `ls` and `clear` show them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

from .helpers import PROJECT, child_env  # noqa: E402
from .test_triton import MANAGER, PROGRAM, compile_in_fresh_process, program_env, ptxas, runs  # noqa: E402, F401 - ptxas: a fixture


def kcache(root: Path, *argv: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), *argv], capture_output=True, text=True,
                          env=child_env(), cwd=str(PROJECT), timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def lookups(root: Path) -> dict:
    return json.loads(kcache(root, "--json", "stats").stdout)["lookups"]


def logged(stderr: str, compiler: str) -> list[str]:
    """The events KCACHE_LOG logged for `compiler`, in order: ["miss", "compile", ...]."""
    return [line.split()[2] for line in stderr.splitlines() if line.startswith(f"kcache: {compiler} ")]


@pytest.mark.parametrize("lane", ["worker", "off"])
def test_a_triton_miss_then_hit_is_counted_and_logged(tmp_path: Path, ptxas: Path, lane: str) -> None:  # noqa: F811
    root = tmp_path / "root"
    env = program_env(ptxas, root, KCACHE_LOG="debug", KCACHE_TRITON_ISOLATION=lane, **MANAGER)
    first = compile_in_fresh_process("add", env)
    assert runs(ptxas) == 1 and logged(first["stderr"], "triton") == ["miss", "compile"], first["stderr"]
    assert "kcache: triton miss add_kernel (Triton), key " in first["stderr"]
    second = compile_in_fresh_process("add", env)
    assert runs(ptxas) == 1 and logged(second["stderr"], "triton") == ["hit"], second["stderr"]
    assert lookups(root)["triton"] == {"hits": 1, "misses": 1, "compiles": 1, "hit_rate": 0.5}
    assert lookups(root)["total"]["hits"] == 1
    text = kcache(root, "stats").stdout
    (row,) = [line.split() for line in text.splitlines() if line.startswith("Triton ")]
    assert row == ["Triton", "1", "1", "1", "50.0%"], text


def test_a_triton_herd_of_four_on_one_cold_kernel_reads_one_miss_three_hits(tmp_path: Path,
                                                                           ptxas: Path) -> None:  # noqa: F811
    """Each process's fork waits for the one compile (or the process finds it published): three hits."""
    root = tmp_path / "root"
    env = program_env(ptxas, root, KT_GATE="1", **MANAGER)
    processes = [subprocess.Popen([sys.executable, str(PROGRAM), "add"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env, cwd=str(PROJECT)) for _ in range(4)]
    for process in processes:
        assert process.stdout.readline().strip() == "ready"
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()
    finished = [process.communicate(timeout=300) for process in processes]
    assert all(process.returncode == 0 for process in processes), [err[-2000:] for _out, err in finished]
    assert runs(ptxas) == 1
    assert lookups(root)["triton"] == {"hits": 3, "misses": 1, "compiles": 1, "hit_rate": 0.75}


def test_ls_tells_a_kernels_triton_configs_apart_and_clear_removes_what_its_help_says(tmp_path: Path,
                                                                                      ptxas: Path) -> None:  # noqa: F811
    root = tmp_path / "root"
    for warps in (4, 8):
        compile_in_fresh_process("add", program_env(ptxas, root, KT_OPTIONS=json.dumps({"num_warps": warps}),
                                                    **MANAGER))
    listed = json.loads(kcache(root, "--json", "ls").stdout)
    assert sorted(row["config"] for row in listed) == ["BLOCK=1024, num_warps=4, num_stages=3",
                                                        "BLOCK=1024, num_warps=8, num_stages=3"]
    text = kcache(root, "ls").stdout
    assert "config" in text.splitlines()[0] and "num_warps=8" in text
    assert "Triton's kernels of this Triton" in kcache(root, "clear", "--help").stdout
    cleared = json.loads(kcache(root, "--json", "clear").stdout)  # both were built by the installed Triton
    assert cleared["removed_triton_entries"] == 2 and json.loads(kcache(root, "--json", "ls").stdout) == []


@pytest.mark.parametrize(("change", "named"), [({"KT_OPTIONS": '{"num_warps": 8}'}, ("num_warps", 4, 8)),
                                               ({"KT_BLOCK": "256"}, ("constexprs[BLOCK]", 128, 256))])
def test_why_miss_names_the_one_option_or_constexpr_of_a_gluon_kernel_that_changed(
        tmp_path: Path, ptxas: Path, change: dict, named: tuple) -> None:  # noqa: F811
    """Gluon makes its IR under num_warps (a layout of num_warps warps, an attribute of the module): the
    IR differs, the kernel's source does not, and why-miss names the option or constexpr alone."""
    root = tmp_path / "root"
    for extra in ({}, change):
        done = subprocess.run([sys.executable, str(PROJECT / "tests" / "gluon_program.py")], capture_output=True,
                              text=True, env=program_env(ptxas, root, **MANAGER, **extra), cwd=str(PROJECT), timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    assert runs(ptxas) == 2
    explained = json.loads(kcache(root, "--json", "why-miss", "--last").stdout)
    assert [(d["field"], d["stored"], d["yours"]) for d in explained["differences"]] == [named], explained


# ---------------------------------------------------------------- Helion


def test_helion_lookups_through_the_backends_get_and_put_are_counted_and_logged(tmp_path: Path) -> None:
    pytest.importorskip("helion", reason="the Helion tests need helion (pip install -e '.[test]')")
    from .test_helion import PICK, finish, helion_env, start

    root = tmp_path / "root"
    pick = {**PICK, "key": {"fields": {"kernel_name": "matmul"}}}
    first = finish(start(helion_env(root, KCACHE_LOG="debug"), pick=pick))  # get: a miss; put: its pick
    assert first["tuned"] and logged(first["stderr"], "helion") == ["miss", "compile"], first["stderr"]
    second = finish(start(helion_env(root, KCACHE_LOG="debug"), pick=pick))  # get: a hit
    assert not second["tuned"] and logged(second["stderr"], "helion") == ["hit"], second["stderr"]
    assert "kcache: helion hit matmul (Helion), key " in second["stderr"]
    assert lookups(root)["helion"] == {"hits": 1, "misses": 1, "compiles": 1, "hit_rate": 0.5}
    (row,) = json.loads(kcache(root, "--json", "ls").stdout)
    assert (row["kind"], row["kernel"], row["config"]) == (
        "helion", "matmul", "block_sizes=[64, 64, 32], num_warps=4, num_stages=3")
    kept = json.loads(kcache(root, "--json", "clear").stdout)  # a pick names no version kcache reads: kept
    assert kept["removed_helion_picks"] == 0
    cleared = kcache(root, "clear", "--all-versions").stdout
    assert "1 Helion pick (every version)" in cleared and json.loads(kcache(root, "--json", "ls").stdout) == []
