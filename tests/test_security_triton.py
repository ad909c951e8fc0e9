"""The third security review's Triton findings (issue 54), each as the attack that showed it, with real
users: kcache-a the attacker, kcache-b the victim, both in the group kcache-share.

- T1: Triton's lone files. Triton builds a shared object (its driver's `cuda_utils`, each kernel's
  launcher) with `compile_module_from_src`: `get_file`, a build on a miss, `put`, then `dlopen` of the
  path `put` returned. The attacker plants an entry at that key, which kcache refuses; the victim's
  publish then loses the race to it, and `put` must not hand back the planted library.
- T2: a refused entry that cannot be moved aside (a directory the victim may not rename) is a warning
  and a compile, never an exception out of Triton's manager.
- The Triton root: the trust check starts at the cache root, as TileLang's does.
- Helion's listing (issue 68): one record `{"helion_key": 5}` planted in a group root made the warm-start
  listing raise before any trust check, in or out of group mode, and Helion then dropped every seed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

from .faults import needs_root  # noqa: E402
from .test_security import world_dir  # noqa: E402, F401 - a fixture
from .test_triton import MANAGER, PROGRAM, counting_assemblers, triton_users, users_running_triton  # noqa: E402, F401
from .unprivileged import UnprivilegedEnv  # noqa: E402

pytestmark = needs_root

# A module as Triton builds its driver's and launchers' (compile_module_from_src): the victim's.
PROBE = r"""
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kcache_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_kcache_probe(void) { return PyModule_Create(&module); }
"""
# The attacker's: the same module name, a constructor that leaves a mark, another answer.
EVIL = PROBE.replace("return PyLong_FromLong(42);", "return PyLong_FromLong(666);") + r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    FILE *mark = fopen(getenv("KT_MARK"), "a"); if (mark) { fprintf(mark, "%d\n", getuid()); fclose(mark); }
}
"""

VICTIM = """
import json, os, sys
from triton.runtime.build import compile_module_from_src
source = open(os.environ["KT_SOURCE"]).read()
loaded = compile_module_from_src(source, "kcache_probe")
print(json.dumps({"answer": loaded.answer(), "file": loaded.__file__}))
"""

# The attacker: builds its module with plain Triton (a private cache), then publishes it with kcache's
# own store, as a well-formed entry, under the key of the victim's module.
PLANT = """
import hashlib, json, os, sysconfig
from pathlib import Path
from triton.runtime.build import compile_module_from_src, platform_key
from triton.runtime.cache import _base32
from kcache.triton.roots import TritonRoots
from kcache.triton.store import GroupStore, entry_key
root = Path(os.environ["KCACHE_DIR"])
# Triton's key of the victim's module, as compile_module_from_src and get_cache_manager make it
victims_key = _base32(hashlib.sha256((open(os.environ["KT_SOURCE"]).read() + platform_key()).encode()).hexdigest())
name = "kcache_probe" + sysconfig.get_config_var("EXT_SUFFIX")
evil = Path(compile_module_from_src(open(os.environ["KT_EVIL"]).read(), "kcache_probe").__file__).read_bytes()
published = GroupStore(victims_key, TritonRoots(root, (root,), 10)).publish(entry_key(victims_key, name), None,
                                                                             {name: evil})
print(json.dumps({"entry": str(published)}))
"""


def _files(world: Path) -> dict[str, str]:
    """The sources, and the mark file any user may append to: the attacker's constructor writes it."""
    (world / "probe.c").write_text(PROBE)
    (world / "evil.c").write_text(EVIL)
    mark = world / "mark"
    mark.write_text("")
    mark.chmod(0o666)
    return {"KT_SOURCE": str(world / "probe.c"), "KT_EVIL": str(world / "evil.c"), "KT_MARK": str(mark)}


