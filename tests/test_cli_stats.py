"""`kcache stats` as ccache counts (issue 58): a hit is a lookup served without compiling, the herd's
waiters included; `stats --zero`; `kcache config`; KCACHE_LOG's lines. Real processes on the synthetic
compiler (stress.programs.synthetic): each a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kcache.config import SETTING_NAMES
from kcache.maintenance.stats import read_persisted

from .helpers import PROJECT, child_env, expect_line, spawn

ONE_KERNEL = """
import json, sys, kcache
from stress.programs import synthetic
cache = kcache.KernelCache({root!r}, backend=synthetic)
print("ready", flush=True); sys.stdin.readline()
cache.get_or_compile(synthetic.SyntheticFunc({name!r}), "synthetic")
print(json.dumps(cache.stats()), flush=True)
"""


def kcache(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kcache", *argv], capture_output=True, text=True,
                          env=child_env(**env), cwd=str(PROJECT), timeout=120)


def stats_of(root: Path) -> dict:
    done = kcache("--dir", str(root), "--json", "stats")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def herd(root: Path, size: int, name: str = "k0", **env: str) -> list[dict]:
    """`size` fresh processes, released together on one cold kernel (a compile of half a second)."""
    children = [spawn(ONE_KERNEL.format(root=str(root), name=name), KCACHE_SYNTHETIC_COMPILE_S="0.5", **env)
                for _ in range(size)]
    for child in children:
        expect_line(child, "ready")
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    finished = [child.communicate(timeout=120) for child in children]
    assert all(child.returncode == 0 for child in children), [err[-2000:] for _out, err in finished]
    return [json.loads(out.strip().splitlines()[-1]) | {"stderr": err} for out, err in finished]


def test_a_herd_of_four_on_one_cold_kernel_reads_one_miss_three_hits_75_percent(cache_root: Path) -> None:
    processes = herd(cache_root, 4)
    assert sum(p["compiles"] for p in processes) == 1
    assert sum(p["lock_waits"] for p in processes) == 3, processes  # the three met the compile and waited
    stats = stats_of(cache_root)
    assert stats["lookups"]["tilelang"] == {"hits": 3, "misses": 1, "compiles": 1, "hit_rate": 0.75}
    assert (stats["disk_hits"], stats["misses"], stats["compiles"]) == (3, 1, 1)
    assert stats["lookups"]["total"]["hit_rate"] == stats["hit_rate"] == 0.75
    text = kcache("--dir", str(cache_root), "stats").stdout
    assert any(line.split()[:2] == ["hit", "rate"] and line.split()[-1] == "75.0%" for line in text.splitlines()), text
    (tilelang,) = [line.split() for line in text.splitlines() if line.startswith("TileLang ")]
    assert tilelang == ["TileLang", "3", "1", "1", "75.0%"], text
    (triton,) = [line.split() for line in text.splitlines() if line.startswith("Triton ")]
    assert triton == ["Triton", "0", "0", "0", "-"], text
    assert kcache("--dir", str(cache_root), "verify").stdout.startswith("1 entry, 1 good, 0 bad; 0 staging directories")


def test_stats_zero_zeroes_the_counters_of_dead_and_live_processes_and_a_fold_keeps_them_zeroed(
        cache_root: Path) -> None:
    herd(cache_root, 2)  # dead processes: their files
    live = spawn(f"""
