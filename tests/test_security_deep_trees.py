"""The third security review's finding T3 (issue 54): a group member plants a directory tree 1,500
levels deep where gc removes things (a stale staging directory, an old quarantined entry). Before, gc
recursed into it and raised RecursionError: out of `kcache.KernelCache(root)` whenever gc was due (a
member can make it due by deleting `.gc-stamp`), and out of `kcache gc` always. Now gc at open never
raises, `kcache gc` exits 0, and the planted tree is left alone with one warning that names it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kcache.store import layout

from .faults import needs_root
from .test_security import world_dir  # noqa: F401 - a fixture
from .unprivileged import UnprivilegedEnv

pytestmark = needs_root

DEPTH = 1500
GROUP = {"KCACHE_UMASK": "002"}

# The attacker: a staging directory of a process that is gone (its own), and an entry quarantined
# long ago, each holding a chain of DEPTH directories, made by descriptor (no path is that long).
PLANT = """
import os, sys, time
from kcache.store import layout
root = sys.argv[1]
os.umask(0o002)  # as a member in group mode: the directories stay the group's to write
def chain(top):
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range({depth}):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
staging = os.path.join(root, layout.STAGING, str(layout.StagingName.fresh("0" * 64)))  # this pid: gone soon
quarantined = os.path.join(root, layout.QUARANTINE, "ab" * 32 + ".1.deadbeef")
for top in (staging, quarantined):
    os.makedirs(top)
    chain(top)
old = time.time() - 400 * 86400  # older than anything gc keeps
for top in (staging, quarantined):
    os.utime(top, (old, old))
os.unlink(os.path.join(root, layout.GC_STAMP))  # gc is due at the next open
print(staging, quarantined)
""".format(depth=DEPTH)

OPEN = """
import json, logging, sys
import kcache
from stress.programs import synthetic
logging.basicConfig(level=logging.WARNING, format="%(message)s")
cache = kcache.KernelCache(sys.argv[1], backend=synthetic)  # gc is due: it runs here
kernel = cache.get_or_compile(synthetic.SyntheticFunc(KERNEL), "synthetic")
print(json.dumps({"compiles": cache.stats()["compiles"]}))
"""


def test_a_planted_deep_tree_costs_gc_a_warning_at_open_and_in_kcache_gc(
        unprivileged_env: UnprivilegedEnv, world_dir: Path) -> None:  # noqa: F811
    env = unprivileged_env
    team = world_dir / "team"
    team.mkdir()
    os.chown(team, 0, env.share_gid)
    team.chmod(0o2770)
    made = env.run("kcache-b", OPEN.replace("sys.argv[1]", repr(str(team))).replace("KERNEL", "'k0'"),
                   env=GROUP)  # the victim's root
    assert made.returncode == 0, made.stderr
    planted = env.run("kcache-a", PLANT.replace("sys.argv[1]", repr(str(team))), env=GROUP)
    assert planted.returncode == 0, planted.stderr
    staging, quarantined = planted.stdout.split()
    assert not (team / layout.GC_STAMP).exists()

    opened = env.run("kcache-b", OPEN.replace("sys.argv[1]", repr(str(team))).replace("KERNEL", "'k1'"), env=GROUP)
    assert opened.returncode == 0 and "Traceback" not in opened.stderr, opened.stderr[-3000:]
    assert (team / layout.GC_STAMP).exists(), f"gc did not run at open: the test proves nothing {opened.stderr}"
    assert json.loads(opened.stdout.splitlines()[-1])["compiles"] == 1
    warned = [line for line in opened.stderr.splitlines() if "directories deep" in line]
    assert len(warned) == 1 and staging in warned[0], opened.stderr

    swept = env.run("kcache-b", f"import sys\nfrom kcache.cli.main import main\n"
                                f"sys.exit(main(['--dir', {str(team)!r}, 'gc']))", env=GROUP)
    assert swept.returncode == 0 and "Traceback" not in swept.stderr, swept.stderr[-3000:]
    warned = [line for line in swept.stderr.splitlines() if "directories deep" in line]
    assert len(warned) == 2 and any(quarantined in line for line in warned), swept.stderr
    assert Path(staging, "d").is_dir() and Path(quarantined, "d").is_dir()  # left for their owner or root


@pytest.fixture(autouse=True)
def _remove_the_planted_trees(world_dir: Path):  # noqa: F811, ANN202
    """shutil.rmtree (the world_dir fixture's) recurses: GNU rm removes the planted chains first."""
    yield
    subprocess.run(["rm", "-rf", str(world_dir / "team")], check=True)
