"""Triton on kcache's store (`TRITON_CACHE_MANAGER=kcache.triton:CacheManager`, issue 38), on the CPU
machine: Triton compiles for sm_90 without a GPU. Every process is a fresh `stress/programs/triton_programs/compile.py`;
compiles are counted by the runs of Triton's assembler (TRITON_PTXAS_PATH and, for Triton 3.9,
TRITON_PTXAS_BLACKWELL_PATH name wrappers that count, then run Triton's own), not by kcache. Plain Triton (its FileCacheManager) runs beside kcache where the
difference is the point: the herd, the foreign-owned CI cache."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

from stress.programs.triton_programs.assemblers import assembler_runs, counting_assemblers  # noqa: E402

from .faults import fill_filesystem, needs_root, tmpfs  # noqa: E402
from .helpers import PROJECT, child_env  # noqa: E402
from .redis_server import redis_server  # noqa: E402
from .s3_server import s3_server  # noqa: E402
from .test_security import world_dir  # noqa: E402, F401 - a fixture
from .unprivileged import UnprivilegedEnv  # noqa: E402

PROGRAM = PROJECT / "stress" / "programs" / "triton_programs" / "compile.py"
MANAGER = {"TRITON_CACHE_MANAGER": "kcache.triton:CacheManager"}


@pytest.fixture
def ptxas(tmp_path: Path) -> Path:
    """The folder of Triton's assemblers as counting wrappers (stress.programs.triton_programs.assemblers)."""
    folder = tmp_path / "counting-assemblers"
    folder.mkdir()
    counting_assemblers(folder)
    return folder


def runs(ptxas: Path) -> int:
    return assembler_runs(ptxas)


def program_env(ptxas: Path, root: Path, **extra: str) -> dict[str, str]:
    """A program's environment: Triton's own cache unless `extra` names kcache's manager (a test before
    this one may have called kcache.install() in this process, which sets TRITON_CACHE_MANAGER)."""
    env = child_env(**counting_assemblers(ptxas), KCACHE_DIR=str(root), TRITON_CACHE_DIR=str(root / "plain"), **extra)
    if "TRITON_CACHE_MANAGER" not in extra:
        env.pop("TRITON_CACHE_MANAGER", None)
    return env


def compile_in_fresh_process(kernels: str, env: dict[str, str]) -> dict[str, str]:
    done = subprocess.run([sys.executable, str(PROGRAM), kernels], capture_output=True, text=True, env=env,
                          cwd=str(PROJECT), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1]) | {"stderr": done.stderr}


def triton_entries(root: Path) -> list[str]:
    directory = root / "triton"
    return sorted(name for name in os.listdir(directory) if not name.startswith(".")) if directory.exists() else []


# ---------------------------------------------------------------- the protocol


def test_a_group_is_one_entry_and_a_fresh_process_compiles_nothing_and_gets_tritons_bytes(
        tmp_path: Path, ptxas: Path) -> None:
    plain = compile_in_fresh_process("add,softmax,matmul", program_env(ptxas, tmp_path / "plain-root"))
    assert runs(ptxas) == 3
    root = tmp_path / "root"
    first = compile_in_fresh_process("add,softmax,matmul", program_env(ptxas, root, **MANAGER))
    assert runs(ptxas) == 6 and len(triton_entries(root)) == 3
    for entry in triton_entries(root):
        names = set(os.listdir(root / "triton" / entry))
        assert {"manifest.json", "kcache-triton.json"} <= names and any(n.endswith(".cubin") for n in names)
    second = compile_in_fresh_process("add,softmax,matmul", program_env(ptxas, root, **MANAGER))
    assert runs(ptxas) == 6  # every kernel a hit: no compile
    for name in ("add", "softmax", "matmul"):
        assert plain[name] == first[name] == second[name], name  # a cache never changes the kernel
    assert not (root / "plain").exists()  # Triton's own cache was not used


