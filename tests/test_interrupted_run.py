"""A test run cut short leaves the machine as it found it (issue 68). A real pytest session of the suite's
own fixtures (tests/conftest.py as a plugin) holds what the suite makes: the test users and group, the
unprivileged venv, a tmpfs mount, its runtime directory of compile services. Stopped by SIGTERM (a CI
timeout) or SIGINT, it removes them itself; killed outright (SIGKILL), the next session's start does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .faults import needs_root
from .leftovers import mounts_under
from .unprivileged import SHARE_GROUP, STATE, USERS, _skip_reason

pytestmark = needs_root

# The session that is cut short: it holds everything, says where, and waits for its signal (no sleep).
HOLDER = """
import os, sys
from tests.faults import tmpfs

def test_holds_the_machine(unprivileged_env, tmp_path):
    with tmpfs(tmp_path / "mounted"):
        print("HOLDING", unprivileged_env.python.parent.parent.parent, tmp_path / "mounted",
              os.environ["XDG_RUNTIME_DIR"], flush=True)
        sys.stdin.readline()
"""


def session(tmp_path: Path, test: str) -> subprocess.Popen[str]:
    (tmp_path / "test_holder.py").write_text(test)
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "tests.conftest",
                             "--rootdir", str(tmp_path), str(tmp_path / "test_holder.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=str(Path(__file__).resolve().parent.parent), start_new_session=True)


def holding(child: subprocess.Popen[str]) -> tuple[Path, str, Path]:
    """The venv's directory, the mount point and the runtime directory the session holds, once it does."""
    assert child.stdout is not None
    seen = []
    for line in child.stdout:
        seen.append(line)
        if line.startswith("HOLDING "):
            venv, mounted, runtime = line.split()[1:]
            return Path(venv), mounted, Path(runtime)
    raise AssertionError(f"the session ended before it held anything (rc {child.wait()}):\n{''.join(seen)}")


def users_left_unheld(holder: str) -> list[str]:
    """The test users and group that remain with no live session holding them, and whether the dead
    session is still listed as a holder."""
    holders = STATE / SHARE_GROUP / "holders"
    listed = os.listdir(holders) if holders.is_dir() else []
    assert not [name for name in listed if name.startswith(f"{holder}.")], listed
    if listed:  # another session (this one's, where a test holds the users) keeps them, rightly
        return []
    return [name for name in (*USERS, SHARE_GROUP)
            if subprocess.run(["getent", "passwd" if name in USERS else "group", name], capture_output=True).returncode == 0]


def gone(venv: Path, mounted: str, runtime: Path) -> None:
    assert not venv.exists(), f"{venv} was left"
    assert not mounts_under(Path(mounted)), f"{mounted} is still mounted"
    assert not runtime.exists(), f"{runtime} was left"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_run_stopped_by_a_signal_removes_what_it_made(tmp_path: Path, stop: signal.Signals) -> None:
    if _skip_reason():
        pytest.skip(_skip_reason())
    child = session(tmp_path, HOLDER)
    venv, mounted, runtime = holding(child)
    assert venv.is_dir() and mounts_under(Path(mounted)) and runtime.is_dir()  # held, for real
    child.send_signal(stop)
    output, _ = child.communicate(timeout=120)
    assert child.returncode == pytest.ExitCode.INTERRUPTED, output[-3000:]
    assert "left the machine changed" not in output and "Error" not in output, output[-3000:]
    gone(venv, mounted, runtime)
    assert users_left_unheld(str(child.pid)) == []


def test_a_run_killed_outright_is_cleaned_up_by_the_next_ones_start(tmp_path: Path) -> None:
    if _skip_reason():
        pytest.skip(_skip_reason())
    (tmp_path / "killed").mkdir()
    child = session(tmp_path / "killed", HOLDER)
    venv, mounted, runtime = holding(child)
    os.killpg(child.pid, signal.SIGKILL)  # the session and whatever it started: nothing runs its teardown
    child.communicate(timeout=60)
    assert venv.is_dir() and mounts_under(Path(mounted)) and runtime.is_dir()  # left behind, as by a CI kill
    (tmp_path / "next").mkdir()
    following = session(tmp_path / "next", "def test_nothing():\n    pass\n")
    output, _ = following.communicate(timeout=300)
    assert following.returncode == 0, output[-3000:]
    assert "reclaimed what killed test sessions left" in output, output[-3000:]
    gone(venv, mounted, runtime)
    assert users_left_unheld(str(child.pid)) == []
