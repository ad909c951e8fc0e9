"""Run kcache as real unprivileged users, for tests that need a real EACCES.

Root ignores permission bits, so a test that runs as root can only pretend
that a directory is unwritable; the kernel must say no to a real user. The
users are kcache-a and kcache-b (own primary groups, both in kcache-share).
A session creates those that are missing and removes them when it ends, pass
or fail (the fixture's finally, `release_users`): sessions that run at once
(pytest-xdist workers, two developers' runs) each register as a holder, and
the last holder to leave removes what test sessions created, never a user or
group that was there before (made by hand, or by a suite older than this
rule: remove those by hand once, `userdel kcache-a; userdel kcache-b;
groupdel kcache-share`). They cannot run the project's interpreter:
it lives under /root, which is 0700. So each session builds a venv from
Debian's /usr/bin/python3.11 in a world-readable directory under /tmp and
copies kcache and its pure-Python dependencies into it (no pip, no network).

    def test_x(unprivileged_env):  # the fixture comes from tests/conftest.py: one environment per run
        done = unprivileged_env.run("kcache-a", "import kcache; ...")
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import importlib.util
import os
import pwd
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = Path("/usr/bin/python3.11")
SHARE_GROUP = "kcache-share"
USERS = ("kcache-a", "kcache-b")
PROJECT_PACKAGES = ("kcache", "stress", "autotuner")
# kcache's pure-Python dependencies, copied from the running interpreter.
# Package directories only, no dist-info: importlib.metadata does not see them there.
DEPENDENCIES = ("platformdirs", "cloudpickle")
IMPORT_CHECK = "import kcache, stress.programs.synthetic, autotuner, platformdirs, cloudpickle"
# useradd under pytest-xdist: every worker runs this session fixture at once.
USER_CREATION_LOCK = Path("/tmp/kcache-test-users.lock")


@dataclass
class UnprivilegedEnv:
    python: Path
    users: dict[str, tuple[int, int]]  # name -> (uid, primary gid)
    share_gid: int
    homes: dict[str, Path]  # name -> $HOME of that user's children (0700, owned by the user)

    def run(
        self,
        user: str,
        code: str,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 120,
        extra_groups: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """`python -c code` as `user`, in an environment with nothing from root's but what `env` adds."""
        uid, gid = self.users[user]
        child_env = {"PATH": "/usr/bin:/bin", "HOME": str(self.homes[user])}
        child_env.update(env or {})
        return subprocess.run(
            [str(self.python), "-c", code],
            user=uid, group=gid, extra_groups=[self.share_gid] if extra_groups else [], umask=0o022,
            env=child_env, cwd=cwd if cwd is not None else str(self.homes[user]),
            capture_output=True, text=True, timeout=timeout,
        )


