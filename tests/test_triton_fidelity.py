"""A Triton compile under kcache is plain Triton's, byte for byte (issue 67): the front half in the
caller, the back half in a worker of the compile service or, at a cold start, a fork of the caller.

tests/triton_fidelity_program.py compiles a corpus of kernels as real libraries write them (blocked and
TMA matmuls on wgmma, fp8, an Inductor-style fused reduction, a Gluon kernel, a kernel that reads its
num_warps) in several configs, in a fresh process each way; every file of every group is compared. In
the service's lane every config is compiled at once, as a tune's compile-ahead compiles them, so configs
whose IR is the same share one front half (kcache.triton.shared_fronts): counted, and still plain
Triton's, byte for byte. The one known difference is cosmetic: MLIR's text does not carry block
arguments' names, so a kernel with a loop has its IR texts name the loop's values `%arg12` where
Triton's in-process text says `%k` (docs/design/triton.md): its `.ttir` with Triton 3.6, and from
Triton 3.7 on, where the names reach them, its `.ttgir` and `.llir` too. The
cubin, the PTX, the source IR and the metadata are the same, always."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

from .helpers import PROJECT  # noqa: E402
from .test_triton import MANAGER, program_env, ptxas  # noqa: E402, F401 - a fixture

# The kernels whose TTIR has a loop (their block arguments lose their names in the text between halves).
LOOPING = ("matmul", "tma_matmul", "fp8_matmul")


def compiled(env: dict[str, str]) -> tuple[dict[str, dict[str, str]], dict[str, int], str]:
    """Every file's sha256 of every kernel and config; each kernel's front halves made; the stderr."""
    done = subprocess.run([sys.executable, "-m", "tests.triton_fidelity_program"], capture_output=True, text=True,
                          env=env, cwd=str(PROJECT), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    return found["files"], found["fronts"], done.stderr


@pytest.mark.parametrize("lane", ["service", "cold start"])
def test_every_file_of_every_group_is_plain_tritons(tmp_path: Path, ptxas: Path, lane: str,  # noqa: F811
                                                    runtime: Path) -> None:
    plain, plain_fronts, _ = compiled(program_env(ptxas, tmp_path / "plain-root"))
    # "service": every config at once, from threads, as a tune's compile-ahead (their front halves shared
    # where their IR is the same), each back half in the service's workers; "cold start": one after
    # another, the first in a fork of the caller (no service runs yet, one thread), the later ones
    # wherever the client sends them.
    lanes = {"service": {"KCACHE_CALLER_FORK": "0", "KT_AT_ONCE": "1"}, "cold start": {"KCACHE_CALLER_FORK": "1"}}
    ours, fronts, log = compiled(program_env(ptxas, tmp_path / "root", KCACHE_LOG="info", **lanes[lane], **MANAGER))
    assert log.count("(in a worker)") == len(plain), log[-3000:]  # each compiled away from the program
    assert set(ours) == set(plain)
    for label, files in plain.items():
        assert set(ours[label]) == set(files), label
        differing = {ext for ext in files if ours[label][ext] != files[ext]}
        expected = {"ttir", "ttgir", "llir"} if label.split()[0] in LOOPING else set()
        assert differing <= expected, (label, differing)
        assert {"cubin", "json", "ptx", "source"} <= set(files) - differing, label
    assert ours["warps w4"]["cubin"] != ours["warps w8"]["cubin"]  # the kernel that reads num_warps
    assert plain_fronts["matmul_kernel"] == plain_fronts["warps_kernel"] == 2  # one a config, in plain Triton
    if lane == "service":  # configs that differ only in what the front half does not read share it
        assert (fronts["add_kernel"], fronts["softmax_kernel"], fronts["matmul_kernel"]) == (1, 1, 1), fronts
        assert fronts["warps_kernel"] == 2 and fronts["tma_matmul_kernel"] == 3, fronts
    else:  # outside a tune's compile-ahead: one a config, as Triton makes them
        assert fronts == plain_fronts


# A program that compiles two loop-free kernels (their dumps are the same text both ways).
PRINTING = """
import triton
from triton.compiler import ASTSource
from stress.programs.triton_programs.compile import KERNELS, TARGET
for name in ("add", "softmax"):
    fn, signature, constexprs = KERNELS[name]
    triton.compile(ASTSource(fn, signature, constexprs), target=TARGET)
"""
# What Triton's users ask its stages to print: ptxas's report on stdout, MLIR's passes on stderr.
DUMPS = {"TRITON_DUMP_PTXAS_LOG": "1", "MLIR_ENABLE_DUMP": "1"}


def printed(env: dict[str, str]) -> tuple[list[str], list[str], str]:
    """The program's stdout lines, less ptxas's timings; its stderr lines, less kcache's log; its stderr."""
    done = subprocess.run([sys.executable, "-c", PRINTING], capture_output=True, text=True, env=env,
                          cwd=str(PROJECT), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = [line for line in done.stdout.splitlines() if "Compile time" not in line]
    return out, [line for line in done.stderr.splitlines() if not line.startswith("kcache")], done.stderr


@pytest.mark.parametrize("lane", ["service", "cold start"])
def test_what_a_compile_prints_reaches_the_program_as_plain_tritons(
        tmp_path: Path, ptxas: Path, lane: str, runtime: Path) -> None:  # noqa: F811 - ptxas, a fixture
    """Triton's stages print in the worker; the caller prints it, each stream on its own."""
    plain_out, plain_err, _ = printed(program_env(ptxas, tmp_path / "plain-root", **DUMPS))
    assert sum("ptxas info" in line for line in plain_out) >= 8  # the dumps fired, in plain Triton
    assert sum("IR Dump Before" in line for line in plain_err) >= 20
    fork = {"KCACHE_CALLER_FORK": "0"} if lane == "service" else {"KCACHE_CALLER_FORK": "1"}
    out, err, log = printed(program_env(ptxas, tmp_path / "root", KCACHE_LOG="info", **fork, **MANAGER, **DUMPS))
    assert log.count("(in a worker)") == 2, log[-3000:]  # compiled away from the program
    assert (out, err) == (plain_out, plain_err)
