"""A user's mistake is one line on stderr that names it and the fix, with a distinct exit status, never
a traceback (issue 23): each CLI verb against bad settings, a root that is not a directory, a missing
root, bad arguments and a closed stdout, each in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import PROJECT, child_env

VERBS = [["stats"], ["ls"], ["verify"], ["show", "abcd"], ["gc"], ["prune"], ["clear"], ["tunes"], ["untune", "ab"]]
BAD_SETTINGS = {"KCACHE_MAX_SIZE": "banana", "KCACHE_COMPILE_WORKERS": "-3", "KCACHE_LOCK_TIMEOUT": "abc",
                "KCACHE_TUNE_WAIT": "soon"}


def kcache(*argv: str, env: dict[str, str] | None = None, stdout: int = subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kcache", *argv], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          env={**child_env(), **(env or {})}, cwd=str(PROJECT), timeout=120, check=False)


def assert_one_line(done: subprocess.CompletedProcess, *words: str) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


# Every verb with one bad setting (in turn), and every bad setting with `stats`: the settings are read
# in one place, so the full product would only repeat these (each case is a fresh interpreter).
SETTING_CASES = sorted({(tuple(verb), sorted(BAD_SETTINGS)[i % len(BAD_SETTINGS)]) for i, verb in enumerate(VERBS)}
                       | {(("stats",), variable) for variable in BAD_SETTINGS})


@pytest.mark.parametrize(("verb", "variable"), SETTING_CASES, ids=lambda case: case[0] if isinstance(case, tuple) else case)
def test_a_bad_setting_is_one_line_for_every_verb(tmp_path: Path, variable: str, verb: tuple[str, ...]) -> None:
    done = kcache("--dir", str(tmp_path / "root"), *verb, env={variable: BAD_SETTINGS[variable]})
    assert done.returncode == 2
    assert_one_line(done, variable, repr(BAD_SETTINGS[variable]))


@pytest.mark.parametrize("variable", sorted(BAD_SETTINGS))
def test_the_doctor_reports_a_bad_setting_as_a_finding(tmp_path: Path, variable: str) -> None:
    (tmp_path / "root").mkdir()
    done = kcache("--dir", str(tmp_path / "root"), "doctor", env={variable: BAD_SETTINGS[variable]})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert variable in done.stdout and "PROBLEM" in done.stdout


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v[0])
def test_a_root_that_is_a_file_is_named_as_such(tmp_path: Path, verb: list[str]) -> None:
    root = tmp_path / "afile"
    root.write_text("not a cache")
    done = kcache("--dir", str(root), *verb)
    assert done.returncode == 2
    assert_one_line(done, str(root), "not a directory")
    assert root.read_text() == "not a cache"


def test_the_doctor_names_a_root_that_is_a_file_and_fix_does_not_crash(tmp_path: Path) -> None:
    root = tmp_path / "afile"
    root.write_text("not a cache")
    for extra in ([], ["--fix"]):
        done = kcache("--dir", str(root), "doctor", *extra)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert "not a directory" in done.stdout
    assert root.read_text() == "not a cache"


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--max-size", "5Q", "'5Q' is not a size (examples: 10G"),
    ("--max-size", "-1G", "'-1G' is not a size (examples: 10G"),  # argparse took it for an option
    ("--max-age", "-3d", "'-3d' is not a duration (examples: 30d"),
])
def test_a_bad_size_argument_names_the_value_and_gives_examples(tmp_path: Path, option: str, value: str,
                                                                says: str) -> None:
    done = kcache("--dir", str(tmp_path), "prune", option, value)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert says in done.stderr and "parse_size" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("argv", "says"), [
    (["run", "missing.py"], "missing.py: no such file"),
    (["run", "tests"], "tests: a directory"),
    (["run", "-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
    (["run"], "name a script"),
    (["bogus"], "invalid choice: 'bogus'"),
    (["show"], "the following arguments are required: key"),
])
def test_kcache_run_and_bad_commands_are_one_line(tmp_path: Path, argv: list[str], says: str) -> None:
    done = kcache("--dir", str(tmp_path), *argv)
    assert done.returncode == 2
    assert_one_line(done, says)


def test_a_programs_own_error_under_kcache_run_keeps_its_traceback(tmp_path: Path) -> None:
    """A FileNotFoundError of the program's is no missing script: its traceback and status stay."""
    program = tmp_path / "program.py"
    program.write_text("open('/nonexistent/input.bin')\n")
    done = kcache("--dir", str(tmp_path / "root"), "run", str(program))
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "program.py" in done.stderr and "/nonexistent/input.bin" in done.stderr


def test_a_closed_stdout_ends_quietly(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`| head` that already exited) is gone
    try:
        done = kcache("--dir", str(tmp_path), "--json", "doctor", stdout=write_end)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    done = kcache("--dir", str(tmp_path), "--debug", "stats", env={"KCACHE_MAX_SIZE": "banana"})
    assert done.returncode != 0 and "Traceback" in done.stderr