def _run_checked(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")


@contextlib.contextmanager
def _user_creation_lock() -> Iterator[None]:
    fd = os.open(USER_CREATION_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# Per user set (named by its shared group), in a directory of root's own (checked: /tmp is everyone's):
# the sessions using the users now (a file per holder: pid and start time), and what test sessions created
# (one name a line). The last holder to leave removes those, and the set's directory.
STATE = Path("/tmp/kcache-test-users")


def _state(group: str) -> Path:
    directory = STATE / group
    for checked in (STATE, directory, directory / "holders"):
        checked.mkdir(mode=0o700, exist_ok=True)
        found = os.lstat(checked)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o077:
            raise RuntimeError(f"{checked} is not a private directory of this user's: remove it")
    return directory


def holder_name(pid: int) -> str | None:
    """`pid.starttime` of a live process (the start time tells a reused pid apart), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f"{pid}.{f.read().rpartition(')')[2].split()[19]}"
    except (OSError, IndexError):
        return None


def _live_holders(state: Path) -> list[str]:
    """The holders whose process still runs; the files of those that died (a killed session) removed."""
    live = []
    for name in os.listdir(state / "holders"):
        if holder_name(int(name.split(".")[0])) == name:
            live.append(name)
        else:
            (state / "holders" / name).unlink(missing_ok=True)
    return live


def _created(state: Path) -> list[str]:
    return (state / "created").read_text().split() if (state / "created").exists() else []


def _note_created(state: Path, name: str) -> None:
    # Once each: a name listed twice (a session killed before it removed it, then made again) made the
    # last holder's userdel run twice, fail, and leave the group behind.
    (state / "created").write_text("".join(f"{n}\n" for n in dict.fromkeys([*_created(state), name])))


def acquire_users(users: tuple[str, ...] = USERS, group: str = SHARE_GROUP) -> tuple[dict[str, tuple[int, int]], int]:
    """Register this process as a holder of the set, and create its users and shared group where missing
    (noting that a test session made them). Returns {user: (uid, primary gid)} and the group's gid."""
    with _user_creation_lock():
        state = _state(group)
        holder = holder_name(os.getpid())
        assert holder is not None
        (state / "holders" / holder).touch()
        if not _group_exists(group):
            _run_checked("groupadd", "--system", group)
            _note_created(state, group)
        for user in users:
            if not _user_exists(user):
                _run_checked("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                             "-G", group, user)
                _note_created(state, user)
            elif user not in grp.getgrnam(group).gr_mem:
                _run_checked("usermod", "--append", "--groups", group, user)
    share_gid = grp.getgrnam(group).gr_gid
    found = {user: (pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid) for user in users}
    for user, (_, gid) in found.items():
        if gid == share_gid:
            raise RuntimeError(f"{user}'s primary group is {group}; the tests need it to be its own")
    return found, share_gid


def release_users(group: str = SHARE_GROUP) -> list[str]:
    """This process no longer holds the set. If no live holder remains, what test sessions created of it
    is removed: the users' processes killed, then the users, then the group. Returns what it removed."""
    removed: list[str] = []
    with _user_creation_lock():
        state = _state(group)
        holder = holder_name(os.getpid())
        if holder is not None:
            (state / "holders" / holder).unlink(missing_ok=True)
        if _live_holders(state):
            return removed
        return _remove_created(state, group)


def reclaim_users(group: str = SHARE_GROUP) -> list[str]:
    """At a session's start: what test sessions created of the set, removed if no live session holds it
    (they were all killed before their end). Returns what it removed."""
    if not (STATE / group).is_dir():
        return []
    with _user_creation_lock():
        state = _state(group)
        if _live_holders(state):
            return []
        return _remove_created(state, group)


def _remove_created(state: Path, group: str) -> list[str]:
    """What test sessions created of the set: the users' processes killed, then the users, then the
    group, each only where it still exists; then the set's directory. Under the creation lock."""
    removed: list[str] = []
    made = list(dict.fromkeys(_created(state)))
    for user in [name for name in made if name != group]:
        if not _user_exists(user):
            continue
        end_processes_of(user)  # what the test users left running (their compile services) ends with them
        _run_checked("userdel", user)  # its own primary group, which useradd made, goes with it
        removed.append(user)
    if group in made and _group_exists(group):
        _run_checked("groupdel", group)
        removed.append(group)
    shutil.rmtree(state)
    with contextlib.suppress(OSError):
        STATE.rmdir()  # where no other set is held
    return removed


def end_processes_of(user: str, within_s: float = 60.0) -> None:
    """Every process of `user` killed, and waited for until it has exited (userdel refuses a user who
    still runs one, and a SIGKILL takes a moment: a compile service's workers die after their server):
    each through a pidfd, which is readable once its process exited. An exited process that its parent
    has not reaped yet is not waited for again."""
    uid = pwd.getpwnam(user).pw_uid
    deadline = time.monotonic() + within_s
    while (pids := _running_processes_of(uid)) and time.monotonic() < deadline:
        subprocess.run(["pkill", "-KILL", "-u", user], check=False, capture_output=True)
        for pid in pids:
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
            finally:
                os.close(pidfd)


def _running_processes_of(uid: int) -> list[int]:
    """The processes whose real user is `uid` and that have not exited (no zombie)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:  # gone meanwhile
            continue
        if int(fields.get("Uid", "-1 ").split()[0]) == uid and not fields.get("State", "").strip().startswith("Z"):
            found.append(int(name))
    return found


def leftover_users() -> list[str]:
    """Users and groups that test sessions created and that remain with no session holding them (or a
    set's directory whose holders are all gone): what the session's end check (tests/conftest.py) reports."""
    if not STATE.is_dir():
        return []
    left = []
    with _user_creation_lock():
        for group in os.listdir(STATE):
            state = _state(group)
            if not _live_holders(state):
                left += [name for name in _created(state) if _user_exists(name) or _group_exists(name)]
    return left


def _installed_location(module: str) -> Path:
    """The package directory (or single .py file) of `module` in the running interpreter."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"{module} is not installed in {sys.executable}; the unprivileged venv needs it")
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin)


def _copy_into(source: Path, site_packages: Path) -> None:
    target = site_packages / source.name
    if source.is_dir():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
        shutil.copy2(source, target)


def _make_world_readable(top: Path) -> None:
    top.chmod(0o755)
    for directory, subdirectories, files in os.walk(top):
        for name in subdirectories:
            (Path(directory) / name).chmod(0o755)
        for name in files:
            path = Path(directory) / name
            if not path.is_symlink():  # the venv's bin/python links to /usr/bin
                path.chmod(0o644)


def build_venv(base: Path) -> Path:
    """A venv of Debian's Python in `base`, holding kcache, stress, autotuner and their pure-Python
    dependencies (copied, no pip, no network), and nothing else: no TileLang, no torch."""
    venv = base / "venv"
    _run_checked(str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(venv))
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    site_packages = Path(purelib)
    for package in PROJECT_PACKAGES:
        _copy_into(PROJECT / package, site_packages)
    for dependency in DEPENDENCIES:
        _copy_into(_installed_location(dependency), site_packages)
    # The users cannot write __pycache__ there: compile now, or every child recompiles everything.
    _run_checked(str(python), "-m", "compileall", "-q", str(site_packages))
    return python


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "running code as other users (for real permission errors) needs root"
    if not SYSTEM_PYTHON.exists():
        return f"{SYSTEM_PYTHON} is missing: the project's interpreter is not usable by other users"
    missing = [tool for tool in ("useradd", "groupadd", "usermod") if shutil.which(tool) is None]
    if missing:
        return f"cannot create test users: {', '.join(missing)} missing"
    return None


@pytest.fixture(scope="session")
def unprivileged_env() -> Iterator[UnprivilegedEnv]:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    started = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="kcache-unprivileged-"))
    from .reclaim import mark

    mark(base)  # a session killed outright leaves it to the next one's start (tests/reclaim.py)
    try:
        users, share_gid = acquire_users()
        python = build_venv(base)
        _make_world_readable(base)
        homes = {}
        for user, (uid, gid) in users.items():
            home = base / "home" / user
            home.mkdir(parents=True)
            home.parent.chmod(0o755)
            os.chown(home, uid, gid)
            home.chmod(0o700)
            homes[user] = home
        environment = UnprivilegedEnv(python=python, users=users, share_gid=share_gid, homes=homes)
        check = environment.run(USERS[0], IMPORT_CHECK)
        if check.returncode != 0:
            raise RuntimeError(f"the unprivileged venv cannot import kcache as {USERS[0]}:\n{check.stderr}")
        print(f"\nunprivileged venv ready in {time.monotonic() - started:.1f} s: {python}")
        yield environment
    finally:
        # What the test users left running ends with the session, whether or not the users stay (another
        # session may still hold them): these users exist for the tests alone.
        for user in USERS:
            if _user_exists(user):
                end_processes_of(user)
        release_users()
        shutil.rmtree(base)
