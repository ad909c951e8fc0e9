"""The second security review's local findings (issue 36), with real users: record files, the
service's runtime directory, and the service's in-flight merge. (Leases: test_security_remote.py;
bundles: test_security_bundles.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import kcache
from kcache.cache import deployment
from kcache.compile.runtime_dir import host_tag
from kcache.compile.service.address import MAX_SOCKET_PATH
from stress.programs import synthetic

from .faults import needs_root
from .helpers import child_env
from .test_security import shared_dir, victims_files, world_dir  # noqa: F401 - a fixture
from .unprivileged import UnprivilegedEnv

PROJECT = Path(__file__).resolve().parent.parent
TEAM_GID, OTHER_UID = 4242, 4243  # a group and a user this machine need not have: root gives files to ids

RECORD_AS_VICTIM = """
import kcache
from stress.programs import synthetic
cache = kcache.KernelCache({root!r}, backend=synthetic)
cache.get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
"""


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """record() is process-wide: each test starts from the environment's (unset) choice."""
    monkeypatch.setattr(deployment, "_recorder", None)
    monkeypatch.setattr(deployment, "_recorder_from_env", False)
    monkeypatch.delenv("KCACHE_RECORD", raising=False)
    yield
    kcache.record(None)


def record_one(tmp_path: Path, keys_file: Path) -> None:
    kcache.record(keys_file)
    kcache.KernelCache(tmp_path / "root", backend=synthetic).get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")


# ---------------------------------------------------------------- record files


@needs_root
def test_a_link_planted_at_the_record_path_is_never_written_through(
    unprivileged_env: UnprivilegedEnv, world_dir: Path  # noqa: F811
) -> None:
    """A group directory (no sticky bit, so the kernel's protected_symlinks does not apply): the
    attacker links the victim's record path to the victim's own file, which the victim may write."""
    home = victims_files(unprivileged_env)
    precious = home / "work" / "keep.txt"
    before = precious.read_bytes()
    shared = shared_dir(world_dir / "team", unprivileged_env, "kcache-a", 0o2770)
    planted = unprivileged_env.run("kcache-a", f"import os; os.symlink({str(precious)!r}, {str(shared / 'keys')!r})")
    assert planted.returncode == 0, planted.stderr
    done = unprivileged_env.run("kcache-b", RECORD_AS_VICTIM.format(root=str(home / "root")),
                                env={"KCACHE_RECORD": str(shared / "keys")})
    assert done.returncode == 0, done.stderr
    assert precious.read_bytes() == before
    assert "not recording keys" in done.stderr and "symbolic link" in done.stderr, done.stderr


@needs_root
def test_a_record_file_another_user_made_first_gets_no_key(
    unprivileged_env: UnprivilegedEnv, world_dir: Path  # noqa: F811
) -> None:
    shared = shared_dir(world_dir / "team", unprivileged_env, "kcache-a", 0o2770)
    keys = shared / "keys"
    made = unprivileged_env.run("kcache-a", f"import pathlib; pathlib.Path({str(keys)!r}).touch(); "
                                f"pathlib.Path({str(keys)!r}).chmod(0o666)")
    assert made.returncode == 0, made.stderr
    home = unprivileged_env.homes["kcache-b"]
    done = unprivileged_env.run("kcache-b", RECORD_AS_VICTIM.format(root=str(home / "root")),
                                env={"KCACHE_RECORD": str(keys)})
    assert done.returncode == 0, done.stderr
    assert keys.read_bytes() == b""  # not one key leaked
    assert "not recording keys" in done.stderr and "another user made it first" in done.stderr, done.stderr


