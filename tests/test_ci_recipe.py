"""docs/operations.md's CI cache recipe ("A CI cache owned by another uid") run as written, by two real
users (issue 68): root fills the cache, kcache-a's job uses it. With the root made readable as step 1
says, the other uid's job loads the known kernel without a compile and compiles a new one into its own
root with one warning; `kcache stats` works there and `kcache doctor` exits 1 with its PROBLEM. With step 1
skipped (kcache made the root, 0700), the job says in one warning that it cannot read it, with the
fix, and compiles into its own root; `kcache stats` and `kcache doctor` say so and exit 1. `kcache config`
and `kcache doctor` there never print the Redis password of the job's KCACHE_REMOTE."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

from .faults import needs_root  # noqa: E402
from .helpers import child_env  # noqa: E402
from .redis_server import redis_server  # noqa: E402
from .test_security import world_dir  # noqa: E402, F401 - a fixture
from .test_triton import MANAGER, compile_in_fresh_process, counting_assemblers, triton_users, users_running_triton  # noqa: E402, F401
from .unprivileged import UnprivilegedEnv  # noqa: E402

pytestmark = needs_root

KCACHE = "import runpy, sys\nsys.argv = ['kcache', *{argv!r}]\nrunpy.run_module('kcache', run_name='__main__')\n"
PASSWORD = "ci-R3dis-pass"


def fill(ci: Path, counting: Path, users_triton: Path) -> dict[str, str]:
    """Root's nightly job, steps 2 and 3: the add kernel compiled into the shared root. The jobs' environment."""
    env = {"KCACHE_DIR": str(ci / "kcache"), **MANAGER, **counting_assemblers(counting, users_triton)}
    filled = compile_in_fresh_process("add", child_env(**env))
    assert "add" in filled and "Traceback" not in filled["stderr"], filled["stderr"]
    (counting / "runs").write_text("")
    return env


def kcache_as(users: UnprivilegedEnv, user: str, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return users.run(user, KCACHE.format(argv=list(argv)), env=env)


def test_the_ci_recipe_as_written_with_two_users(triton_users: tuple[UnprivilegedEnv, Path],  # noqa: F811
                                                 world_dir: Path) -> None:  # noqa: F811
    users, counting, as_user = users_running_triton(triton_users, world_dir)
    ci = world_dir / "ci-cache"
    ci.mkdir(mode=0o755)
    subprocess.run(["mkdir", "-p", "-m", "0755", str(ci / "kcache")], check=True)  # step 1, as written
    env = fill(ci, counting, triton_users[1])

    def runs() -> int:
        return len((counting / "runs").read_text().splitlines())

    known, said = as_user("kcache-a", "add", env)  # step 4: another uid's job
    assert "add" in known and runs() == 0, said  # loaded from the shared root: no compile
    new, said = as_user("kcache-a", "softmax", env)
    assert "softmax" in new and runs() == 1
    warnings = [line for line in said.splitlines() if line.startswith("kcache:")]
    assert len(warnings) == 1 and "is not writable by this process" in warnings[0], said
    assert "Reading its hits, and saving new kernels in" in warnings[0] and "corrupt" not in said, said
    again, _ = as_user("kcache-a", "softmax", env)
    assert again == new and runs() == 1  # the job's next process: a hit in its own root

    stats = kcache_as(users, "kcache-a", "stats", env=env)
    assert stats.returncode == 0 and "Triton" in stats.stdout, stats.stderr
    doctor = kcache_as(users, "kcache-a", "doctor", env=env)
    problems = [line for line in doctor.stdout.splitlines() if line.startswith("PROBLEM")]
    assert any(" writable " in line for line in problems), doctor.stdout
    assert doctor.returncode == 1, doctor.stdout  # it printed a problem: exit status 1, never 0


def test_the_ci_recipe_without_its_first_step_says_why_and_how(triton_users: tuple[UnprivilegedEnv, Path],  # noqa: F811
                                                               world_dir: Path) -> None:  # noqa: F811
    users, counting, as_user = users_running_triton(triton_users, world_dir)
    ci = world_dir / "ci-cache"
    ci.mkdir(mode=0o755)
    env = fill(ci, counting, triton_users[1])  # kcache creates the root: 0700
    root = ci / "kcache"
    assert root.stat().st_mode & 0o777 == 0o700

    new, said = as_user("kcache-a", "add", env)
    assert "add" in new and runs_of(counting) == 1  # nothing of the root could be read: compiled, once
    warnings = [line for line in said.splitlines() if line.startswith("kcache:")]
    assert len(warnings) == 1, said  # one warning, no "corrupt" entry
    (warning,) = warnings
    assert "you cannot read it" in warning and "mode drwx------" in warning and f"chmod 0755 {root}" in warning
    assert "does not exist" not in warning and "Reading its hits" not in warning, warning
    again, said = as_user("kcache-a", "add", env)
    assert again == new and runs_of(counting) == 1, said  # its own root serves the next process

    with redis_server(world_dir, ("ci", PASSWORD)) as (url, _server):
        remote = {**env, "KCACHE_REMOTE": url}
        for command, status in ((["stats"], 1), (["doctor"], 1), (["config"], 0)):
            done = kcache_as(users, "kcache-a", *command, env=remote)
            assert done.returncode == status, (command, done.stdout, done.stderr)
            assert PASSWORD not in done.stdout + done.stderr, command
            assert "Traceback" not in done.stderr and "Errno" not in done.stdout + done.stderr, done.stderr
        stats = kcache_as(users, "kcache-a", "stats", env=remote)
        (line,) = stats.stderr.splitlines()
        assert line.startswith(f"kcache: cannot read the kcache root {root}: you cannot read it") and "chmod 0755" in line
        doctor = json.loads(kcache_as(users, "kcache-a", "--json", "doctor", env=remote).stdout)
        (finding,) = [f for f in doctor if f["check"] == "root"]
        assert finding["problem"] and f"chmod 0755 {root}" in finding["fix"], finding
        config = kcache_as(users, "kcache-a", "config", env=remote).stdout
        assert "redis://ci:***@127.0.0.1" in config, config


def runs_of(counting: Path) -> int:
    return len((counting / "runs").read_text().splitlines())
