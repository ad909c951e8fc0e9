"""Helion's autotune picks on kcache's store (issue 57), on the CPU machine: Helion imports here but
compiles nothing without a GPU, so what is tested is what needs none: the backend as Helion loads it
(`HELION_REMOTE_CACHE_BACKEND`, its own loader and subclass check), two processes tuning one key (one
tune, the other gets its pick), a real redis-server and a real S3 server between two roots, and values
that are planted, oversized or not Helion's refused. Each process is a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("helion", reason="the Helion tests need helion (pip install -e '.[test]')")

from stress.bench.standalone.helion import KERNELS  # noqa: E402
from stress.procs import READY_WITHIN_S, line_within  # noqa: E402

from .helpers import PROJECT, child_env  # noqa: E402
from .test_triton import ptxas, remote  # noqa: E402, F401 - fixtures: counting assemblers; a real redis-server or S3 server

# A record as Helion's LocalAutotuneCache writes it: the config as its own JSON string (Config.to_json).
PICK = {"key": {"type": "LooseAutotuneCacheKey", "fields": {"kernel_source_hash": "ab12"}},
        "config": json.dumps({"block_sizes": [64, 64, 32], "num_warps": 4, "num_stages": 3}, indent=2)}

# One process's use of the backend, as Helion's RemoteAutotuneCache uses it: loaded by Helion's own loader,
# get(key) before a tune, put(key, record) after it (KT_TUNE_S: how long "tuning" takes, KT_GATE: wait for
# a line on stdin between the get and the put).
PROCESS = """
import json, os, sys, time
from helion.autotuner.remote_cache import _load_remote_backend
backend = _load_remote_backend()
key, pick = sys.argv[1], sys.argv[2]
started = time.monotonic()
found = backend.get(key)
waited = time.monotonic() - started
if found is None:
    print("tuning", flush=True)
    if os.environ.get("KT_GATE"):
        sys.stdin.readline()
    backend.put(key, pick)
print(json.dumps({"found": json.loads(found) if found else None, "tuned": found is None, "waited": waited,
                  "listed": [json.loads(value) for value in backend.list(10)]}))
