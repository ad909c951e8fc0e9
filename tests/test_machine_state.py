"""Tests leave the machine as they found it (issue 58): the users and the group that the tests create
(tests/unprivileged.py) are removed by the last session holding them, pass or fail, also after a session
that was killed; a user that was there before is never removed; and what remains is what the session's
end check (tests/conftest.py) reports. Real users, real processes as the sessions."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from .helpers import PROJECT
from .unprivileged import STATE, leftover_users

GROUP = "kcache-lc-share"
MADE = "kcache-lc-a"  # made by the sessions
BEFORE = "kcache-lc-pre"  # there before them

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="creating and removing users needs root and useradd")

# A session: holds the users until told to release them, a line on stdin (a handshake, not a sleep).
SESSION = f"""
import sys
sys.path.insert(0, {str(PROJECT)!r})
from tests.unprivileged import acquire_users, release_users
acquire_users(tuple(sys.argv[1:]), {GROUP!r})
print("holding", flush=True)
if sys.stdin.readline().strip() == "release":
    print("removed", *release_users({GROUP!r}), flush=True)
"""


def exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        import grp

        try:
            grp.getgrnam(name)
        except KeyError:
            return False
    return True


class Session:
    def __init__(self, *users: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", SESSION, *users], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        assert line == "holding", line + self.process.stderr.read()  # type: ignore[union-attr]

    def release(self) -> list[str]:
        out, err = self.process.communicate("release\n", timeout=120)
        assert self.process.returncode == 0, err
        return out.split()[1:]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.communicate(timeout=60)


@pytest.fixture
def clean_names() -> Iterator[None]:
    """None of the test's names exist before; whatever of them exists after is removed, pass or fail."""
    assert not any(exists(name) for name in (MADE, BEFORE, GROUP)), "remove kcache-lc-* by hand (userdel, groupdel)"
    yield
    for user in (MADE, BEFORE):
        if exists(user):
            subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
            subprocess.run(["userdel", user], capture_output=True)
    if exists(GROUP):
        subprocess.run(["groupdel", GROUP], capture_output=True)
    shutil.rmtree(STATE / GROUP, ignore_errors=True)


def test_the_last_session_holding_the_test_users_removes_what_sessions_made_and_nothing_else(
        clean_names: None) -> None:
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", BEFORE], check=True)
    first = Session(MADE, BEFORE)
    assert exists(MADE) and exists(GROUP)
    assert Session(MADE, BEFORE).release() == []  # the first still holds them
    Session(MADE, BEFORE).kill()  # a killed session holds nothing
    assert exists(MADE) and leftover_users() == []  # held: nothing is left over yet
    assert sorted(first.release()) == sorted([MADE, GROUP])
    assert not exists(MADE) and not exists(GROUP) and exists(BEFORE)  # the one there before stays
    assert not (STATE / GROUP).exists() and leftover_users() == []


def test_users_of_a_killed_last_session_are_reported_then_removed_by_the_next(clean_names: None) -> None:
    Session(MADE).kill()
    assert exists(MADE) and sorted(leftover_users()) == sorted([MADE, GROUP])  # the end check would fail
    assert sorted(Session(MADE).release()) == sorted([MADE, GROUP])
    assert not exists(MADE) and leftover_users() == []