def test_a_herd_compiles_a_key_once_where_tritons_own_cache_compiles_it_in_every_process(
        tmp_path: Path, ptxas: Path) -> None:
    def herd(env: dict[str, str], size: int = 6) -> list[dict[str, str]]:
        processes = [subprocess.Popen([sys.executable, str(PROGRAM), "matmul"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                      cwd=str(PROJECT)) for _ in range(size)]
        for process in processes:  # every one imported Triton: then all start at once
            assert process.stdout.readline().strip() == "ready"
        for process in processes:
            process.stdin.write("go\n")
            process.stdin.flush()
        results = [json.loads(process.communicate(timeout=300)[0].splitlines()[-1]) for process in processes]
        assert all(process.returncode == 0 for process in processes)
        return results

    plain = herd(program_env(ptxas, tmp_path / "plain-root", KT_GATE="1"))
    plain_runs = runs(ptxas)
    ours = herd(program_env(ptxas, tmp_path / "root", KT_GATE="1", **MANAGER))
    assert runs(ptxas) - plain_runs == 1, f"kcache compiled {runs(ptxas) - plain_runs} times"
    assert plain_runs > 1, "plain Triton compiled once: the herd did not meet"
    assert len({r["matmul"] for r in plain + ours}) == 1


HIT_MODULES = """
import json, sys
sys.path.insert(0, {project!r})
from stress.programs.triton_programs.compile import compile_kernel
digest = compile_kernel("matmul")
print(json.dumps({{"matmul": digest, "modules": sorted(m for m in sys.modules if m.startswith("kcache"))}}))
"""

# What a miss needs and a hit does not: each costs a fresh process's first Triton hit its import
# (docs/benchmarks.md, issue 38's hit).
MISS_ONLY_MODULES = ("kcache.config", "kcache.store.locks", "kcache.triton.private", "kcache.store.exec_copy",
                     "kcache.cache.deployment", "kcache.cache.miss_explain", "kcache.triton.key_fields",
                     "kcache.tiers.remote_chain", "kcache.store.publish_batch", "kcache.store.entries",
                     "kcache.store.fsutil", "kcache.compile.fork.caller_fork", "kcache.triton.crashes",
                     "kcache.triton.errors", "kcache.triton.isolation", "kcache.triton.parallel_tune")


def test_a_fresh_processs_hit_loads_none_of_the_miss_paths_modules(tmp_path: Path, ptxas: Path) -> None:
    root = tmp_path / "root"
    miss = subprocess.run([sys.executable, "-c", HIT_MODULES.format(project=str(PROJECT))], capture_output=True,
                          text=True, timeout=300, env=program_env(ptxas, root, **MANAGER), cwd=str(tmp_path))
    assert miss.returncode == 0 and runs(ptxas) == 1, miss.stderr[-3000:]
    loaded_by_miss = json.loads(miss.stdout.splitlines()[-1])["modules"]
    assert {"kcache.compile.fork.caller_fork", "kcache.triton.crashes"} <= set(loaded_by_miss)  # a miss does load them
    hit = subprocess.run([sys.executable, "-c", HIT_MODULES.format(project=str(PROJECT))], capture_output=True,
                         text=True, timeout=300, env=program_env(ptxas, root, **MANAGER), cwd=str(tmp_path))
    assert hit.returncode == 0 and runs(ptxas) == 1, hit.stderr[-3000:]  # a hit: no compile
    loaded = json.loads(hit.stdout.splitlines()[-1])["modules"]
    assert "kcache.triton.manager" in loaded
    assert not set(loaded) & set(MISS_ONLY_MODULES), sorted(set(loaded) & set(MISS_ONLY_MODULES))


def test_a_hits_read_is_the_stores_read_for_a_group_a_corrupt_one_and_a_linked_one(tmp_path: Path,
                                                                                   ptxas: Path) -> None:
    """The hit reads a group through `read_entry`, without the store's write path: the same files, and
    the same refusals, as `EntryStore.read` of the same root (a changed byte; a link for the entry)."""
    from kcache.errors import CorruptEntry, UntrustedEntry
    from kcache.triton.store import read_entry, store_of

    root = tmp_path / "root"
    compile_in_fresh_process("add", program_env(ptxas, root, **MANAGER))
    (entry,) = triton_entries(root)
    files = read_entry(root, entry)
    assert files is not None and files == store_of(root).read(entry) and any(n.endswith(".cubin") for n in files)
    assert read_entry(root, "0" * 64) is None and store_of(root).read("0" * 64) is None
    linked = "1" * 64
    (root / "triton" / linked).symlink_to(root / "triton" / entry)
    for read in (read_entry, lambda r, k: store_of(r).read(k)):
        with pytest.raises(UntrustedEntry):
            read(root, linked)
    (cubin,) = (root / "triton" / entry).glob("*.cubin")
    cubin.chmod(0o644)
    cubin.write_bytes(b"\0" + cubin.read_bytes()[1:])
    for read in (read_entry, lambda r, k: store_of(r).read(k)):
        with pytest.raises(CorruptEntry, match="sha256"):
            read(root, entry)


KILLED_MID_GROUP = """
import sys
sys.argv = ["triton_program.py", "matmul"]
sys.path.insert(0, {project!r})
from kcache.triton import manager
put = manager.CacheManager.put
seen = []
def put_then_stop(self, data, filename, binary=True):
    path = put(self, data, filename, binary)
    seen.append(filename)
    if len(seen) == 3:
        print("paused", flush=True)
        sys.stdin.readline()
    return path
manager.CacheManager.put = put_then_stop
import runpy
runpy.run_path({program!r}, run_name="__main__")
"""


def test_a_writer_killed_mid_group_leaves_no_entry_and_holds_nothing(tmp_path: Path, ptxas: Path) -> None:
    """The store's part: a process that writes a group killed between its files. In-process
    (KCACHE_TRITON_ISOLATION=off), where the test can pause it; a fork that compiles dies with its caller."""
    root = tmp_path / "root"
    env = program_env(ptxas, root, KCACHE_TRITON_ISOLATION="off", **MANAGER)
    writer = subprocess.Popen([sys.executable, "-c", KILLED_MID_GROUP.format(program=str(PROGRAM), project=str(PROJECT))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=str(PROJECT))
    assert writer.stdout.readline().strip() == "paused", writer.stderr.read()
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    assert triton_entries(root) == []  # three files written, none visible
    assert os.listdir(root / "triton" / ".staging")  # its private files, for gc
    before = runs(ptxas)
    again = compile_in_fresh_process("matmul", env)  # the dead writer's lock went with it: no wait
    assert runs(ptxas) == before + 1 and len(triton_entries(root)) == 1
    assert again["matmul"] == compile_in_fresh_process("matmul", program_env(ptxas, tmp_path / "p"))["matmul"]
    import kcache

    kcache.KernelCache(root, backend=__import__("stress.programs.synthetic").programs.synthetic).gc()
    assert os.listdir(root / "triton" / ".staging") == []  # the dead writer's files


def test_a_corrupt_group_is_moved_aside_and_compiled_again(tmp_path: Path, ptxas: Path) -> None:
    root = tmp_path / "root"
    env = program_env(ptxas, root, **MANAGER)
    good = compile_in_fresh_process("add", env)
    (entry,) = triton_entries(root)
    cubin = next((root / "triton" / entry).glob("*.cubin"))
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cubin.chmod(0o644)
    cubin.write_bytes(bytes(data))
    before = runs(ptxas)
    again = compile_in_fresh_process("add", env)
    assert runs(ptxas) == before + 1 and again["add"] == good["add"]
    assert "quarantined corrupt entry" in again["stderr"], again["stderr"]
    assert len(os.listdir(root / "triton" / ".quarantine")) == 1  # kept for a look, never loaded


def test_read_only_mode_serves_hits_and_compiles_misses_without_writing(tmp_path: Path, ptxas: Path) -> None:
    root = tmp_path / "root"
    compile_in_fresh_process("add", program_env(ptxas, root, **MANAGER))
    before, entries = runs(ptxas), triton_entries(root)
    done = compile_in_fresh_process("add,softmax", program_env(ptxas, root, KCACHE_READONLY="1", **MANAGER))
    assert runs(ptxas) == before + 1  # the softmax only
    assert triton_entries(root) == entries and "softmax" in done


# ---------------------------------------------------------------- hostile filesystems


@pytest.fixture
def triton_users(unprivileged_env: UnprivilegedEnv) -> tuple[UnprivilegedEnv, Path]:  # noqa: F811
    """The unprivileged venv with Triton in it, and the Triton there: hard links to this interpreter's
    Triton (the users cannot enter /root; a link costs no copy, and nothing of the originals is changed)."""
    import triton

    site_packages = Path(subprocess.run([str(unprivileged_env.python), "-c", "import sysconfig; "
                                         "print(sysconfig.get_path('purelib'))"], capture_output=True, text=True,
                                        check=True).stdout.strip())
    from importlib.metadata import distribution

    installed = Path(triton.__file__).parent
    dist_info = Path(distribution("triton")._path)  # noqa: SLF001 - its backends are entry points listed here
    for source in (installed, dist_info):
        if not (site_packages / source.name).exists():
            shutil.copytree(source, site_packages / source.name, copy_function=os.link,
                            ignore=shutil.ignore_patterns("__pycache__"))
    return unprivileged_env, site_packages / "triton"


AS_USER = """
import json, runpy, sys
sys.argv = ["triton_program.py", {kernel!r}]
try:
    runpy.run_path({program!r}, run_name="__main__")
except PermissionError as err:
    print(json.dumps({{"PermissionError": str(err)}}))
"""


def users_running_triton(triton_users: tuple[UnprivilegedEnv, Path], world: Path):  # noqa: ANN201
    """The users, a folder whose `ptxas` counts its runs into `runs` (any user may run and append), and
    `as_user(user, kernel, env) -> (printed JSON, stderr)`: stress.programs.triton_programs.compile as that user, a
    PermissionError printed as {"PermissionError": ...}."""
    users, users_triton = triton_users
    program = world / "triton_program.py"  # the project's checkout may be out of the users' reach
    shutil.copy(PROGRAM, program)
    counting = world / "counting"
    counting.mkdir(mode=0o777)
    counting.chmod(0o777)
    counting_assemblers(counting, users_triton)
    (counting / "runs").write_text("")
    (counting / "runs").chmod(0o666)

    def as_user(user: str, kernel: str, env: dict[str, str]) -> tuple[dict, str]:
        done = users.run(user, AS_USER.format(kernel=kernel, program=str(program)), env=env, cwd=str(world),
                         timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.splitlines()[-1]), done.stderr

    return users, counting, as_user


@needs_root
def test_a_root_owned_ci_cache_serves_its_kernel_and_another_users_new_kernel_compiles_into_their_own(
        triton_users: tuple[UnprivilegedEnv, Path], world_dir: Path) -> None:  # noqa: F811
    """The seed's CI layout: a cache made by root (0755) holding one kernel, used by another uid.
    Plain Triton loads the known kernel and raises PermissionError on a new one; kcache serves the
    known one (no compile), compiles the new one into the user's own root with one warning, and the
    user's next process finds it there."""
    users, counting, as_user = users_running_triton(triton_users, world_dir)
    users_triton = triton_users[1]
    ci = world_dir / "ci-cache"
    env = {"TRITON_CACHE_DIR": str(ci / "triton"), "KCACHE_DIR": str(ci / "kcache"),
           **counting_assemblers(counting, users_triton)}
    for manager in ({}, MANAGER):  # root fills both caches with the add kernel
        filled = child_env(**env, **manager)
        if not manager:
            filled.pop("TRITON_CACHE_MANAGER", None)
        compile_in_fresh_process("add", filled)
    subprocess.run(["chmod", "-R", "u=rwX,go=rX", str(ci)], check=True)
    (counting / "runs").write_text("")

    def counted() -> int:
        return len((counting / "runs").read_text().splitlines())

    known, _ = as_user("kcache-a", "add", env)
    assert "add" in known and counted() == 0
    new, _ = as_user("kcache-a", "softmax", env)
    assert "Permission denied" in new["PermissionError"], new  # plain Triton, as the CI run failed
    plain_runs = counted()
    known, said = as_user("kcache-a", "add", {**env, **MANAGER})
    assert "add" in known and counted() == plain_runs  # served from the root's cache: no compile
    new, said = as_user("kcache-a", "softmax", {**env, **MANAGER})
    assert "softmax" in new and counted() == plain_runs + 1
    assert said.count("is not writable by this process") == 1 and "saving new kernels in" in said, said
    again, _ = as_user("kcache-a", "softmax", {**env, **MANAGER})
    assert again == new and counted() == plain_runs + 1  # the user's next process: a hit in their own root


SHARED_OBJECT = """
import json, sys
from triton.runtime.build import compile_module_from_src
SOURCE = '''
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kcache_noexec_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_kcache_noexec_probe(void) { return PyModule_Create(&module); }
'''
try:
    loaded = compile_module_from_src(SOURCE, "kcache_noexec_probe")
    print(json.dumps({"answer": loaded.answer(), "file": loaded.__file__}))
except ImportError as err:
    print(json.dumps({"ImportError": str(err)}))
"""


def counting_cc(directory: Path) -> Path:
    """A C compiler (CC, which Triton's builds use) that counts its runs in `directory`."""
    directory.mkdir()
    (directory / "cc").write_text(f"#!/bin/sh\necho $$ >> {directory / 'runs'}\nexec gcc \"$@\"\n")
    (directory / "cc").chmod(0o755)
    return directory


def cc_runs(counting: Path) -> int:
    runs = counting / "runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def build_shared_object(counting: Path, **env: str) -> dict:
    """SHARED_OBJECT in a fresh process, its C compiles counted in `counting`: its answer and file."""
    environment = child_env(CC=str(counting / "cc"), **env)
    if "TRITON_CACHE_MANAGER" not in env:  # Triton's own (see program_env)
        environment.pop("TRITON_CACHE_MANAGER", None)
    done = subprocess.run([sys.executable, "-c", SHARED_OBJECT], capture_output=True, text=True, timeout=300,
                          env=environment, cwd=str(PROJECT))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1]) | {"stderr": done.stderr}


