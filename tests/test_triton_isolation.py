"""Triton's compiles in a fork of the caller (issue 56), on the CPU machine: Triton compiles for sm_90
without a GPU. Faults are real: an abort, a segfault, a hang and a Python error injected into one
config's `llir` stage through Triton's own stage hook (tests/triton_faults_program.py), each firing
recorded with the pid it ran in. Plain Triton, dying on the abort, is the control."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

from .helpers import PROJECT  # noqa: E402
from .test_triton import MANAGER, program_env, ptxas, runs  # noqa: E402, F401 - a fixture

PROGRAM = Path(__file__).with_name("triton_faults_program.py")
OK_CONFIGS = ("1", "2", "8")


def run(env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PROGRAM)], capture_output=True, text=True, env=env, cwd=str(PROJECT),
                          timeout=timeout)


def printed(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def fired(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def faulty(tmp_path: Path, ptxas: Path, fault: str, **extra: str) -> dict[str, str]:  # noqa: F811
    return program_env(ptxas, tmp_path / "root", KT_FAULT=fault, KT_FIRED=str(tmp_path / "fired"), **MANAGER, **extra)


def test_plain_triton_dies_on_the_abort_and_kcache_skips_that_config_only(tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    """The founding report: one config's abort ends plain Triton's process (rc -6). Under kcache the
    abort fires in a fork, the caller gets TritonCompilerCrashed (a CompilerCrashed and a PTXASError,
    which @triton.autotune skips) naming the kernel, the config and the signal; the other configs and
    a later kernel compile, byte-equal to plain Triton's, and the caller's other thread lives. The
    program's `random` state is its own: its next draw is plain Triton's (Helion's searches seed it,
    and draw their configs between compiles)."""
    plain_env = program_env(ptxas, tmp_path / "plain", KT_FAULT="abort", KT_FIRED=str(tmp_path / "plain-fired"))
    plain = run(plain_env)
    assert plain.returncode == -signal.SIGABRT and fired(tmp_path / "plain-fired"), plain.stderr[-2000:]
    reference = printed(run(program_env(ptxas, tmp_path / "reference", KT_FAULT="none", KT_FIRED=str(tmp_path / "x"))))

    done = run(faulty(tmp_path, ptxas, "abort"))
    result = printed(done)
    (where,) = fired(tmp_path / "fired")
    assert where != result["pid"]  # the abort fired, in another process
    crash = result["configs"]["4"]
    assert crash["type"] == "TritonCompilerCrashed" and {"CompilerCrashed", "PTXASError"} <= set(crash["mro"])
    assert "SIGABRT" in crash["message"] and "add_kernel (Triton) [BLOCK=1024, num_warps=4" in crash["message"]
    assert {config: result["configs"][config] for config in OK_CONFIGS} == {
        config: reference["configs"][config] for config in OK_CONFIGS}
    assert result["later"] == reference["later"] and result["ticker_alive"] and result["ticks"] > 0
    assert result["draw"] == reference["draw"]
    skipped = [line for line in done.stderr.splitlines() if "crashed (SIGABRT)" in line]
    assert len(skipped) == 1 and "num_warps=4" in skipped[0] and "skips this config" in skipped[0], done.stderr


@pytest.mark.parametrize("fault", ["segv", "hang"])
def test_a_segfault_or_a_hang_is_one_exception_and_no_process_is_left(tmp_path: Path, ptxas: Path, fault: str) -> None:  # noqa: F811
    done = run(faulty(tmp_path, ptxas, fault, KCACHE_COMPILE_TIMEOUT="5"))
    result = printed(done)
    (where,) = fired(tmp_path / "fired")
    assert where != result["pid"]
    expected = "TritonCompilerCrashed" if fault == "segv" else "TritonCompileTimeout"
    assert result["configs"]["4"]["type"] == expected, result["configs"]["4"]
    assert "PTXASError" in result["configs"]["4"]["mro"]
    assert all(isinstance(result["configs"][config], str) for config in OK_CONFIGS)
    with pytest.raises(ProcessLookupError):
        os.kill(where, 0)  # the fork (and, for the hang, its process group) is gone


def test_a_python_error_is_the_one_plain_triton_raises(tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    """A Python error in the fork: the caller compiles that config itself and raises what plain Triton
    raises, type and message; the fork showed the compile does not crash."""
    plain = printed(run(program_env(ptxas, tmp_path / "plain", KT_FAULT="python", KT_FIRED=str(tmp_path / "p"))))
    result = printed(run(faulty(tmp_path, ptxas, "python")))
    assert result["configs"]["4"] == plain["configs"]["4"] and result["configs"]["4"]["type"] == "ValueError"
    assert sorted(set(fired(tmp_path / "fired"))) != [result["pid"]] and result["pid"] in fired(tmp_path / "fired")


def test_a_crash_is_remembered_by_the_next_process_until_kcache_clear(tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    first = printed(run(faulty(tmp_path, ptxas, "abort")))
    assert len(fired(tmp_path / "fired")) == 1 and first["configs"]["4"]["type"] == "TritonCompilerCrashed"
    from kcache.cache.miss_explain import logged_misses

    # The crashed lookup is a logged miss too (issue 68), which why-miss explains.
    (crashed,) = [record for record in logged_misses(tmp_path / "root") if record.get("crashed")]
    assert crashed["kernel"] == "add_kernel (Triton)" and crashed["crashed"] == "SIGABRT", crashed
    why = kcache_of(tmp_path, "why-miss", crashed["key"])
    assert "its compile crashed (SIGABRT)" in why and "`kcache clear` forgets it" in why, why
    assembled = runs(ptxas)
    done = run(faulty(tmp_path, ptxas, "abort"))
    second = printed(done)
    assert len(fired(tmp_path / "fired")) == 1, "the failing stage ran again"
    assert runs(ptxas) == assembled  # and nothing else compiled: every other config was a hit
    assert second["configs"]["4"]["type"] == "TritonCompilerCrashed" and "remembered" in second["configs"]["4"]["message"]
    assert "`kcache clear --crashes` forgets remembered crashes" in done.stderr
    remembered = [record for record in logged_misses(tmp_path / "root") if record.get("crashed")][1:]
    assert [r["crashed"].startswith("SIGABRT, remembered from") for r in remembered] == [True], remembered
    why = json.loads(kcache_of(tmp_path, "--json", "why-miss", remembered[0]["key"]))
    assert why["kernel"] == "add_kernel (Triton)" and why["crashed"] == remembered[0]["crashed"], why
    listed = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(tmp_path / "root"), "ls"], capture_output=True,
                            text=True, cwd=str(PROJECT), timeout=120)
    assert "triton crash" in listed.stdout and "add_kernel" in listed.stdout, listed.stdout
    # The kernel in its column, the crashed config in the config column (issue 68).
    (crash,) = [row for row in json.loads(kcache_of(tmp_path, "--json", "ls")) if row["kind"] == "triton crash"]
    assert crash["kernel"] == "add_kernel" and "num_warps=4" in (crash["config"] or ""), crash
    assert "crashed: SIGABRT on 20" in crash["config"], crash  # with its signal and date
    stats = json.loads(kcache_of(tmp_path, "--json", "stats"))
    assert stats["triton_crashes_remembered"] == 1, stats
    # doctor's size is stats' (Triton's entries counted: what KCACHE_MAX_SIZE bounds).
    (size,) = [f for f in json.loads(kcache_of(tmp_path, "--json", "doctor")) if f["check"] == "size"]
    from kcache.cli.format import human_size

    assert size["detail"].startswith(f"{human_size(stats['size_bytes'])} of entries") and stats["size_bytes"] > 0, size
    # `show` finds an entry by Triton's own key too, and a key that matches nothing names both places.
    triton_key = json.loads(kcache_of(tmp_path, "--json", "show", crash["key"]))["meta"]["triton_key"]
    assert json.loads(kcache_of(tmp_path, "--json", "show", triton_key[:12]))["key"] == crash["key"]
    missing = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(tmp_path / "root"), "show", "ffffffffffff"],
                             capture_output=True, text=True, cwd=str(PROJECT), timeout=120)
    assert missing.returncode == 1 and "(TileLang's) or" in missing.stderr and "(Triton's)" in missing.stderr
    # Forgotten by its key alone (the kernels stay), then compiled (and crashed) again.
    cleared = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(tmp_path / "root"), "--json", "clear",
                              "--crashes", crash["key"][:12]], capture_output=True, text=True, cwd=str(PROJECT),
                             timeout=120)
    assert cleared.returncode == 0 and json.loads(cleared.stdout)["forgotten_triton_crashes"] == 1, cleared.stderr
    assembled = runs(ptxas)
    printed(run(faulty(tmp_path, ptxas, "abort")))
    assert len(fired(tmp_path / "fired")) == 2
    assert runs(ptxas) == assembled  # every other config's kernel was kept: a hit
    # A plain `clear` forgets it too, counted apart from the kernels it removes.
    cleared = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(tmp_path / "root"), "clear"],
                             capture_output=True, text=True, cwd=str(PROJECT), timeout=120)
    assert cleared.returncode == 0, cleared.stderr
    assert "forgot 1 remembered Triton crash" in cleared.stdout, cleared.stdout  # not counted as a Triton entry
    printed(run(faulty(tmp_path, ptxas, "abort")))
    assert len(fired(tmp_path / "fired")) == 3  # forgotten: compiled (and crashed) again


def kcache_of(tmp_path: Path, *argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(tmp_path / "root"), *argv], capture_output=True,
                          text=True, cwd=str(PROJECT), timeout=120)
    assert done.returncode in (0, 1) and done.stdout, done.stderr
    return done.stdout


def test_a_herd_of_8_runs_one_isolated_compile_per_key(tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    env = {**faulty(tmp_path, ptxas, "none"), "KT_GATE": "1"}
    herd = [subprocess.Popen([sys.executable, str(PROGRAM)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=str(PROJECT)) for _ in range(8)]
    for process in herd:
        assert process.stdout.readline().strip() == "ready", process.stderr.read()
    for process in herd:
        process.stdin.write("go\n")
        process.stdin.flush()
    outputs = [process.communicate(timeout=600) for process in herd]
    assert all(process.returncode == 0 for process in herd), [err[-2000:] for _, err in outputs]
    results = [json.loads(out.splitlines()[-1]) for out, _ in outputs]
    assert all(result["configs"] == results[0]["configs"] for result in results)
    assert runs(ptxas) == 5  # four configs and the later kernel, each once among the eight processes


def test_isolation_off_compiles_in_the_caller_as_before(tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    done = run(faulty(tmp_path, ptxas, "abort", KCACHE_TRITON_ISOLATION="off"))
    assert done.returncode == -signal.SIGABRT and fired(tmp_path / "fired")
    bad = run(faulty(tmp_path, ptxas, "none", KCACHE_TRITON_ISOLATION="sometimes"))
    assert bad.returncode != 0 and "KCACHE_TRITON_ISOLATION='sometimes' must be one of worker, off" in bad.stderr


INDUCTOR_WORKERS = """
import json, os, sys
sys.path.insert(0, os.path.join({project!r}, "tests"))
from torch._inductor.compile_worker.subproc_pool import SubprocPool
import triton_faults_program
pool = SubprocPool(2)
try:
    results = {{str(w): pool.submit(triton_faults_program.compile_one, w).result(timeout=300) for w in (4, 8)}}
    results["after"] = pool.submit(triton_faults_program.compile_one, 2).result(timeout=300)