TARGET_MISTAKES = [
    ("garbage-target", "unknown target kind 'garbage-target'", "nvidia/nvidia-h100"),
    ("llvm", "kcache caches CUDA kernels, and 'llvm' is not CUDA", "tilelang.compile"),
    ({"kind": "rocm"}, "'rocm' is not CUDA", '{"kind": "cuda", "arch": "sm_90a"}'),
    ("cuda -arch=sm_90a", "command-line form", '{"arch":"sm_90a","kind":"cuda"}'),
    ("nvidia/no-such-gpu", "'nvidia/no-such-gpu' is no TVM target tag", "nvidia/nvidia-h100"),
    ({"arch": "sm_90a"}, 'the dict names no "kind"', '{"arch":"sm_90a","kind":"cuda"}'),
    ({"kind": "cuda", "arch": "banana"}, "arch 'banana' is not a CUDA arch", '"sm_90a"'),
    ({"kind": "cuda", "arch": "90"}, "arch '90' is not a CUDA arch", '"sm_90a"'),
    ({"kind": "cuda", "arch": "sm_900"}, "arch 'sm_900' names compute capability 90.0, beyond any GPU's", '"sm_90a"'),
    ({"kind": "cuda", "arch": "sm_1000"}, "arch 'sm_1000' is not a CUDA arch", '"sm_90a"'),
]


@pytest.mark.parametrize(("target", "reason", "fix"), TARGET_MISTAKES, ids=[str(t[0]) for t in TARGET_MISTAKES])
def test_a_target_is_refused_for_what_it_says(target: object, reason: str, fix: str) -> None:
    """Each mistake gets its own reason, never "no GPU is visible" for a target that names its arch."""
    pytest.importorskip("tilelang", reason="the target check needs TileLang (pip install -e '.[test]')")
    import kcache
    from kcache.tilelang.target import resolve_target

    with pytest.raises(kcache.TargetError) as caught:
        resolve_target(target, "tvm_ffi")
    assert reason in caught.value.reason and fix in caught.value.fix
    assert "no GPU" not in str(caught.value)


@pytest.mark.parametrize("target", ["nvidia/nvidia-h100", {"kind": "cuda", "arch": "sm_90a"}])
def test_a_cuda_target_that_names_its_arch_resolves_without_a_gpu(target: object) -> None:
    pytest.importorskip("tilelang", reason="the target check needs TileLang (pip install -e '.[test]')")
    from kcache.tilelang.target import resolve_target

    assert '"sm_90a"' in resolve_target(target, "tvm_ffi").canonical


@pytest.mark.parametrize("arch", ["sm_80", "sm_100a", "sm_120", "sm_121"])
def test_the_archs_of_todays_gpus_pass_the_arch_check(arch: str) -> None:
    pytest.importorskip("tilelang", reason="the target check needs TileLang (pip install -e '.[test]')")
    from kcache.tilelang.target import refuse_unusable_target

    refuse_unusable_target({"kind": "cuda", "arch": arch}, {"kind": "cuda", "arch": arch})  # raises nothing


@pytest.mark.tilelang
def test_a_bad_arch_is_one_line_from_get_or_compile_before_any_compile(tmp_path: Path) -> None:
    pytest.importorskip("tilelang", reason="the target check needs TileLang (pip install -e '.[test]')")
    import kcache
    from stress.programs.kernels import elementwise_add

    cache = kcache.KernelCache(tmp_path / "root")
    with pytest.raises(kcache.TargetError) as caught:
        cache.get_or_compile(elementwise_add(1024, 256), {"kind": "cuda", "arch": "sm_900"})
    assert "\n" not in str(caught.value) and "'sm_900'" in str(caught.value) and "sm_90a" in str(caught.value)
    assert cache.stats()["compiles"] == 0 and not (tmp_path / "root" / ".logs").exists()


@pytest.mark.tilelang
@pytest.mark.parametrize("func", [lambda x: x, "add_kernel", None], ids=["function", "str", "None"])
def test_get_or_compile_names_what_it_takes(tmp_path: Path, func: object) -> None:
    pytest.importorskip("tilelang", reason="get_or_compile needs TileLang (pip install -e '.[test]')")
    import kcache
    from stress.programs.kernels import CPU_TARGET

    cache = kcache.KernelCache(tmp_path / "root")
    with pytest.raises(TypeError, match="kcache compiles a TileLang PrimFunc") as caught:
        cache.get_or_compile(func, CPU_TARGET)  # type: ignore[arg-type]
    assert type(func).__qualname__ in str(caught.value)


@pytest.mark.tilelang
def test_tuning_without_a_gpu_or_a_profiler_says_so_before_compiling_anything(tmp_path: Path) -> None:
    pytest.importorskip("tilelang", reason="tuning needs TileLang (pip install -e '.[test]')")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: the mistake this test makes is not one")
    import autotuner
    import kcache
    from stress.programs.kernels import CPU_TARGET

    from .test_tune_trials import tile_kernel

    cache = kcache.KernelCache(tmp_path / "root")
    with pytest.raises(autotuner.NoBenchmarkDevice, match="none is visible here") as caught:
        autotuner.tune(tile_kernel, [{"threads": 256}, {"threads": 128}], inputs=[], target=CPU_TARGET,
                       out_idx=[2], cache=cache, verbose=False)
    assert "profiler=" in str(caught.value)
    assert cache.stats()["compiles"] == 0 and cache.store.keys() == []