@needs_root
def test_on_a_noexec_root_tritons_shared_objects_load_from_private_copies_and_are_built_once(
        tmp_path: Path) -> None:
    """Triton builds its launcher and driver modules as shared objects, puts them in the cache and
    loads them from there. On a noexec root plain Triton cannot load what it just built; kcache
    hands it a private copy where exec is allowed (as it hands every lone file), and the next process
    builds nothing."""
    counting = counting_cc(tmp_path / "cc")

    def build(**env: str) -> dict:
        return build_shared_object(counting, **env)

    with tmpfs(tmp_path / "noexec", size="64m", options="noexec") as mount:
        plain = build(TRITON_CACHE_DIR=str(mount / "plain"))
        assert "failed to map segment" in plain["ImportError"], plain  # plain Triton, on the H100 too
        first = build(KCACHE_DIR=str(mount / "root"), **MANAGER)
        second = build(KCACHE_DIR=str(mount / "root"), **MANAGER)
        builds = cc_runs(counting)
    assert first["answer"] == second["answer"] == 42
    assert builds == 2, builds  # plain Triton's, and kcache's first: the second process built nothing
    assert not first["file"].startswith(str(mount)) and not second["file"].startswith(str(mount))
    assert "could not be loaded" not in second["stderr"] and "kcache:" not in second["stderr"], second["stderr"]