finally:
    pool.shutdown()
print(json.dumps(results))
"""


def test_inductors_compile_workers_compile_through_kcache_and_a_crash_kills_a_fork_not_the_worker(
        tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    """Inductor's compile workers (its SubprocPool, as torch.compile starts them) inherit kcache's
    manager: their compiles land in kcache's root, and an abort in one compile kills that compile's
    fork, not the worker: the same worker serves the next job."""
    done = subprocess.run([sys.executable, "-c", INDUCTOR_WORKERS.format(project=str(PROJECT))], capture_output=True,
                          text=True, env=faulty(tmp_path, ptxas, "abort"), cwd=str(tmp_path), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    assert results["4"].startswith("TritonCompilerCrashed") and "SIGABRT" in results["4"], results
    assert len(results["8"]) == 64 and len(results["after"]) == 64, results  # cubins' sha256
    assert fired(tmp_path / "fired"), "the abort never fired"
    entries = [name for name in os.listdir(tmp_path / "root" / "triton") if not name.startswith(".")]
    assert len(entries) >= 3  # the two groups, and the crash remembered


FORKS_OF_THE_CALLER = """
import json, os, sys
sys.path.insert(0, {project!r})
import triton
from triton.compiler import ASTSource
from stress.programs.triton_programs.compile import add_kernel
from tests.triton_faults_program import TARGET
signature = {{"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}}
def compile_add(block):
    triton.compile(ASTSource(add_kernel, signature, {{"BLOCK": block}}), target=TARGET, options={{"num_warps": 4}})
compile_add(128)  # the caller's first compile (under kcache: in a fork)
read, write = os.pipe()
child = os.fork()
if child == 0:  # as one of Helion's precompile children: a fork of the caller that compiles in place
    os.environ["KCACHE_TRITON_ISOLATION"] = "off"
    before = set(sys.modules)
    compile_add(256)
    os.write(write, json.dumps(sorted(m for m in set(sys.modules) - before if m.split(".")[0] in ("triton", "kcache"))).encode())
    os._exit(0)
os.close(write)
imported = json.loads(os.read(read, 1 << 20))
assert os.waitpid(child, 0)[1] == 0
print(json.dumps(imported))
"""


def test_a_fork_of_the_caller_imports_nothing_a_compile_needs_again(tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    """Plain Triton imports its code generator at a process's first compile, and the forks the process
    makes later (Helion's precompile children, one per config) inherit it. Under kcache that first
    compile ran in a fork, so each of them imported it again, with kcache's miss path: about 40 ms a
    fork. The caller now imports them before it forks: its forks import nothing of Triton's or kcache's."""
    program = FORKS_OF_THE_CALLER.format(project=str(PROJECT))
    for lane, extra in (("plain", {}), ("kcache", MANAGER)):
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                              env=program_env(ptxas, tmp_path / lane, **extra), cwd=str(tmp_path))
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.splitlines()[-1]) == [], lane
    assert runs(ptxas) == 4  # both compiles ran in both lanes: the kcache lane's first, in its fork