"""


def helion_env(root: Path, **extra: str) -> dict[str, str]:
    return child_env(KCACHE_DIR=str(root), HELION_REMOTE_CACHE_BACKEND="kcache.helion.Backend",
                     HELION_AUTOTUNE_CACHE="RemoteAutotuneCache", **extra)


def start(env: dict[str, str], key: str = "k" * 40, pick: dict = PICK) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", PROCESS, key, json.dumps(pick)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(PROJECT))


def finish(process: subprocess.Popen[str]) -> dict:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1]) | {"stderr": err}


def test_helion_loads_the_backend_and_a_second_process_gets_the_pick_without_tuning(tmp_path: Path) -> None:
    root = tmp_path / "root"
    first = finish(start(helion_env(root)))
    assert first["tuned"] and first["found"] is None
    second = finish(start(helion_env(root)))
    assert not second["tuned"] and second["found"] == PICK and second["listed"] == [PICK]
    (entry,) = [path for path in (root / "helion").iterdir() if not path.name.startswith(".")]
    assert sorted(path.name for path in entry.iterdir()) == ["best_config.json", "kcache-helion.json", "manifest.json"]

    def kcache_cli(*argv: str) -> str:
        done = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), *argv], capture_output=True,
                              text=True, cwd=str(PROJECT), timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert json.loads(kcache_cli("--json", "stats"))["helion_picks"] == 1
    assert any(row["kind"] == "helion" and row["key"] == entry.name for row in json.loads(kcache_cli("--json", "ls")))
    kcache_cli("clear", "--all-versions")
    assert json.loads(kcache_cli("--json", "stats"))["helion_picks"] == 0


def test_helions_throwaway_triton_directory_keeps_candidates_out_of_the_root(tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    """While Helion tunes, TRITON_CACHE_DIR names its private `helion_autotune_*` directory: a candidate is
    compiled once (as Helion's precompile child compiles it), published there and not in the root, and
    found there by the next process (Helion's parent, which benchmarks it): one compile, as with Triton's
    own manager. Outside a tune the same kernel is compiled and saved in the root. A throwaway directory
    that others may write is not written."""
    from .test_triton import compile_in_fresh_process, program_env, runs, triton_entries

    root, throwaway = tmp_path / "root", tmp_path / "helion_autotune_x1"
    throwaway.mkdir(mode=0o700)
    env = {**program_env(ptxas, root, TRITON_CACHE_MANAGER="kcache.triton:CacheManager"),
           "TRITON_CACHE_DIR": str(throwaway)}
    candidate = compile_in_fresh_process("add", env)
    assert runs(ptxas) == 1 and triton_entries(root) == [] and len(triton_entries(throwaway)) == 1
    again = compile_in_fresh_process("add", env)
    assert runs(ptxas) == 1 and again["add"] == candidate["add"]
    saved = compile_in_fresh_process("add", {**env, "TRITON_CACHE_DIR": str(tmp_path / "plain")})
    assert runs(ptxas) == 2 and saved["add"] == candidate["add"] and len(triton_entries(root)) == 1
    shared = tmp_path / "helion_autotune_x2"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    compile_in_fresh_process("softmax", {**env, "TRITON_CACHE_DIR": str(shared)})
    assert runs(ptxas) == 3 and triton_entries(shared) == [] and len(triton_entries(root)) == 1


def test_tritons_modules_built_during_a_tune_are_saved_in_the_root(tmp_path: Path) -> None:
    """Triton's driver and launcher modules (`compile_module_from_src`: a lone file) built while Helion
    tunes are no candidates: every config of their signature, and the winner, load them. They are saved
    in the root, not in Helion's throwaway directory, so that a later process builds none (the driver's
    module, built during the first tune, cost each later process a C compile of about 0.4 s)."""
    from .test_triton import build_shared_object, cc_runs, counting_cc, triton_entries

    root, throwaway, counting = tmp_path / "root", tmp_path / "helion_autotune_x1", counting_cc(tmp_path / "cc")
    throwaway.mkdir(mode=0o700)
    env = {"TRITON_CACHE_MANAGER": "kcache.triton:CacheManager", "KCACHE_DIR": str(root)}
    during = build_shared_object(counting, **env, TRITON_CACHE_DIR=str(throwaway))
    assert during["answer"] == 42 and cc_runs(counting) == 1
    assert len(triton_entries(root)) == 1 and triton_entries(throwaway) == []
    later = build_shared_object(counting, **env, TRITON_CACHE_DIR=str(tmp_path / "plain"))
    assert later["answer"] == 42 and cc_runs(counting) == 1, later["stderr"]


def test_two_processes_missing_one_key_at_once_get_one_tune(tmp_path: Path) -> None:
    """The first holds the key's claim while it tunes (gated); the second waits, then loads its pick."""
    env = helion_env(tmp_path / "root")
    tuner = start({**env, "KT_GATE": "1"})
    assert line_within(tuner, READY_WITHIN_S).strip() == "tuning", tuner.stderr.read()
    waiter = start(env)
    tuner.stdin.write("go\n")
    tuner.stdin.flush()
    tuned, waited = finish(tuner), finish(waiter)
    assert tuned["tuned"] and not waited["tuned"] and waited["found"] == PICK


def test_a_pick_reaches_another_node_through_the_remote_tier(tmp_path: Path, remote: dict[str, str]) -> None:  # noqa: F811
    tuned = finish(start(helion_env(tmp_path / "node-a", **remote)))
    other = finish(start(helion_env(tmp_path / "node-b", **remote)))
    assert tuned["tuned"] and not other["tuned"] and other["found"] == PICK
    forged = finish(start(helion_env(tmp_path / "node-c", **{**remote, "KCACHE_REMOTE_SECRET": "another"})))
    assert forged["tuned"] and "ignoring remote entry" in forged["stderr"]  # signed with another secret: refused


@pytest.mark.parametrize("planted", ["not JSON", "no config", "oversized", "another key"])
def test_a_planted_or_oversized_value_is_refused_and_tuned_again(tmp_path: Path, planted: str) -> None:
    root = tmp_path / "root"
    finish(start(helion_env(root)))
    (entry,) = [path for path in (root / "helion").iterdir() if not path.name.startswith(".")]
    if planted == "another key":  # a valid entry of another key, copied under this one
        finish(start(helion_env(root), key="o" * 40))
        (other,) = [path for path in (root / "helion").iterdir() if path.name not in (".locks", entry.name)
                    and not path.name.startswith(".")]
        import shutil

        shutil.rmtree(entry)
        shutil.copytree(other, entry)
    else:
        value = {"not JSON": b"{not json", "no config": json.dumps({"key": 1, "config": {"num_warps": 4}}).encode(),
                 "oversized": json.dumps({"config": "{}", "pad": "x" * (2 << 20)}).encode()}[planted]
        from kcache.store.manifest import build_manifest

        (entry / "best_config.json").chmod(0o644)
        (entry / "best_config.json").write_bytes(value)
        (entry / "manifest.json").chmod(0o644)
        (entry / "manifest.json").unlink()
        (entry / "manifest.json").write_bytes(build_manifest(entry))  # a planter who rewrites the manifest too
    again = finish(start(helion_env(root)))
    assert again["tuned"], again  # refused, never handed to Helion: tuned again
    assert "Helion" in again["stderr"] or "quarantined" in again["stderr"], again["stderr"]


@pytest.mark.parametrize("whole", [False, True], ids=["a-record-alone", "a-whole-entry"])
def test_a_planted_record_is_skipped_with_one_warning_and_the_others_are_listed(tmp_path: Path, whole: bool) -> None:
    """Issue 68: one record `{"helion_key": 5}` made Backend.list() raise, before any trust check, and
    Helion then dropped every warm-start seed. Alone (no manifest) or as a whole entry (a manifest that
    matches), it is skipped with one warning, moved aside, and every other pick is listed."""
    import hashlib

    from kcache.store.manifest import build_manifest

    root = tmp_path / "root"
    other = {**PICK, "config": json.dumps({"block_sizes": [32], "num_warps": 8})}
    finish(start(helion_env(root)))
    finish(start(helion_env(root), key="o" * 40, pick=other))
    planted = root / "helion" / hashlib.sha256(b"planted").hexdigest()  # the newest: listed first
    planted.mkdir()
    (planted / "kcache-helion.json").write_text(json.dumps({"helion_key": 5}))
    if whole:
        (planted / "best_config.json").write_text(json.dumps(PICK))
        (planted / "manifest.json").write_bytes(build_manifest(planted))
    listed = finish(start(helion_env(root)))  # a hit, then list(10) as Helion's warm start calls it
    assert not listed["tuned"] and sorted(map(json.dumps, listed["listed"])) == sorted(map(json.dumps, [PICK, other]))
    warnings = [line for line in listed["stderr"].splitlines() if planted.name in line]
    assert len(warnings) == 1 and "Traceback" not in listed["stderr"], listed["stderr"]
    assert not planted.exists()  # moved aside: the next listing says nothing of it
    again = finish(start(helion_env(root)))
    assert len(again["listed"]) == 2 and planted.name not in again["stderr"], again["stderr"]


def test_a_value_that_is_not_a_config_record_is_never_published(tmp_path: Path) -> None:
    done = finish(start(helion_env(tmp_path / "root"), pick={"no": "config"}))
    assert done["tuned"] and "not a Helion config record" in done["stderr"], done["stderr"]
    assert not any(path for path in (tmp_path / "root" / "helion").iterdir() if not path.name.startswith("."))


# Helion's own precompile child, as Helion starts one: its entry function, in a fork, compiling a config whose
# llir stage aborts (tests/triton_faults_program.py, the config num_warps=4).
HELION_CHILD = """
import json, os, sys
sys.path.insert(0, os.path.join({project!r}, "tests"))
import triton_faults_program as faults
from helion.autotuner.precompile_future import _run_kernel_in_subprocess_fork
child = os.fork()
if child == 0:
    _run_kernel_in_subprocess_fork(lambda: print(faults.compile_one(4)), None, None, sys.argv[1], "")
_, status = os.waitpid(child, 0)
print(json.dumps({{"child": child, "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}}))
"""


def test_a_compile_in_helions_own_precompile_child_is_not_forked_again(tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    """Helion's precompile child is isolated already (a crash there is that config's failure, which Helion
    skips): kcache compiles in place there, so the abort kills Helion's child itself, not a fork of it."""
    from .test_triton import program_env

    env = {**program_env(ptxas, tmp_path / "root", TRITON_CACHE_MANAGER="kcache.triton:CacheManager"),
           "KT_FAULT": "abort", "KT_FIRED": str(tmp_path / "fired")}
    done = subprocess.run([sys.executable, "-c", HELION_CHILD.format(project=str(PROJECT)), str(tmp_path / "result")],
                          capture_output=True, text=True, env=env, cwd=str(PROJECT), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    child = json.loads(done.stdout.splitlines()[-1])
    fired = [int(pid) for pid in (tmp_path / "fired").read_text().split()]
    assert fired == [child["child"]] and child["signal"] == 6, (fired, child, done.stderr[-2000:])


@pytest.mark.parametrize("name", KERNELS)
def test_each_example_the_bench_tunes_is_helion_that_generates_triton(name: str) -> None:
    # The bench's kernels (stress.programs.helion_program) run on the GPU machine only: here, each is traced by
    # Helion and turned into Triton code for its default config, so a kernel Helion rejects fails on
    # the CPU first; its torch reference is checked to be computed for the same arguments.
    from stress.programs.helion_program import example

    kernel, args, expected, _ = example(name, device="cpu")
    bound = kernel.bind(args)
    code = bound.to_triton_code(bound.config_spec.default_config())
    assert "@triton.jit" in code and f"_helion_{name}" in code
    assert expected.shape == args[0].shape


def test_the_bench_program_draws_the_same_configs_for_the_same_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Helion's RandomSearch draws its configs as it is built, before it seeds `random` with
    # HELION_AUTOTUNE_RANDOM_SEED: the bench program seeds it first, so that both lanes of a turn tune
    # the same configs. Without the seed, the draws are the process's own.
    import random

    from stress.programs.helion_program import example, seeded_search

    kernel, args, _, _ = example("softmax", device="cpu")
    bound = kernel.bind(args)
    state = random.getstate()  # this process's, given back: the seed below is this test's
    try:
        monkeypatch.setenv("HELION_AUTOTUNE_RANDOM_SEED", "1000")
        first = [str(config) for config in seeded_search(bound, args).configs]
        random.random()
        assert [str(config) for config in seeded_search(bound, args).configs] == first and len(set(first)) == 8
        monkeypatch.delenv("HELION_AUTOTUNE_RANDOM_SEED")
        assert [str(config) for config in seeded_search(bound, args).configs] != first
    finally:
        random.setstate(state)


def test_an_example_the_bench_does_not_know_is_refused_in_one_line() -> None:
    from stress.programs.helion_program import example

    with pytest.raises(SystemExit, match="KT_KERNEL='layernorm': no such example"):
        example("layernorm", device="cpu")