import sys, kcache
from kcache.maintenance.counter_file import stats_file
from stress.programs import synthetic
cache = kcache.KernelCache({str(cache_root)!r}, backend=synthetic)
cache.get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
stats_file(cache.root).flush()
print("counted", flush=True); sys.stdin.readline()
cache.get_or_compile(synthetic.SyntheticFunc("k1"), "synthetic")
stats_file(cache.root).flush()
print("counted", flush=True); sys.stdin.readline()
""")
    expect_line(live, "counted")
    before = stats_of(cache_root)["lookups"]["tilelang"]
    assert (before["hits"], before["misses"]) == (2, 1)
    zeroed = kcache("--dir", str(cache_root), "stats", "--zero")
    assert zeroed.returncode == 0 and zeroed.stdout.strip() == f"zeroed the counters of {cache_root}", zeroed.stderr
    assert stats_of(cache_root)["lookups"]["total"] == {"hits": 0, "misses": 0, "compiles": 0, "hit_rate": None}
    live.stdin.write("go\n")
    live.stdin.flush()
    expect_line(live, "counted")  # the live process counted one more miss after the zero: only it shows
    assert stats_of(cache_root)["lookups"]["tilelang"] == {"hits": 0, "misses": 1, "compiles": 1, "hit_rate": 0.0}
    live.communicate("go\n", timeout=60)
    assert kcache("--dir", str(cache_root), "gc").returncode == 0  # folds every dead process's file
    assert read_persisted(cache_root)["misses"] == 1 and read_persisted(cache_root)["disk_hits"] == 0


def test_kcache_log_debug_says_each_lookup_in_one_line_naming_the_kernel(cache_root: Path) -> None:
    processes = herd(cache_root, 2, KCACHE_LOG="debug")
    lines = [line for p in processes for line in p["stderr"].splitlines()]
    assert all(line.startswith("kcache: ") for line in lines), lines
    events = sorted(line.split()[2] for line in lines if line.split()[1] == "tilelang")
    assert events == ["compile", "hit", "miss", "wait"], lines
    assert all(" k0, key " in line for line in lines if line.split()[1] == "tilelang"), lines
    quiet = herd(cache_root, 1, name="k1")  # unset: nothing but warnings
    assert quiet[0]["stderr"] == ""
    info = herd(cache_root, 1, name="k0", KCACHE_LOG="info")  # a hit: below info
    assert info[0]["stderr"] == ""


def test_a_bad_kcache_log_is_one_line_naming_the_setting(cache_root: Path) -> None:
    done = kcache("--dir", str(cache_root), "stats", KCACHE_LOG="verbose")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "kcache: KCACHE_LOG='verbose' must be one of warning, info, debug"], done.stderr


def test_config_shows_every_setting_with_its_value_and_source(tmp_path: Path) -> None:
    done = kcache("--dir", str(tmp_path / "r"), "--json", "config", KCACHE_MAX_SIZE="5G", KCACHE_LOCK_TIMEOUT="soon",
                  KCACHE_REMOTE_SECRET="hunter2", KCACHE_LOG="")
    rows = {row["name"]: row for row in json.loads(done.stdout)["settings"]}
    assert set(rows) == SETTING_NAMES and done.returncode == 1  # a value that does not parse: not a pass
    assert (rows["KCACHE_MAX_SIZE"]["value"], rows["KCACHE_MAX_SIZE"]["source"]) == ("5G", "env")
    assert (rows["KCACHE_DIR"]["value"], rows["KCACHE_DIR"]["source"]) == (str(tmp_path / "r"), "--dir")
    assert (rows["KCACHE_LOG"]["value"], rows["KCACHE_LOG"]["source"]) == ("warning", "default")
    assert "not a duration" in rows["KCACHE_LOCK_TIMEOUT"]["problem"]
    assert "hunter2" not in done.stdout and rows["KCACHE_REMOTE_SECRET"]["source"] == "env"
    text = kcache("config", KCACHE_MAX_SIZE="5G").stdout
    assert any(line.split() == ["KCACHE_MAX_SIZE", "env", "5G"] for line in text.splitlines()), text
    assert any(line.split() == ["KCACHE_READONLY", "default", "0"] for line in text.splitlines()), text


JIT_PROGRAM = """
import kcache, tilelang
import tilelang.language as T
from stress.programs.kernels import CPU_TARGET

@tilelang.jit(out_idx=[-1], target=CPU_TARGET)
def scale(N, factor):
    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, 128), threads=128) as bx:
            for i in T.Parallel(128):
                B[bx * 128 + i] = A[bx * 128 + i] * factor

    return main

kcache.install(kcache.KernelCache({root!r}))
scale(1024, 2.0)
scale(2048, factor=2.0)
"""


def test_ls_names_a_tilelang_jit_kernel_by_its_function_and_shows_its_arguments(cache_root: Path,
                                                                              tmp_path: Path) -> None:
    program = tmp_path / "jit_program.py"  # a file: TileLang reads the decorated function's source
    program.write_text(JIT_PROGRAM.format(root=str(cache_root)))
    done = subprocess.run([sys.executable, str(program)], capture_output=True,
                          text=True, env=child_env(KCACHE_COMPILE_ISOLATION="inprocess"), cwd=str(PROJECT), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = json.loads(kcache("--dir", str(cache_root), "--json", "ls").stdout)
    assert sorted((row["kernel"], row["config"]) for row in listed) == [("scale", "N=1024, factor=2.0"),
                                                                       ("scale", "N=2048, factor=2.0")]
    text = kcache("--dir", str(cache_root), "ls").stdout
    assert "N=2048, factor=2.0" in text and " main " not in text, text
    shown = kcache("--dir", str(cache_root), "--json", "show", listed[0]["key"][:12])
    assert json.loads(shown.stdout)["meta"]["kernel"] == "main"  # the PrimFunc's own name stays in meta.json


def test_ls_target_names_what_sets_two_targets_of_one_kernel_apart() -> None:
    """TileLang's resolved targets as meta.json keeps them: the usual attributes are left out, others named."""
    from kcache.cli.entries import _arch

    usual = {"arch": "sm_90a", "host": {"keys": ["cpu"], "kind": "c", "tag": ""}, "keys": ["cuda", "gpu"],
             "kind": "cuda", "max_num_threads": 1024, "tag": "", "thread_warp_size": 32}
    assert _arch(usual) == "sm_90a"
    assert _arch({**usual, "max_num_threads": 512}) == "sm_90a max_num_threads=512"
    assert _arch({**usual, "libs": ["cublas"]}) == 'sm_90a libs=["cublas"]'
    assert _arch({"kind": "hip", "mcpu": "gfx942"}) == "hip mcpu=gfx942"
