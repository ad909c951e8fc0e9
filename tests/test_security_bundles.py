"""Security review of the signed bundles (issue 36, part B): what a bundle file can cost the importer
and who can read one.

- memory: a tar header's payload (a GNU long name, a pax header) and a member's bytes are sized and
  refused before they are read, measured as the peak RSS of a real `kcache` process against sparse
  files that claim gigabytes;
- the path: opened once, without blocking or following a link (a FIFO or a symlink there is refused
  at once), and the stager processes read the importer's descriptor, never the path again;
- modes: a bundle is as private as the root it comes from (checked by real unprivileged users'
  reads), and a root that `kcache import` creates is private like any root kcache creates.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcache.bundle import importer as bundle_module
from kcache.bundle.importer import export_bundle, import_bundle
from kcache.bundle.manifest import MANIFEST_MEMBER
from kcache.store import layout
from kcache.store.components import KERNELS, LIBRARY

from .helpers import PROJECT, child_env
from .test_bundles import NAMES, SECRET, filled_root, staging_left, visible
from .test_shared_fs import use_cache
from .unprivileged import UnprivilegedEnv

MiB = 1 << 20
GiB = 1 << 30
# A refused bundle costs the process no more than this: an interpreter with kcache imported is about
# 25 MB resident, and nothing of the bundle is read beyond its header blocks.
PEAK_RSS_BOUND = 128 * MiB
# The measured process may map at most this much, so that a regression fails with a MemoryError at
# once rather than reading gigabytes into a machine that other jobs share.
ADDRESS_SPACE_GUARD = 2 * GiB

# Run `python -m kcache ARGS` as this wrapper's only child, under the address-space guard; print its
# exit status, output and peak RSS (RUSAGE_CHILDREN: this fresh wrapper waited for nothing else).
MEASURED = """
import json, resource, subprocess, sys
guard = int(sys.argv[1])
done = subprocess.run([sys.executable, "-m", "kcache", *sys.argv[2:]], capture_output=True, text=True,
                      preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (guard, guard)))