def test_on_a_full_disk_the_kernel_is_still_returned(tmp_path: Path, ptxas: Path) -> None:
    with tmpfs(tmp_path / "small", size="4m") as mount:
        env = program_env(ptxas, mount / "root", **MANAGER)
        compile_in_fresh_process("add", env)  # the root exists, as a cache in use does
        fill_filesystem(mount, leave_bytes=0)
        done = compile_in_fresh_process("matmul", env)
    assert done["matmul"] == compile_in_fresh_process("matmul", program_env(ptxas, tmp_path / "p"))["matmul"]
    assert "No space left on device" in done["stderr"] and "Traceback" not in done["stderr"], done["stderr"]


# ---------------------------------------------------------------- turning it on


@pytest.mark.tilelang
def test_kcache_run_routes_a_programs_triton_kernels_through_kcache_unless_it_named_its_own_manager(
        tmp_path: Path, ptxas: Path) -> None:
    """`kcache run prog.py` (and kcache.install(), which it calls) sets TRITON_CACHE_MANAGER for the
    program and its children; a manager the user named stays theirs; `kcache doctor` says which."""
    root = tmp_path / "root"
    env = program_env(ptxas, root)
    env.pop("TRITON_CACHE_MANAGER", None)
    done = subprocess.run([sys.executable, "-m", "kcache", "run", str(PROGRAM), "add"], capture_output=True,
                          text=True, env=env, cwd=str(PROJECT), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(triton_entries(root)) == 1 and not (root / "plain").exists()
    own = subprocess.run([sys.executable, "-c", "import os, kcache; kcache.install(); "
                          "print(os.environ['TRITON_CACHE_MANAGER'])"], capture_output=True, text=True,
                         env={**env, "TRITON_CACHE_MANAGER": "mine:Manager"}, cwd=str(PROJECT), timeout=300)
    assert own.returncode == 0 and own.stdout.strip() == "mine:Manager", own.stderr[-2000:]
    undone = subprocess.run([sys.executable, "-c", "import os, kcache; kcache.install(); kcache.uninstall(); "
                             "print(os.environ.get('TRITON_CACHE_MANAGER'))"], capture_output=True, text=True,
                            env=env, cwd=str(PROJECT), timeout=300)
    assert undone.returncode == 0 and undone.stdout.strip() == "None", undone.stderr[-2000:]  # Triton's own again
    for manager, says in ((MANAGER, "go through kcache"), ({}, "Triton's own cache")):
        checked = subprocess.run([sys.executable, "-m", "kcache", "--json", "doctor"], capture_output=True,
                                 text=True, env={**env, **manager}, cwd=str(PROJECT), timeout=120)
        (finding,) = [f for f in json.loads(checked.stdout) if f["check"] == "triton"]
        assert says in finding["detail"], finding


def test_triton_groups_count_toward_the_size_bound_and_the_least_recently_used_go_first(
        tmp_path: Path, ptxas: Path) -> None:
    """Triton's own cache has no bound; kcache's KCACHE_MAX_SIZE holds TileLang's kernels and Triton's
    groups together, evicting the least recently used (`kcache prune`, and the gc at a cache's open)."""
    from kcache.maintenance.eviction import evict

    root = tmp_path / "root"
    env = program_env(ptxas, root, **MANAGER)
    compile_in_fresh_process("add", env)
    (oldest,) = triton_entries(root)
    os.utime(root / "triton" / oldest, (1, 1))
    compile_in_fresh_process("softmax", env)
    sizes = {e: sum(f.stat().st_size for f in (root / "triton" / e).iterdir()) for e in triton_entries(root)}
    report = evict(root, max_size=max(sizes.values()), max_age_s=None)
    assert report.evicted == 1 and oldest not in triton_entries(root) and len(triton_entries(root)) == 1


@needs_root
def test_a_group_shared_root_serves_each_members_groups_to_the_other(
        triton_users: tuple[UnprivilegedEnv, Path], world_dir: Path) -> None:  # noqa: F811
    """Group mode (a setgid root of the users' shared group, KCACHE_UMASK=002): what one member
    compiled, the other loads without compiling, both ways."""
    users, counting, as_user = users_running_triton(triton_users, world_dir)
    users_triton = triton_users[1]
    team = world_dir / "team"
    team.mkdir()
    os.chown(team, 0, users.share_gid)
    team.chmod(0o2770)
    env = {"KCACHE_DIR": str(team), "KCACHE_UMASK": "002", **counting_assemblers(counting, users_triton), **MANAGER}

    def counted() -> int:
        return len((counting / "runs").read_text().splitlines())

    first, said = as_user("kcache-a", "add", env)
    assert counted() == 1 and "Traceback" not in said, said
    second, said = as_user("kcache-b", "add,softmax", env)
    assert counted() == 2 and second["add"] == first["add"], said  # b compiled the softmax only
    assert "cannot save" not in said, said
    third, said = as_user("kcache-a", "softmax", env)
    assert counted() == 2 and third["softmax"] == second["softmax"], said
    assert "cannot save" not in said


def test_the_entry_commands_show_verify_and_repair_triton_groups(tmp_path: Path, ptxas: Path) -> None:
    """`kcache ls` lists Triton's groups with their kind, kernel and target; `stats` counts them and
    their size; `show` summarizes one; `verify` checks them whole and `--repair` moves a corrupt one aside."""
    root = tmp_path / "root"
    compile_in_fresh_process("add,softmax", program_env(ptxas, root, **MANAGER))

    def kcache_cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), *argv], capture_output=True,
                              text=True, env=child_env(), cwd=str(PROJECT), timeout=120)

    listed = json.loads(kcache_cli("--json", "ls").stdout)
    assert sorted((e["kind"], e["kernel"], e["target"]) for e in listed) == [
        ("triton", "add_kernel", "cuda sm_90"), ("triton", "softmax_kernel", "cuda sm_90")]
    stats = json.loads(kcache_cli("--json", "stats").stdout)
    assert stats["triton_entries"] == 2 and stats["size_bytes"] == sum(e["size_bytes"] for e in listed)
    assert kcache_cli("verify").returncode == 0
    shown = kcache_cli("show", listed[0]["key"][:12])
    assert shown.returncode == 0 and shown.stdout.splitlines()[0].split() == ["kind", "triton"], shown.stdout
    assert f"kernel      {listed[0]['kernel']}" in shown.stdout and "Triton's metadata:" in shown.stdout
    (cubin,) = (root / "triton" / listed[0]["key"]).glob("*.cubin")
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cubin.chmod(0o644)
    cubin.write_bytes(bytes(data))
    found = kcache_cli("verify")
    assert found.returncode == 1 and f"BAD {listed[0]['key'][:16]}" in found.stdout, found.stdout
    assert kcache_cli("verify", "--repair").returncode == 0
    assert listed[0]["key"] not in triton_entries(root) and len(triton_entries(root)) == 1