@needs_root  # files given to other ids
def test_a_record_file_is_private_unless_the_cache_is_shared_by_a_group(
    tmp_path: Path, recording: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group read and write only for the cache's group: KCACHE_GROUP's, or a setgid directory's. In
    a plain directory a group-mode record is private: its group would be the user's primary group,
    which may be far broader than the cache's."""
    team = tmp_path / "team"  # a directory shared by a group by design: setgid
    team.mkdir()
    os.chown(team, -1, TEAM_GID)
    team.chmod(0o2770)
    previous = os.umask(0o022)
    try:
        record_one(tmp_path, tmp_path / "private.jsonl")
        monkeypatch.setenv("KCACHE_UMASK", "007")
        record_one(tmp_path, tmp_path / "plain-dir.jsonl")
        record_one(tmp_path, team / "setgid-dir.jsonl")
        monkeypatch.setenv("KCACHE_GROUP", str(TEAM_GID))
        record_one(tmp_path, tmp_path / "kcache-group.jsonl")
        monkeypatch.delenv("KCACHE_GROUP")
        monkeypatch.delenv("KCACHE_UMASK")
        loose = tmp_path / "loose.jsonl"  # made by an earlier kcache, 0644: narrowed, not refused
        loose.touch(0o644)
        record_one(tmp_path, loose)
    finally:
        os.umask(previous)
    files = {name: tmp_path / name for name in ("private.jsonl", "plain-dir.jsonl", "kcache-group.jsonl", "loose.jsonl")}
    files["setgid-dir.jsonl"] = team / "setgid-dir.jsonl"
    modes = {name: stat.S_IMODE(path.stat().st_mode) for name, path in files.items()}
    assert modes == {"private.jsonl": 0o600, "plain-dir.jsonl": 0o600, "setgid-dir.jsonl": 0o660,
                     "kcache-group.jsonl": 0o660, "loose.jsonl": 0o600}
    assert files["setgid-dir.jsonl"].stat().st_gid == files["kcache-group.jsonl"].stat().st_gid == TEAM_GID
    assert all(json.loads(path.read_text())["kernel"] == "k0" for path in files.values())


@needs_root  # files given to other ids
def test_a_key_list_another_user_owns_is_refused_in_one_line(tmp_path: Path) -> None:
    """Another user may change their key list's records at any time (`export --keys`, `verify-coverage`
    and `why-miss` would act on theirs): refused, with the fix; the user's own and root's are read."""
    (tmp_path / "root").mkdir()
    keys = tmp_path / "keys.jsonl"
    keys.write_text(json.dumps({"key": "ab" * 32}) + "\n")
    keys.chmod(0o644)
    os.chown(keys, OTHER_UID, -1)  # as root: a real file of another uid
    done = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(tmp_path / "root"), "verify-coverage",
                           "--keys", str(keys)], capture_output=True, text=True, env=child_env(), cwd=str(PROJECT),
                          timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert str(keys) in lines[0] and f"belongs to uid {OTHER_UID}" in lines[0] and "copy" in lines[0], done.stderr
    os.chown(keys, os.geteuid(), -1)
    mine = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(tmp_path / "root"), "verify-coverage",
                           "--keys", str(keys)], capture_output=True, text=True, env=child_env(), cwd=str(PROJECT),
                          timeout=60)
    assert "belongs to uid" not in mine.stderr and mine.returncode in (0, 1), mine.stderr


def test_a_second_link_to_the_record_file_is_refused(tmp_path: Path, recording: None, caplog) -> None:
    precious = tmp_path / "profile"
    precious.write_text("export PATH\n")
    os.link(precious, tmp_path / "keys.jsonl")
    record_one(tmp_path, tmp_path / "keys.jsonl")
    assert precious.read_text() == "export PATH\n"
    assert "2 links" in caplog.text


@pytest.mark.parametrize("case", ["anyone_may_write", "fifo", "link"])
def test_a_key_list_that_may_be_anyone_s_or_would_block_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    (tmp_path / "root").mkdir()
    keys = tmp_path / "keys.jsonl"
    real = tmp_path / "real.jsonl"
    real.write_text("0" * 64 + "\n")
    if case == "anyone_may_write":
        keys.write_text("0" * 64 + "\n")
        keys.chmod(0o666)
    elif case == "fifo":
        os.mkfifo(keys)  # open() without O_NONBLOCK would wait for a writer for ever
    else:
        keys.symlink_to(real)
    done = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(tmp_path / "root"), "verify-coverage",
                           "--keys", str(keys)], capture_output=True, text=True, env=child_env(), cwd=str(PROJECT),
                          timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    message = {"anyone_may_write": "may be written by any user", "fifo": "not a regular file",
               "link": "symbolic link"}[case]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(keys) in lines[0] and message in lines[0], done.stderr


# ---------------------------------------------------------------- the service's directory

SERVICE_CLIENT = """
import json, os
from kcache.compile.pool.process_pool import CompilePool
from kcache.compile.runtime_dir import runtime_directory
from kcache.compile.service import client, connection
pool = client.ServicePool(1, None, (), 60.0, lambda: CompilePool(1, None, preload=()))
value = pool.run(abs, -3)
if os.environ.get("STOP_SERVICE"):
    connection.request(pool.name, ("stop",))
print(json.dumps({"value": value, "pid": pool.server_pid, "directory": str(runtime_directory())}))
"""


