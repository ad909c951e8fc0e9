"""Every KCACHE_* setting is checked before anything runs (issue 68), by the one check the CLI makes
(kcache.setting_values.check_settings): `kcache run` refuses a bad value in one line with exit status 2
before the program's first line, in both its forms (the fast entry and the full command line), and
`kcache.install()` raises SettingError naming the variable before it changes anything. `kcache config`
shows the same verdict for each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kcache
from kcache.setting_values import SETTING_CHECKS

from .helpers import PROJECT, child_env

# A value each checked setting refuses. Every setting with a check has one here (the first test says so).
BAD_VALUES = {
    "KCACHE_LOCK_TIMEOUT": "soon", "KCACHE_TUNE_WAIT": "later", "KCACHE_STAGING_TTL": "1 hour",
    "KCACHE_GC_INTERVAL": "often", "KCACHE_MAX_SIZE": "10X", "KCACHE_MAX_AGE": "old", "KCACHE_REMOTE": "http://cache:80",
    "KCACHE_REMOTE_TTL": "forever", "KCACHE_REMOTE_MAX_ENTRY": "big", "KCACHE_REMOTE_LEASE": "30x",
    "KCACHE_JIT_GUARD": "strict", "KCACHE_READONLY": "maybe", "KCACHE_ON_UNWRITABLE": "ignore", "KCACHE_UMASK": "8",
    "KCACHE_GROUP": "no-such-group-kcache-test", "KCACHE_TILELANG": "sure", "KCACHE_COMPILE_ISOLATION": "fork",
    "KCACHE_SERVER_IDLE": "idle", "KCACHE_CALLER_FORK": "perhaps", "KCACHE_COMPILE_MEMORY": "lots",
    "KCACHE_COMPILE_WORKERS": "0", "KCACHE_COMPILE_TIMEOUT": "10 minutes", "KCACHE_DEBUG": "verbose",
    "KCACHE_TRITON_ISOLATION": "forkk", "KCACHE_LOG": "loud",
}
PROGRAM = "open({marker!r}, 'w').write('the program ran')\n"


def test_every_checked_setting_has_a_bad_value_here() -> None:
    assert set(BAD_VALUES) == {name for name, check in SETTING_CHECKS.items() if check is not None}


def clean_env(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in child_env().items() if not name.startswith("KCACHE_")}
    return {**env, **extra}


@pytest.mark.parametrize("variable", sorted(BAD_VALUES))
def test_kcache_run_refuses_a_bad_setting_before_the_program_runs(tmp_path: Path, variable: str) -> None:
    marker = tmp_path / "ran"
    program = tmp_path / "program.py"
    program.write_text(PROGRAM.format(marker=str(marker)))
    value = BAD_VALUES[variable]
    # The fast entry (`kcache run SCRIPT`) and the full command line (`kcache --dir ROOT run SCRIPT`).
    for argv in (["run", str(program)], ["--dir", str(tmp_path / "root"), "run", str(program)]):
        done = subprocess.run([sys.executable, "-m", "kcache", *argv], capture_output=True, text=True,
                              env=clean_env(KCACHE_DIR=str(tmp_path / "root"), **{variable: value}),
                              cwd=str(tmp_path), timeout=120, check=False)
        assert done.returncode == 2 and done.stdout == "", (argv, done.stdout, done.stderr)
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"kcache: {variable}=") and repr(value) in line, line
        assert not marker.exists()  # not a line of the program ran
    assert not (tmp_path / "root").exists()  # nor did kcache create anything


@pytest.mark.parametrize("variable", sorted(BAD_VALUES))
def test_install_raises_a_setting_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                            variable: str) -> None:
    for name in [name for name in os.environ if name.startswith(("KCACHE_", "TRITON_CACHE_MANAGER", "HELION_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "root"))
    monkeypatch.setenv(variable, BAD_VALUES[variable])
    with pytest.raises(kcache.SettingError) as raised:
        kcache.install()
    assert raised.value.setting == variable and str(raised.value).startswith(f"{variable}="), raised.value
    assert isinstance(raised.value, ValueError)  # what a caller catching a bad value already catches
    assert "TRITON_CACHE_MANAGER" not in os.environ and not kcache.is_installed()  # nothing was changed
    assert not (tmp_path / "root").exists()


def test_config_shows_the_same_verdict_for_each(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kcache", "--json", "config"], capture_output=True, text=True,
                          env=clean_env(KCACHE_DIR=str(tmp_path), **BAD_VALUES), cwd=str(PROJECT), timeout=120,
                          check=False)
    assert done.returncode == 1, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)["settings"]}
    assert {name for name, row in rows.items() if row["problem"]} == set(BAD_VALUES)
    for name in BAD_VALUES:
        assert rows[name]["problem"].startswith(f"{name}="), rows[name]