def test_the_jit_guard_names_a_triton_compile_and_error_stops_it(tmp_path: Path, ptxas: Path) -> None:
    """A serving process under KCACHE_JIT_GUARD=error compiles nothing, Triton's kernels included: a
    Triton miss raises UnexpectedCompile naming the kernel and key; a hit passes; `warn` compiles
    with one warning."""
    root = tmp_path / "root"
    compile_in_fresh_process("add", program_env(ptxas, root, **MANAGER))
    served = compile_in_fresh_process("add", program_env(ptxas, root, KCACHE_JIT_GUARD="error", **MANAGER))
    assert "add" in served and "JIT guard" not in served["stderr"]
    before = runs(ptxas)
    refused = subprocess.run([sys.executable, str(PROGRAM), "softmax"], capture_output=True, text=True, timeout=300,
                             env=program_env(ptxas, root, KCACHE_JIT_GUARD="error", **MANAGER), cwd=str(PROJECT))
    assert refused.returncode != 0 and runs(ptxas) == before
    assert "UnexpectedCompile" in refused.stderr and "softmax_kernel (Triton)" in refused.stderr, refused.stderr[-2000:]
    warned = compile_in_fresh_process("softmax", program_env(ptxas, root, KCACHE_JIT_GUARD="warn", **MANAGER))
    assert runs(ptxas) == before + 1 and warned["stderr"].count("under the JIT guard") == 1, warned["stderr"]


