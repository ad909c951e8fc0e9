"""Run kcache as real unprivileged users, for tests that need a real EACCES.

Root ignores permission bits, so a test that runs as root can only pretend
that a directory is unwritable; the kernel must say no to a real user. The
users are kcache-a and kcache-b (own primary groups, both in kcache-share),
created once and left in place. They cannot run the project's interpreter:
it lives under /root, which is 0700. So each session builds a venv from
Debian's /usr/bin/python3.11 in a world-readable directory under /tmp and
copies kcache and its pure-Python dependencies into it (no pip, no network).

    from .unprivileged import unprivileged_env  # noqa: F401

    def test_x(unprivileged_env):
        done = unprivileged_env.run("kcache-a", "import kcache; ...")
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import importlib.util
import os
import pwd
import shutil
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
IMPORT_CHECK = "import kcache, stress.synthetic, autotuner, platformdirs, cloudpickle"
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


def _ensure_users() -> tuple[dict[str, tuple[int, int]], int]:
    """The users and the shared group, created where missing (they outlive the session: harmless)."""
    with _user_creation_lock():
        if not _group_exists(SHARE_GROUP):
            _run_checked("groupadd", "--system", SHARE_GROUP)
        for user in USERS:
            if not _user_exists(user):
                _run_checked("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                             "-G", SHARE_GROUP, user)
            elif user not in grp.getgrnam(SHARE_GROUP).gr_mem:
                _run_checked("usermod", "--append", "--groups", SHARE_GROUP, user)
    share_gid = grp.getgrnam(SHARE_GROUP).gr_gid
    users = {user: (pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid) for user in USERS}
    for user, (_, gid) in users.items():
        if gid == share_gid:
            raise RuntimeError(f"{user}'s primary group is {SHARE_GROUP}; the tests need it to be its own")
    return users, share_gid


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
    users, share_gid = _ensure_users()
    base = Path(tempfile.mkdtemp(prefix="kcache-unprivileged-"))
    try:
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
        # What the test users left running (their compile services, started by default, idle for
        # minutes) ends with the session: these users exist for the tests alone.
        for user in users:
            subprocess.run(["pkill", "-KILL", "-u", user], check=False, capture_output=True)
        shutil.rmtree(base)
