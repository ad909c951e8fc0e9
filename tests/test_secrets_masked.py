"""Secrets never printed (issue 68): KCACHE_REMOTE's Redis password is shown as `redis://user:***@host` by
`kcache config` (table and --json), `kcache doctor` (table and --json), a remote tier's warnings, every line
of kcache's log and a bad value's one line. A real redis-server that only the password opens (its default
user off), as the review found it: whoever read the password off `kcache config` could write to it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kcache.redaction import masked

from .helpers import PROJECT, child_env
from .redis_server import redis_server

pytest.importorskip("redis", reason="the remote tier needs redis-py (pip install -e '.[test]')")

PASSWORD = "hunter2-Kc4che-s3cret"
USER = "kcache-team"


@pytest.mark.parametrize(("text", "shown"), [
    ("redis://kcache-team:pw@127.0.0.1:6379/0", "redis://kcache-team:***@127.0.0.1:6379/0"),
    ("redis://:pw@host:6379/0", "redis://:***@host:6379/0"),
    ("rediss://token@host/0", "rediss://***@host/0"),
    ("redis://host:6379/0,s3://bucket/prefix", "redis://host:6379/0,s3://bucket/prefix"),  # nothing to hide
    ("KCACHE_REMOTE='redis://u:p@h:1/0,redis://v:q@k:2/0' is bad", "KCACHE_REMOTE='redis://u:***@h:1/0,redis://v:***@k:2/0' is bad"),
    ("mail me at someone@example.com", "mail me at someone@example.com"),  # no URL
])
def test_masked_hides_the_password_of_every_url(text: str, shown: str) -> None:
    assert masked(text) == shown


@pytest.fixture
def remote(tmp_path: Path) -> str:
    with redis_server(tmp_path, (USER, PASSWORD)) as (url, _server):
        import redis

        with pytest.raises(redis.AuthenticationError):  # the password is what opens it
            redis.Redis.from_url(url.replace(f"{USER}:{PASSWORD}@", "")).set("k", "v")
        yield url


def kcache(root: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), *argv], capture_output=True, text=True,
                          env=child_env(**env), cwd=str(PROJECT), timeout=120, check=False)


def shown(url: str) -> str:
    return url.replace(f":{PASSWORD}@", ":***@")


def test_config_and_doctor_never_print_the_password(remote: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    for argv in (["config"], ["--json", "config"], ["doctor"], ["--json", "doctor"]):
        done = kcache(root, *argv, KCACHE_REMOTE=remote)
        assert PASSWORD not in done.stdout + done.stderr, argv
        assert shown(remote) in done.stdout, (argv, done.stdout)
    answers = json.loads(kcache(root, "--json", "doctor", KCACHE_REMOTE=remote).stdout)
    (finding,) = [f for f in answers if f["check"] == "remote"]
    assert not finding["problem"] and finding["detail"] == f"{shown(remote)} answers", finding  # it did connect
    wrong = remote.replace(PASSWORD, PASSWORD + "-wrong")
    done = kcache(root, "doctor", KCACHE_REMOTE=wrong)
    assert done.returncode == 1 and PASSWORD not in done.stdout + done.stderr
    assert f"{USER}:***@" in done.stdout and "unreachable" in done.stdout, done.stdout


def test_a_bad_remote_setting_is_one_line_without_the_password(tmp_path: Path) -> None:
    value = f"redis://{USER}:{PASSWORD}@127.0.0.1:1/0,http://cache:80"
    for argv in (["stats"], ["run", str(tmp_path / "program.py")]):
        (tmp_path / "program.py").write_text("print('ran')\n")
        done = kcache(tmp_path / "root", *argv, KCACHE_REMOTE=value)
        assert done.returncode == 2 and PASSWORD not in done.stdout + done.stderr, done.stderr
        assert f"KCACHE_REMOTE='redis://{USER}:***@127.0.0.1:1/0,http://cache:80'" in done.stderr, done.stderr


USE_THE_REMOTE = """
import logging, kcache
from stress.programs import synthetic
cache = kcache.KernelCache({root!r}, backend=synthetic)
cache.get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
logging.getLogger("kcache").warning("kcache: a line that quotes %s", {url!r})
print("done")
"""


def test_a_remote_tiers_warnings_and_every_log_line_mask_the_password(remote: str, tmp_path: Path) -> None:
    # A Redis that is down (a closed port, the same credentials): the tier's warning names it.
    import redis

    down = remote.rsplit(":", 1)[0].rsplit(":", 1)[0] + f":{PASSWORD}@127.0.0.1:1/0"
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(down, socket_connect_timeout=2).ping()
    for number, (url, says) in enumerate(((down, "is unavailable"), (remote, "kcache: tilelang miss k0"))):
        root = tmp_path / f"root{number}"  # a miss each time: the remote tier is asked
        done = subprocess.run([sys.executable, "-c", USE_THE_REMOTE.format(root=str(root), url=url)],
                              capture_output=True, text=True, env=child_env(KCACHE_REMOTE=url, KCACHE_LOG="debug"),
                              cwd=str(PROJECT), timeout=120, check=False)
        assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-3000:]
        assert PASSWORD not in done.stderr, done.stderr
        assert f"a line that quotes {shown(url)}" in done.stderr and says in done.stderr, done.stderr
        if url == down:
            assert f"the remote cache {shown(down)} is unavailable" in done.stderr, done.stderr
    stored = redis.Redis.from_url(remote).keys("kcache:*")
    assert stored, "the entry went to the Redis the password opens"