# ---------------------------------------------------------------- remote tiers


@pytest.fixture(params=["redis", "s3"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """KCACHE_REMOTE of a real redis-server or a real S3-protocol server process, with a secret."""
    if request.param == "redis":
        with redis_server(tmp_path) as (url, _server):
            yield {"KCACHE_REMOTE": url, "KCACHE_REMOTE_SECRET": "s3cret"}
    else:
        with s3_server() as server:
            yield {**server.env, "KCACHE_REMOTE": server.url("triton"), "KCACHE_REMOTE_SECRET": "s3cret"}


def test_nodes_sharing_a_remote_tier_compile_each_group_once(tmp_path: Path, ptxas: Path,
                                                             remote: dict[str, str]) -> None:
    """Three nodes (roots) on one Redis or one bucket, two processes each at once: the matmul is
    compiled once in all, every node gets its group through the tier, and the cubins are one."""
    def node_process(root: Path) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(PROGRAM), "matmul"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(PROJECT),
                                env=program_env(ptxas, root, KT_GATE="1", **remote, **MANAGER))

    processes = [node_process(tmp_path / f"node-{index % 3}") for index in range(6)]
    for process in processes:
        assert process.stdout.readline().strip() == "ready", process.stderr.read()
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()
    outputs = [process.communicate(timeout=300) for process in processes]
    assert all(process.returncode == 0 for process in processes), [err[-2000:] for _, err in outputs]
    assert len({json.loads(out.splitlines()[-1])["matmul"] for out, _ in outputs}) == 1
    assert runs(ptxas) == 1, [err[-1500:] for _, err in outputs]
    assert all(len(triton_entries(tmp_path / f"node-{index}")) == 1 for index in range(3))
    later = compile_in_fresh_process("matmul", program_env(ptxas, tmp_path / "node-new", **remote, **MANAGER))
    assert runs(ptxas) == 1 and "matmul" in later  # a new node: from the tier, no compile


def test_a_corrupt_group_found_under_the_keys_lock_is_moved_aside_without_waiting_for_that_lock(
        tmp_path: Path, ptxas: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A miss looks again once it holds the key's lock; an entry found corrupt then is quarantined by
    the lock already held (a second flock on it, by the same process, would wait KCACHE_LOCK_TIMEOUT)."""
    import time

    from kcache.triton import roots as triton_roots
    from kcache.triton import store as triton_store

    root = tmp_path / "root"
    compile_in_fresh_process("add", program_env(ptxas, root, **MANAGER))
    (entry,) = triton_entries(root)
    (cubin,) = (root / "triton" / entry).glob("*.cubin")
    cubin.chmod(0o644)
    cubin.write_bytes(b"\0" + cubin.read_bytes()[1:])
    monkeypatch.setenv("KCACHE_DIR", str(root))
    monkeypatch.setenv("KCACHE_LOCK_TIMEOUT", "30")
    monkeypatch.setattr(triton_roots, "_roots", {})
    meta = json.loads((root / "triton" / entry / "kcache-triton.json").read_text())
    groups = triton_store.GroupStore(meta["triton_key"], triton_roots.roots())
    with groups.lock(entry) as lock:
        assert lock.acquire(1.0) == 0.0
        started = time.monotonic()
        assert groups.find(entry, meta["group"], locked=True) is None
        assert time.monotonic() - started < 5.0
    assert triton_entries(root) == [] and len(os.listdir(root / "triton" / ".quarantine")) == 1


def test_kcache_record_lists_tritons_groups_and_verify_coverage_of_a_root_counts_them(
        tmp_path: Path, ptxas: Path) -> None:
    """KCACHE_RECORD notes the key of each Triton group a process asks for, hit or miss; `kcache
    verify-coverage --keys FILE` against a root that holds them reports nothing missing, and against
    one that lacks them names the Triton kernel."""
    root, keys = tmp_path / "root", tmp_path / "keys.jsonl"
    compile_in_fresh_process("add", program_env(ptxas, root, KCACHE_RECORD=str(keys), **MANAGER))
    compile_in_fresh_process("add", program_env(ptxas, root, KCACHE_RECORD=str(keys), **MANAGER))  # a hit
    records = [json.loads(line) for line in keys.read_text().splitlines()]
    assert len(records) == 2 and len({r["key"] for r in records}) == 1  # once per process, the hit's too
    assert records[0]["key"] in triton_entries(root) and records[0]["kernel"] == "add_kernel (Triton)"

    def coverage(of: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kcache", "--dir", str(of), "verify-coverage", "--keys", str(keys)],
                              capture_output=True, text=True, env=child_env(), cwd=str(PROJECT), timeout=120)

    assert coverage(root).returncode == 0
    (tmp_path / "other").mkdir()
    empty = coverage(tmp_path / "other")
    assert empty.returncode == 1 and "add_kernel (Triton)" in empty.stdout, empty.stdout


# ---------------------------------------------------------------- bundles


def bundle_cli(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), *argv], capture_output=True, text=True,
                          env=child_env(KCACHE_BUNDLE_SECRET="deploy-secret"), cwd=str(PROJECT), timeout=300)


def test_a_bundle_carries_tritons_groups_and_the_importing_machine_compiles_nothing(
        tmp_path: Path, ptxas: Path) -> None:
    """Record a run's keys on root A, export A to a signed bundle, check its coverage, import it into an
    empty root B: a fresh process on B under KCACHE_JIT_GUARD=error runs no assembler and gets A's cubins."""
    root_a, root_b, keys, bundle = tmp_path / "a", tmp_path / "b", tmp_path / "keys.jsonl", tmp_path / "k.bundle"
    built = compile_in_fresh_process("add,matmul", program_env(ptxas, root_a, KCACHE_RECORD=str(keys), **MANAGER))
    assert runs(ptxas) == 2
    exported = bundle_cli(root_a, "export", str(bundle))
    assert exported.returncode == 0 and "2 entries (2 of them Triton's)" in exported.stdout, exported.stdout
    assert bundle_cli(root_a, "verify-coverage", "--keys", str(keys), str(bundle)).returncode == 0
    imported = bundle_cli(root_b, "import", str(bundle))
    assert imported.returncode == 0 and "2 entries (2 of them Triton's)" in imported.stdout, imported.stderr
    assert triton_entries(root_b) == triton_entries(root_a)
    served = compile_in_fresh_process("add,matmul", program_env(ptxas, root_b, KCACHE_JIT_GUARD="error", **MANAGER))
    assert runs(ptxas) == 2 and {k: served[k] for k in ("add", "matmul")} == {k: built[k] for k in ("add", "matmul")}
    assert bundle_cli(root_b, "verify").returncode == 0


def _rewritten(source: Path, target: Path, edit) -> None:
    """`target`: the tar `source` with each member's (name, bytes) passed through `edit`."""
    import io
    import tarfile

    with tarfile.open(source) as tar_in, tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar_out:
        for member in tar_in.getmembers():
            name, data = edit(member.name, tar_in.extractfile(member).read())
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar_out.addfile(info, io.BytesIO(data))


def test_a_bundle_whose_triton_file_was_changed_or_moved_under_another_key_is_refused_whole(
        tmp_path: Path, ptxas: Path) -> None:
    """A changed byte of a Triton cubin fails its sha256; a Triton entry listed (and signed) under
    another key fails its kcache-triton.json's binding. Either refuses the bundle: B gets nothing."""
    from kcache.bundle.manifest import MANIFEST_MEMBER, SIGNATURE_MEMBER, sign

    root_a, bundle = tmp_path / "a", tmp_path / "k.bundle"
    compile_in_fresh_process("add", program_env(ptxas, root_a, **MANAGER))
    assert bundle_cli(root_a, "export", str(bundle)).returncode == 0
    (key,) = triton_entries(root_a)

    def flip(name: str, data: bytes) -> tuple[str, bytes]:
        return name, (bytes([data[0] ^ 1]) + data[1:] if name.endswith(".cubin") else data)

    other = "f" * 64
    signed_manifest: dict[str, bytes] = {}

    def move(name: str, data: bytes) -> tuple[str, bytes]:
        if name == MANIFEST_MEMBER:
            manifest = json.loads(data)
            manifest["triton"] = {other: manifest["triton"][key]}
            signed_manifest["bytes"] = json.dumps(manifest).encode()
            return name, signed_manifest["bytes"]
        if name == SIGNATURE_MEMBER:
            return name, sign("deploy-secret", signed_manifest["bytes"])
        return name.replace(key, other), data

    for edit, expected in ((flip, "does not match the bundle manifest"), (move, "names another key: an entry copied from another key")):
        changed = tmp_path / f"{edit.__name__}.bundle"
        _rewritten(bundle, changed, edit)
        refused = bundle_cli(tmp_path / edit.__name__, "import", str(changed))
        assert refused.returncode != 0 and expected in refused.stderr, refused.stderr[-2000:]
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert triton_entries(tmp_path / edit.__name__) == []


def test_why_miss_names_the_field_of_tritons_key_that_changed(tmp_path: Path, ptxas: Path) -> None:
    """A compile under another option (num_warps 8, then 4 stored) misses; `kcache why-miss --last`
    compares what the group's files tell of its key with the stored group of the same kernel, and
    names the option, and only it."""
    root = tmp_path / "root"
    compile_in_fresh_process("add", program_env(ptxas, root, **MANAGER))
    compile_in_fresh_process("add", program_env(ptxas, root, KT_OPTIONS='{"num_warps": 8}', **MANAGER))
    assert runs(ptxas) == 2 and len(triton_entries(root)) == 2
    why = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), "--json", "why-miss", "--last"],
                         capture_output=True, text=True, env=child_env(), cwd=str(PROJECT), timeout=120)
    assert why.returncode == 0, why.stderr
    explained = json.loads(why.stdout)
    assert explained["kernel"] == "add_kernel (Triton)" and explained["stored"] is True
    assert [(d["field"], d["stored"], d["yours"]) for d in explained["differences"]] == [("num_warps", 4, 8)], explained
    text = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), "why-miss", explained["key"][:12]],
                          capture_output=True, text=True, env=child_env(), cwd=str(PROJECT), timeout=120)
    assert "differs in 1 field" in text.stdout and "num_warps: stored 4, yours 8" in text.stdout, text.stdout