print(json.dumps({"rc": done.returncode, "stderr": done.stderr,
                  "peak_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""


def measured_kcache(*argv: str, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURED, str(ADDRESS_SPACE_GUARD), *argv], capture_output=True,
                          text=True, env=child_env(**env), cwd=str(PROJECT), timeout=300, check=True)
    return json.loads(done.stdout)


def kcache_cli(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m kcache ARGV`; a minute is far more than a refusal takes (a blocked open never ends)."""
    return subprocess.run([sys.executable, "-m", "kcache", *argv], capture_output=True, text=True,
                          env=child_env(**env), cwd=str(PROJECT), timeout=60, check=False)


def assert_one_clear_line(rc: int, stderr: str, bundle: Path, *says: str) -> None:
    """Refused as a user's mistake: exit status 2, one line naming the bundle and what to do."""
    lines = stderr.strip().splitlines()
    assert rc == 2 and len(lines) == 1, stderr
    assert lines[0].startswith(f"kcache: bundle {bundle}: "), stderr
    assert "Traceback" not in stderr and "MemoryError" not in stderr
    for said in says:
        assert said in lines[0], stderr


def key_file(tmp_path: Path) -> Path:
    keys = tmp_path / "keys.txt"
    keys.write_text("ab" * 32 + "\n")
    return keys


@pytest.fixture
def signed_bundle(tmp_path: Path) -> tuple[Path, list[str]]:
    keys = filled_root(tmp_path / "a")
    path = tmp_path / "kernels.kcb"
    export_bundle(path, root=tmp_path / "a", secret=SECRET)
    return path, keys


# ---------------------------------------------------------------- memory: sizes checked before reads


def header_block(kind: bytes, claimed: int) -> bytes:
    """A tar header of type `kind` whose payload claims `claimed` bytes."""
    info = tarfile.TarInfo("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "PaxHeaders/x")
    info.type = kind
    info.size = claimed
    return info.tobuf(format=tarfile.GNU_FORMAT if kind == tarfile.GNUTYPE_LONGNAME else tarfile.USTAR_FORMAT)


@pytest.mark.parametrize("claimed", [768 * MiB, 4 * GiB], ids=["768MiB", "4GiB"])
@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE], ids=["gnu long name", "pax header"])
def test_a_header_claiming_gigabytes_is_refused_before_its_payload_is_read(tmp_path: Path, kind: bytes,
                                                                          claimed: int) -> None:
    """A "bundle" of one header block whose payload claims gigabytes, the claim a hole of a sparse file
    (every claimed byte can be read, as zeros): `kcache import` and `kcache verify-coverage` refuse it
    in one line, reading nothing of it."""
    path = tmp_path / "claims.kcb"
    with open(path, "wb") as out:
        out.write(header_block(kind, claimed))
        out.truncate(tarfile.BLOCKSIZE + claimed + 2 * tarfile.BLOCKSIZE)
    assert os.stat(path).st_blocks * 512 <= 64 * 1024  # sparse: the claim is a hole
    for argv in (("--dir", str(tmp_path / "b"), "import", str(path), "--any-toolchain"),
                 ("verify-coverage", "--keys", str(key_file(tmp_path)), str(path))):
        outcome = measured_kcache(*argv)
        assert outcome["peak_rss"] < PEAK_RSS_BOUND, (argv, outcome)
        assert_one_clear_line(outcome["rc"], outcome["stderr"], path, f"claims {claimed} bytes",
                              "export it again")


def write_archive(target: Path, members: list[tuple[str, bytes, int]]) -> None:
    """A tar archive of (name, data, claimed size): a member claiming more than its data is followed
    by a hole up to its claim (a sparse file: every claimed byte can be read, as zeros)."""
    with open(target, "wb") as out:
        for name, data, claimed in members:
            info = tarfile.TarInfo(name)
            info.size = claimed
            info.mode = 0o444
            out.write(info.tobuf(format=tarfile.PAX_FORMAT))
            start = out.tell()
            out.write(data)
            out.seek(start + -(-claimed // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE)
        out.write(bytes(2 * tarfile.BLOCKSIZE))


def test_a_member_inflated_past_its_signed_size_is_refused_before_it_is_read(tmp_path: Path,
                                                                             signed_bundle) -> None:
    """A legitimately signed bundle replayed with one member's header claiming 900 MiB (the manifest
    says about 90 KB): the import refuses it from the header, before reading a byte of the member."""
    path, keys = signed_bundle
    inflated_name = f"{KERNELS}/{keys[0]}/{LIBRARY}"
    inflated = 900 * MiB
    with tarfile.open(path) as original:
        members = [(m.name, original.extractfile(m).read(), m.size) for m in original.getmembers()]
    listed = {name: size for name, _data, size in members}[inflated_name]
    replayed = tmp_path / "replayed.kcb"
    write_archive(replayed, [(name, data, inflated if name == inflated_name else size)
                             for name, data, size in members])
    outcome = measured_kcache("--dir", str(tmp_path / "b"), "import", str(replayed), "--any-toolchain",
                              KCACHE_BUNDLE_SECRET=SECRET)
    assert outcome["peak_rss"] < PEAK_RSS_BOUND, outcome
    assert_one_clear_line(outcome["rc"], outcome["stderr"], replayed,
                          f"{inflated_name} is {inflated} bytes in the archive, but its manifest lists {listed}",
                          "export it again")
    assert visible(tmp_path / "b") == [] and staging_left(tmp_path / "b") == []
    # The same archive with honest sizes imports: the refusal was the inflated header's alone.
    honest = tmp_path / "honest.kcb"
    write_archive(honest, members)
    assert import_bundle(honest, root=tmp_path / "c", toolchain=None, secret=SECRET).imported == len(keys)


def test_a_manifest_is_held_whole_only_once_its_signature_verifies(tmp_path: Path, signed_bundle) -> None:
    """A forged bundle whose manifest claims 200 MiB (under the manifest's 256 MiB cap; a hole of a
    sparse file), with a signature that does not verify: the import streams the manifest through the
    HMAC a chunk at a time and refuses it, never holding it whole."""
    path, _keys = signed_bundle
    with tarfile.open(path) as original:
        members = [(m.name, original.extractfile(m).read(), m.size) for m in original.getmembers()]
    forged = tmp_path / "forged.kcb"
    claimed = 200 * MiB
    write_archive(forged, [(members[0][0], members[0][1], claimed), *members[1:]])
    outcome = measured_kcache("--dir", str(tmp_path / "b"), "import", str(forged), "--any-toolchain",
                              KCACHE_BUNDLE_SECRET=SECRET)
    assert outcome["peak_rss"] < PEAK_RSS_BOUND, outcome
    assert_one_clear_line(outcome["rc"], outcome["stderr"], forged, "signature does not verify")


def test_a_manifest_nested_past_the_recursion_limit_is_one_clear_line(tmp_path: Path) -> None:
    """JSON nested deeper than Python's recursion limit was a RecursionError traceback out of
    `kcache verify-coverage` (which reads the manifest of a bundle it is given, signed or not)."""
    path = tmp_path / "nested.kcb"
    write_archive(path, [(MANIFEST_MEMBER, b"[" * 100_000, 100_000)])
    done = kcache_cli("verify-coverage", "--keys", str(key_file(tmp_path)), str(path))
    assert_one_clear_line(done.returncode, done.stderr, path, "nested too deeply")


# ---------------------------------------------------------------- the path: opened once


@pytest.mark.parametrize("planted", ["fifo", "symlink"])
def test_a_fifo_or_a_symlink_at_the_bundle_path_is_refused_at_once(tmp_path: Path, signed_bundle,
                                                                    planted: str) -> None:
    """Nobody writes the FIFO: an open that waits for a writer would never return. The symlink points
    at a good bundle: it is refused for being a link, not for where it points."""
    good, _keys = signed_bundle
    path = tmp_path / "planted.kcb"
    if planted == "fifo":
        os.mkfifo(path)
        says = ("it is a FIFO, not a regular file",)
    else:
        path.symlink_to(good)
        says = ("it is a symbolic link", "name the bundle file itself")
    for argv in (("--dir", str(tmp_path / "b"), "import", str(path), "--any-toolchain"),
                 ("verify-coverage", "--keys", str(key_file(tmp_path)), str(path))):
        done = kcache_cli(*argv, KCACHE_BUNDLE_SECRET=SECRET)
        assert_one_clear_line(done.returncode, done.stderr, path, *says)
    assert visible(tmp_path / "b") == []


def test_stager_processes_read_the_descriptor_the_importer_checked_never_the_path(
        tmp_path: Path, signed_bundle, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundle's path is swapped for another file after the importer opened and checked it, just
    before the stager processes start: they stage the file the importer checked, whole."""
    path, keys = signed_bundle
    swapped: list[Path] = []

    class SwappedFirst(bundle_module.ProcessStaging):
        def __init__(self, *args: object) -> None:
            other = path.with_name("other.kcb")
            other.write_bytes(os.urandom(path.stat().st_size))
            os.replace(other, path)
            swapped.append(path)
            super().__init__(*args)

    monkeypatch.setattr(bundle_module, "stager_count", lambda entries, size: 2)
    monkeypatch.setattr(bundle_module, "ProcessStaging", SwappedFirst)
    report = import_bundle(path, root=tmp_path / "b", toolchain=None, secret=SECRET)
    assert swapped == [path]  # the stager processes were used, after the swap
    assert report.imported == len(keys) and visible(tmp_path / "b") == keys


# ---------------------------------------------------------------- modes: as private as the root


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory every user can reach (pytest's own tmp_path is 0700 under root)."""
    path = Path(tempfile.mkdtemp(prefix="kcache-security-bundles-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def can_read(env: UnprivilegedEnv, user: str, path: Path, *, with_share_group: bool = True) -> str:
    done = env.run(user, f"try:\n    open({str(path)!r}, 'rb').read(1)\n    print('read')\n"
                         "except PermissionError:\n    print('denied')\n", extra_groups=with_share_group)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_bundle_of_a_private_root_is_private_wherever_it_is_written(
        unprivileged_env: UnprivilegedEnv, world_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    root = tmp_path / "private-root"
    filled_root(root)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    bundle = world_dir / "private.kcb"  # a directory every user can enter
    assert export_bundle(bundle, root=root, secret=SECRET).entries == len(NAMES)
    assert can_read(unprivileged_env, "kcache-a", bundle) == "denied"
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o600


EXPORT = "from kcache.bundle.importer import export_bundle\nexport_bundle({bundle!r}, root={root!r}, secret=None)"


def test_a_bundle_of_a_group_shared_root_is_readable_by_that_group_only(
        unprivileged_env: UnprivilegedEnv, world_dir: Path) -> None:  # noqa: F811
    env = unprivileged_env
    team = world_dir / "team"  # a team root, as docs/operations.md sets one up
    team.mkdir()
    os.chown(team, 0, env.share_gid)
    team.chmod(0o2770)
    out = world_dir / "out"  # the exporter's own directory, of its own group
    out.mkdir()
    uid, gid = env.users["kcache-b"]
    os.chown(out, uid, gid)
    bundle = out / "team.kcb"
    use_cache(env, "kcache-b", team, ["k0", "k1"], EXPORT.format(bundle=str(bundle), root=str(team)),
              KCACHE_UMASK="007")
    assert can_read(env, "kcache-a", bundle) == "read"  # a member of the root's group
    assert can_read(env, "kcache-a", bundle, with_share_group=False) == "denied"  # anyone else
    info = bundle.stat()
    assert (stat.S_IMODE(info.st_mode), info.st_gid) == (0o640, env.share_gid)


def test_a_root_that_kcache_import_creates_is_private_and_marked(tmp_path: Path, signed_bundle) -> None:
    path, keys = signed_bundle
    root = tmp_path / "new" / "root"
    done = kcache_cli("--dir", str(root), "import", str(path), "--any-toolchain", KCACHE_BUNDLE_SECRET=SECRET)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and (root / layout.ROOT_MARKER).is_file()
    assert visible(root) == keys