def _run(env: UnprivilegedEnv, user: str, code: str, variables: dict[str, str]) -> tuple[dict, str]:
    done = env.run(user, code, env=variables, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def _plant(env: UnprivilegedEnv, world: Path, root: Path, files: dict[str, str], **mode: str) -> Path:
    """The attacker's entry at the victim's key, and `triton/.locks` made unwritable: a refused entry
    then cannot even be moved aside under the key's lock."""
    attacker = {"KCACHE_DIR": str(root), "TRITON_CACHE_DIR": str(env.homes["kcache-a"] / "triton"), **files, **mode,
                "KT_MARK": str(env.homes["kcache-a"] / "own-mark")}  # the attacker loads its build too
    planted, _ = _run(env, "kcache-a", PLANT, attacker)
    entry = Path(planted["entry"])
    assert entry.is_dir() and any(entry.glob("kcache_probe*.so")), planted
    locks = root / "triton" / ".locks"
    done = env.run("kcache-a", f"import os\nos.makedirs({str(locks)!r}, exist_ok=True)\nos.chmod({str(locks)!r}, 0o555)")
    assert done.returncode == 0, done.stderr
    return entry


@pytest.mark.parametrize("setup", ["sticky scratch root", "group root, victim not in group mode"])
def test_put_after_a_lost_race_never_hands_triton_another_users_shared_object(
        triton_users: tuple[UnprivilegedEnv, Path], world_dir: Path, setup: str) -> None:  # noqa: F811
    """T1. The attacker's library at the victim's key; the victim's Triton builds its own (the planted
    entry is refused), its publish finds the key taken, and what Triton then loads must be the
    victim's own build: the answer 42, no mark of the attacker's constructor."""
    env, _ = triton_users
    files = _files(world_dir)
    team = world_dir / "team"
    team.mkdir()
    if setup == "sticky scratch root":  # a team root in a shared scratch directory: any local user
        team.chmod(0o1777)
        attacker_mode: dict[str, str] = {}
        (team / "triton").mkdir()  # the attacker got there first, and lets everyone in
        os.chown(team / "triton", *env.users["kcache-a"])
        (team / "triton").chmod(0o777)
    else:  # docs/operations.md's recipe: root-owned, setgid, the team's group; the attacker a member
        os.chown(team, 0, env.share_gid)
        team.chmod(0o2770)
        attacker_mode = {"KCACHE_UMASK": "002"}
    entry = _plant(env, world_dir, team, files, **attacker_mode)
    if setup == "sticky scratch root":
        for directory in (team / "triton", team / "triton" / ".staging"):
            directory.chmod(0o777)

    victim = {"KCACHE_DIR": str(team), "TRITON_CACHE_DIR": str(env.homes["kcache-b"] / "triton"), **files, **MANAGER}
    loaded, said = _run(env, "kcache-b", VICTIM, victim)
    assert Path(files["KT_MARK"]).read_text() == "", "the attacker's constructor ran as the victim"
    assert loaded["answer"] == 42, loaded
    assert not loaded["file"].startswith(str(entry)), loaded
    assert "Traceback" not in said, said
    assert any(entry.glob("kcache_probe*.so")), "the planted entry is not the victim's to move or delete"
    again, said = _run(env, "kcache-b", VICTIM, victim)  # the next process: the same, no crash
    assert again["answer"] == 42 and Path(files["KT_MARK"]).read_text() == "", said


# ---------------------------------------------------------------- T2: entries that cannot be moved aside

ADD_AS_USER = """
import json, runpy, sys
sys.argv = ["triton_program.py", "add"]
runpy.run_path({program!r}, run_name="__main__")
"""


@pytest.mark.parametrize("victim_mode", ["group mode", "private mode"])
def test_a_refused_entry_that_cannot_be_moved_aside_is_a_warning_and_a_compile(
        triton_users: tuple[UnprivilegedEnv, Path], world_dir: Path, victim_mode: str) -> None:  # noqa: F811
    """T2. A group member replaces the add kernel's group and the probe module's entry by plain 0755
    directories of their own, which nobody else may rename. A victim in group mode finds them corrupt
    (no manifest), one outside it finds them untrusted (its root is the group's): either way Triton
    compiles, once per process, with one warning, and the directories stay where they are."""
    env, _ = triton_users
    files = _files(world_dir)
    program = world_dir / "triton_program.py"
    shutil.copy(PROGRAM, program)
    team = world_dir / "team"
    team.mkdir()
    os.chown(team, 0, env.share_gid)
    team.chmod(0o2770)
    group = {"KCACHE_UMASK": "002"}
    member = {"KCACHE_DIR": str(team), "TRITON_CACHE_DIR": str(env.homes["kcache-a"] / "triton"), **files, **group, **MANAGER}
    _run(env, "kcache-a", ADD_AS_USER.format(program=str(program)), member)
    _run(env, "kcache-a", VICTIM, member)
    planted = sorted(name for name in os.listdir(team / "triton") if not name.startswith("."))
    assert len(planted) == 2, planted  # the add kernel's group and the probe module
    replace = "".join(f"import os, shutil\nshutil.rmtree({str(team / 'triton' / name)!r})\n"
                      f"os.mkdir({str(team / 'triton' / name)!r}, 0o755)\n"
                      f"open({str(team / 'triton' / name / 'junk')!r}, 'w').write('junk')\n" for name in planted)
    done = env.run("kcache-a", replace, env=group)
    assert done.returncode == 0, done.stderr

    victim = {"KCACHE_DIR": str(team), "TRITON_CACHE_DIR": str(env.homes["kcache-b"] / "triton"), **files, **MANAGER,
              **(group if victim_mode == "group mode" else {})}
    added, said = _run(env, "kcache-b", ADD_AS_USER.format(program=str(program)), victim)
    assert "add" in added and "Traceback" not in said and "PublishError" not in said, said
    loaded, said_too = _run(env, "kcache-b", VICTIM, victim)
    assert loaded["answer"] == 42, said_too
    for name in planted:
        assert (team / "triton" / name / "junk").is_file(), "the planted directory was not the victim's to move"
    refusals = [line for line in (said + said_too).splitlines() if line.startswith("kcache:") and
                any(name in line for name in planted)]
    assert refusals and len(refusals) <= 4, said + said_too  # one line per entry (and its compile), no flood


# ---------------------------------------------------------------- the Triton root


def test_the_trust_check_of_a_triton_entry_starts_at_the_cache_root(
        triton_users: tuple[UnprivilegedEnv, Path], world_dir: Path) -> None:  # noqa: F811
    """A root the attacker owns (0777), in which the victim's own `triton/` and entries are the
    victim's: the attacker may rename `triton/` at any time, between kcache's check and Triton's read.
    So, as for TileLang's entries, nothing below such a root is trusted: the victim's next process
    compiles again, and says why, naming the root."""
    users, counting, as_user = users_running_triton(triton_users, world_dir)
    team = world_dir / "team"
    team.mkdir()
    os.chown(team, *users.users["kcache-a"])
    team.chmod(0o777)
    env = {"KCACHE_DIR": str(team), "TRITON_CACHE_DIR": str(users.homes["kcache-b"] / "triton"),
           **counting_assemblers(counting, triton_users[1]), **MANAGER}

    def counted() -> int:
        return len((counting / "runs").read_text().splitlines())

    first, _ = as_user("kcache-b", "add", env)
    assert counted() == 1 and (team / "triton").stat().st_uid == users.users["kcache-b"][0]
    again, said = as_user("kcache-b", "add", env)
    assert again["add"] == first["add"] and counted() == 2, said  # compiled again: nothing there is trusted
    assert f"{team} is owned by uid {users.users['kcache-a'][0]}" in said, said


# ---------------------------------------------------------------- Helion's listing (issue 68)

# What Backend.list() does for each root it reads (kcache.helion.store.newest_values), as a user of the
# team root: publish a pick (KT_PICK), or list them all. Helion itself is not needed for either.
HELION_PICKS = """
import json, os
from pathlib import Path
from kcache.helion import store
root = Path(os.environ["KCACHE_DIR"])
if os.environ.get("KT_PICK"):
    assert store.publish_value(root, os.environ["KT_PICK"], json.dumps({"config": json.dumps({"by": os.environ["KT_PICK"]})}))
print(json.dumps([json.loads(json.loads(value)["config"])["by"] for value in store.newest_values(root, None)]))
"""


def test_a_planted_helion_record_is_skipped_and_the_others_are_listed(
        unprivileged_env: UnprivilegedEnv, world_dir: Path) -> None:  # noqa: F811
    env = unprivileged_env
    team = world_dir / "team"
    team.mkdir()
    os.chown(team, 0, env.share_gid)
    team.chmod(0o2770)
    group = {"KCACHE_DIR": str(team), "KCACHE_UMASK": "002"}
    for user in ("kcache-a", "kcache-b"):  # a pick of each member
        done = env.run(user, HELION_PICKS, env={**group, "KT_PICK": f"pick of {user}"})
        assert done.returncode == 0, done.stderr
    plant = ("import hashlib, json, os\n"
             f"entry = os.path.join({str(team / 'helion')!r}, hashlib.sha256(b'planted').hexdigest())\n"
             "os.mkdir(entry)\n"
             "open(os.path.join(entry, 'kcache-helion.json'), 'w').write(json.dumps({'helion_key': 5}))\n"
             "print(entry)\n")
    planted = env.run("kcache-a", plant, env=group)
    assert planted.returncode == 0, planted.stderr
    entry = planted.stdout.strip()
    listed = env.run("kcache-b", HELION_PICKS, env=group)  # the victim, a member in group mode
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert sorted(json.loads(listed.stdout)) == ["pick of kcache-a", "pick of kcache-b"]
    assert [line for line in listed.stderr.splitlines() if Path(entry).name in line] != [], listed.stderr
    assert len(listed.stderr.strip().splitlines()) == 1, listed.stderr  # one warning, for the planted record
    # Outside group mode the members' entries are not trusted, the planted one least: refused, each with
    # its warning, and still no exception.
    planted = env.run("kcache-a", plant.replace("b'planted'", "b'planted again'"), env=group)
    assert planted.returncode == 0, planted.stderr
    alone = env.run("kcache-b", HELION_PICKS, env={"KCACHE_DIR": str(team)})
    assert alone.returncode == 0 and "Traceback" not in alone.stderr, alone.stderr
    assert json.loads(alone.stdout) == [] and "planted" not in alone.stdout