@pytest.mark.parametrize("listed", [[{"a": 1}], "add.json", None, ["add.json", "other.cubin"]])
def test_an_entry_whose_record_lists_other_files_or_garbage_is_refused_not_a_crash(listed: object) -> None:
    """kcache-triton.json's file list, checked on a read and on a bundle's import: a list of other
    names, or of what is no name at all (unhashable), is a refusal with its reason, never an exception."""
    from kcache.triton.store import META, bound_meta

    files = {META: json.dumps({"key": "k" * 64, "files": listed}).encode(), "add.json": b"{}"}
    assert bound_meta(files, "k" * 64) == f"its files are not the ones {META} lists"
    files[META] = json.dumps({"key": "k" * 64, "files": ["add.json"]}).encode()
    assert isinstance(bound_meta(files, "k" * 64), dict)  # the same entry, its list right: accepted


def test_the_roots_settings_read_without_settings_are_settings_own_and_a_bad_one_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Triton hit reads its roots' settings from the environment without `Settings` (whose dataclass
    costs about 3 ms of import): the same values as `Settings.from_env()`, and a bad value of one it
    reads, or of a process-wide one, fails the manager's open with the variable's name, as there."""
    from kcache.config import Settings
    from kcache.triton.roots import RootSettings

    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "root"))
    for name, value in (("KCACHE_LOCK_TIMEOUT", "15min"), ("KCACHE_READONLY", "yes"),
                        ("KCACHE_ON_UNWRITABLE", "readonly"), ("KCACHE_REMOTE_LEASE", "45s"),
                        ("KCACHE_REMOTE", "redis://localhost:6379/0")):
        monkeypatch.setenv(name, value)
    read = RootSettings.from_env()
    assert read == RootSettings.of(Settings.from_env())
    assert read == RootSettings(tmp_path / "root", "readonly", True, 900.0, "redis://localhost:6379/0", 45.0)
    assert read != RootSettings(tmp_path / "root", "readonly", True, 900.0, "redis://localhost:6379/0", 46.0)
    for name, value in (("KCACHE_LOCK_TIMEOUT", "soon"), ("KCACHE_UMASK", "999"), ("KCACHE_REMOTE", "ftp://x")):
        with monkeypatch.context() as bad:
            bad.setenv(name, value)
            with pytest.raises(ValueError, match=name):
                RootSettings.from_env()