@needs_root
def test_a_squatted_tmp_directory_moves_the_service_it_does_not_take_it_away(
    unprivileged_env: UnprivilegedEnv, world_dir: Path  # noqa: F811
) -> None:
    """No XDG_RUNTIME_DIR (cron, ssh without a session): kcache-a makes kcache-b's predictable
    `<tmp>/kcache-<uid>` first, in a sticky world-writable tmp where kcache-b cannot remove it.
    kcache-b's processes still share one service, in a private directory under its home."""
    env = unprivileged_env
    tmp = world_dir / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    squatted = tmp / f"kcache-{env.users['kcache-b'][0]}"
    made = env.run("kcache-a", f"import os; os.mkdir({str(squatted)!r}, 0o700)")
    assert made.returncode == 0, made.stderr
    runs, pids = [], []
    try:
        for stop in ("", "1"):
            done = env.run("kcache-b", SERVICE_CLIENT, env={"TMPDIR": str(tmp), "STOP_SERVICE": stop})
            assert done.returncode == 0, done.stderr
            runs.append((json.loads(done.stdout), done.stderr))
            pids.append(runs[-1][0]["pid"])
    finally:
        for pid in filter(None, pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    (first, warning), (second, _) = runs
    assert first["value"] == 3 and first["pid"] is not None and first["pid"] == second["pid"]  # one service
    assert first["directory"] == str(env.homes["kcache-b"] / ".cache" / "kcache-run" / host_tag())
    assert str(squatted) in warning and "belongs to uid" in warning and first["directory"] in warning, warning
    assert not list(squatted.iterdir())


def test_the_home_service_directory_leaves_room_for_a_socket_whatever_the_host_name() -> None:
    """A fully qualified host name can be 253 bytes; the socket's whole path may be 107. The home
    directory names the host by a short tag: its first label and a hash of the whole name."""
    longest = ".".join(["a" * 63] * 3) + "." + "b" * 61
    assert len(host_tag(longest)) <= 17 and host_tag("vm") == "vm" and host_tag(longest) != host_tag(longest[:-1])
    home_directory = Path("/home/a-user-with-a-long-name/.cache/kcache-run") / host_tag(longest)
    assert len(os.fsencode(home_directory / f"compile-{'0' * 20}.sock")) <= MAX_SOCKET_PATH


# ---------------------------------------------------------------- the service's in-flight merge


def staging(path: Path, mode: int) -> Path:
    """`root/.staging/job` with `mode` on every level, as kcache makes them for that root."""
    path.mkdir(parents=True)
    for level in (path.parent.parent, path.parent, path):
        level.chmod(mode)
    return path


def test_a_job_staged_in_a_group_root_is_never_copied_into_a_private_one(runtime: Path, tmp_path: Path) -> None:
    """Identical jobs in flight merge only within one trust domain: a group root's staging, which its
    group may write while the job runs, is never what a private root's job receives; two private
    outputs still merge (tests/test_service.py)."""
    from kcache.compile.jobs import JobOutput

    from . import pool_jobs
    from .test_service import service_pool, status

    group_job = staging(tmp_path / "group-root" / ".staging" / "job", 0o2770)
    private_job = staging(tmp_path / "private-root" / ".staging" / "job", 0o700)
    runs = tmp_path / "runs"
    gates = [tmp_path / "gate-group", tmp_path / "gate-private"]
    for gate in gates:
        os.mkfifo(gate)
    group_client, private_client = service_pool(), service_pool()
    first = group_client.submit(pool_jobs.write_output, str(group_job), str(gates[0]), str(runs),
                                output=JobOutput("one-key", str(group_job)))
    assert group_client.ping()  # the group root's job leads
    second = private_client.submit(pool_jobs.write_output, str(private_job), str(gates[1]), str(runs),
                                   output=JobOutput("one-key", str(private_job)))
    assert private_client.ping()
    assert status(private_client)["merged_jobs"] == 0  # it did not follow the group root's job
    for gate in gates:
        gate.write_text("go")
    assert first.result(timeout=60) != second.result(timeout=60)  # each ran in a worker of its own
    assert runs.read_text() == "run\n" * 2


def test_a_staging_below_a_directory_others_may_write_is_no_private_output(tmp_path: Path) -> None:
    """Another user who may write any directory above a private root's staging may move the root away
    and put one of theirs in its place: its outputs are then of that root's domain alone (never copied
    into another root's job). A sticky directory above (as /tmp) is no such way in."""
    from kcache.compile.service.inflight import trust_domain

    tmp_path.chmod(0o700)
    above = tmp_path / "above"
    job = staging(above / "root" / ".staging" / "job", 0o700)
    above.chmod(0o700)
    assert trust_domain(str(job)) == "private"
    above.chmod(0o1777)  # sticky: nobody may rename what is not theirs
    assert trust_domain(str(job)) == "private"
    above.chmod(0o777)  # two levels up, open to all
    assert trust_domain(str(job)) == f"root {job.parent}"
