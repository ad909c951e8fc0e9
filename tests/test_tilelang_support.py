"""The version gate (kcache/tilelang/support.py): a TileLang outside the supported range never breaks
the program. `kcache run` and kcache.install() leave TileLang as it is (its kernels are plain
TileLang's) with one warning naming the version, the range and the fix; `get_or_compile` refuses in
one line; `kcache doctor` reports it and exits non-zero. The range is the pin of pyproject.toml."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kcache.tilelang import support

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("version", "supported"), [
    ("0.1.15", True), ("0.1.15+cu130.git1a2b3c", True), ("0.1.16.dev0", True), ("0.1.99", True),
    ("0.1.14", False), ("0.1.13", False), ("0.0.9", False), ("0.2.0", False), ("1.0", False), ("nightly", False),
])
def test_the_supported_range(version: str, supported: bool) -> None:
    assert support.version_supported(version) is supported


def test_the_pin_is_the_supported_range() -> None:
    """pyproject.toml's requirement on TileLang, the gate's range and its fix say the same."""
    pins = re.findall(r'"tilelang([<>=!~][^"]*)"', (REPO / "pyproject.toml").read_text())
    assert pins == [support.SUPPORTED]
    assert support.FIX == f"pip install 'tilelang{support.SUPPORTED}'"


def fake_distribution(where: Path, version: str) -> Path:
    """A directory that, first on the path, makes the package metadata say TileLang `version`."""
    info = where / f"tilelang-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tilelang\nVersion: {version}\n")
    return where


@pytest.mark.parametrize("version", ["0.1.13", "0.2.0"])
def test_doctor_reports_an_unsupported_tilelang(tmp_path: Path, version: str) -> None:
    fake = fake_distribution(tmp_path / "site", version)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(REPO)])}
    (tmp_path / "root").mkdir(mode=0o700)  # doctor on a missing root says only that (the CLI's contract)
    done = subprocess.run([sys.executable, "-m", "kcache", "doctor", "--dir", str(tmp_path / "root")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "tilelang version" in line]
    assert len(lines) == 1 and lines[0].startswith("PROBLEM"), done.stdout
    assert f"TileLang {version} is installed" in lines[0]  # the fake took effect
    assert f"supports TileLang {support.SUPPORTED}" in lines[0] and f"fix: {support.FIX}" in lines[0]
    assert "Traceback" not in done.stderr


def test_doctor_is_content_with_the_installed_tilelang(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir(mode=0o700)
    done = subprocess.run([sys.executable, "-m", "kcache", "doctor", "--dir", str(tmp_path / "root"), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    found = [finding for finding in json.loads(done.stdout) if finding["check"] == "tilelang version"]
    assert found and not found[0]["problem"], found
    assert support.SUPPORTED in found[0]["detail"]


PROGRAM = '''
import hashlib, json, sys
import tilelang
import tilelang.language as T

N = 4096

@T.prim_func
def gate_add(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32"), C: T.Tensor((N,), "float32")):
    with T.Kernel(N // 256, threads=256) as bx:
        for i in T.Parallel(256):
            C[bx * 256 + i] = A[bx * 256 + i] * 2.0 + B[bx * 256 + i]

tilelang.disable_cache()
kernel = tilelang.compile(gate_add, out_idx=[2], target={"kind": "cuda", "arch": "sm_90a"})
row = {"device": hashlib.sha256(kernel.get_kernel_source().encode()).hexdigest(),
       "host": hashlib.sha256(kernel.get_host_source().encode()).hexdigest()}
if "kcache" in sys.modules:
    import importlib
    import kcache
    kcache.install()  # the program's own call: no second warning
    from tilelang.cache import cached
    row["tilelang_untouched"] = importlib.import_module("tilelang.jit").cached is cached
    row["installed"] = kcache.is_installed()
    try:
        kcache.get_or_compile(gate_add, {"kind": "cuda", "arch": "sm_90a"}, out_idx=[2])
        row["get_or_compile"] = "served"
    except kcache.TileLangUnsupported as err:
        row["get_or_compile"] = str(err)
    import os
    row["triton_before"] = os.environ.get("TRITON_CACHE_MANAGER")  # Triton's route does not need TileLang
    kcache.uninstall()
    row["triton_after"] = os.environ.get("TRITON_CACHE_MANAGER")
print("ROW " + json.dumps(row))
'''

# `kcache run PROGRAM`, in a process whose TileLang says it is 0.1.13 (set before kcache looks).
RUN_UNDER_OLD_VERSION = '''
import sys
import tilelang
tilelang.__version__ = "0.1.13"
from kcache.cli.main import main
sys.exit(main(["run", sys.argv[1]]))
'''


def _row(stdout: str) -> dict:
    rows = [json.loads(line[4:]) for line in stdout.splitlines() if line.startswith("ROW ")]
    assert len(rows) == 1, stdout
    return rows[0]


@pytest.mark.tilelang
def test_kcache_run_passes_an_unsupported_tilelang_through(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(PROGRAM))
    env = {**os.environ, "KCACHE_DIR": str(tmp_path / "root"), "KCACHE_COMPILE_ISOLATION": "inprocess"}
    plain = subprocess.run([sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    run = subprocess.run([sys.executable, "-c", RUN_UNDER_OLD_VERSION, str(program)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    row = _row(run.stdout)
    # TileLang's kernel, from TileLang unpatched; nothing of kcache's compiled or stored.
    assert {key: row[key] for key in ("device", "host")} == _row(plain.stdout)
    assert row["tilelang_untouched"] and not row["installed"]
    assert not (tmp_path / "root" / "kernels").exists() or not os.listdir(tmp_path / "root" / "kernels")
    warnings = [line for line in run.stderr.splitlines() if line.startswith("kcache:")]
    assert len(warnings) == 1, run.stderr  # kcache run's install and the program's own: one warning
    assert "TileLang 0.1.13 is installed" in warnings[0]  # the fake version took effect
    assert f"supports TileLang {support.SUPPORTED}" in warnings[0] and support.FIX in warnings[0]
    assert "Traceback" not in run.stderr
    message = row["get_or_compile"]
    assert "\n" not in message and "TileLang 0.1.13" in message and support.FIX in message
    # Triton's kernels went through kcache all the same; the setting is `kcache run`'s, which the program's
    # uninstall() leaves (docs/operations.md: uninstall() removes what install() set).
    assert row["triton_before"] == row["triton_after"] == "kcache_triton_manager:CacheManager", row


# The program alone, its TileLang saying 0.1.13, kcache imported before it runs (no `kcache run`).
INSTALL_UNDER_OLD_VERSION = '''
import runpy, sys
import tilelang
tilelang.__version__ = "0.1.13"
import kcache
runpy.run_path(sys.argv[1], run_name="__main__")
'''


@pytest.mark.tilelang
def test_uninstall_after_a_pass_through_install_gives_triton_its_own_cache_back(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(PROGRAM))
    env = {key: value for key, value in os.environ.items() if key != "TRITON_CACHE_MANAGER"}
    done = subprocess.run([sys.executable, "-c", INSTALL_UNDER_OLD_VERSION, str(program)], cwd=REPO,
                          env={**env, "KCACHE_DIR": str(tmp_path / "root"), "KCACHE_COMPILE_ISOLATION": "inprocess"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    row = _row(done.stdout)
    assert not row["installed"] and "TileLang 0.1.13" in row["get_or_compile"], row  # the fake took effect
    assert row["triton_before"] and row["triton_after"] is None, row
