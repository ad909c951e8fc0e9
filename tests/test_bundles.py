"""Deployment bundles (issue 18): export, verified import, tampering refused with nothing visible,
concurrent importers and a killed importer leaving only whole entries.

Entries come from stress's synthetic compiler (the same store and publish code as TileLang's
entries, with random artifacts), so these run in seconds.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

import kcache
from kcache.bundle import importer as bundle_module
from kcache.bundle.importer import (
    MANIFEST_MEMBER,
    SIGNATURE_MEMBER,
    BundleError,
    export_bundle,
    import_bundle,
)
from kcache.store.components import COMPONENTS, KERNELS
from kcache.store.entries import EntryStore
from stress.programs import synthetic

from .helpers import PROJECT, child_env

SECRET = "bundle-test-secret"
NAMES = [f"k{i}" for i in range(6)]


def filled_root(root: Path) -> list[str]:
    cache = kcache.KernelCache(root, backend=synthetic)
    for name in NAMES:
        cache.get_or_compile(synthetic.SyntheticFunc(name), "synthetic")
    return sorted(EntryStore(root, KERNELS, COMPONENTS).keys())


def visible(root: Path) -> list[str]:
    return sorted(EntryStore(root, KERNELS, COMPONENTS).keys()) if (root / KERNELS).exists() else []


def staging_left(root: Path) -> list[str]:
    staging = root / ".staging"
    return os.listdir(staging) if staging.exists() else []


@pytest.fixture(params=["threads", "processes"])
def staging(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """How the import stages: in threads (what a small bundle gets), or in two stager processes (what
    a large one gets; kcache/bundle/stager.py). The list records each process staging made."""
    made: list[object] = [request.param]
    if request.param == "processes":
        class Counted(bundle_module.ProcessStaging):
            def __init__(self, *args: object) -> None:
                super().__init__(*args)
                made.append(self)

        monkeypatch.setattr(bundle_module, "stager_count", lambda entries, size: 2)
        monkeypatch.setattr(bundle_module, "ProcessStaging", Counted)
    return made


@pytest.fixture
def bundle(tmp_path: Path) -> tuple[Path, list[str]]:
    keys = filled_root(tmp_path / "a")
    path = tmp_path / "kernels.kcb"
    report = export_bundle(path, root=tmp_path / "a", secret=SECRET)
    assert report.entries == len(NAMES) and report.signed and not report.missing
    return path, keys


def test_a_bundle_imports_whole_and_serves_hits_without_compiling(tmp_path: Path, bundle, staging) -> None:
    path, keys = bundle
    report = import_bundle(path, root=tmp_path / "b", toolchain=None, secret=SECRET)
    assert len(staging) == (2 if staging[0] == "processes" else 1)  # the stager processes were used
    assert (report.imported, report.already_present) == (len(keys), 0)
    assert visible(tmp_path / "b") == keys
    for key in keys:
        for name in (tmp_path / "b" / KERNELS / key).iterdir():
            assert name.stat().st_mode & 0o222 == 0, name  # written once: read-only, like every entry file
    cache = kcache.KernelCache(tmp_path / "b", backend=synthetic)
    for name in NAMES:
        cache.get_or_compile(synthetic.SyntheticFunc(name), "synthetic")
    assert cache.stats()["compiles"] == 0 and cache.stats()["disk_hits"] == len(NAMES)
    again = import_bundle(path, root=tmp_path / "b", toolchain=None, secret=SECRET)
    assert (again.imported, again.already_present) == (0, len(keys))


def test_export_selects_keys_and_reports_the_missing(tmp_path: Path) -> None:
    keys = filled_root(tmp_path / "a")
    report = export_bundle(tmp_path / "two.kcb", root=tmp_path / "a", keys=[keys[0], keys[3], "ab" * 32], secret=SECRET)
    assert report.entries == 2 and report.missing == ["ab" * 32]
    import_bundle(tmp_path / "two.kcb", root=tmp_path / "b", toolchain=None, secret=SECRET)
    assert visible(tmp_path / "b") == [keys[0], keys[3]]


def rewrite(source: Path, target: Path, edit: Callable[[str, bytes], list[tuple[tarfile.TarInfo, bytes]]]) -> None:
    """Copy a bundle member by member through `edit(name, data)`, which returns the members to write."""
    with tarfile.open(source) as old, tarfile.open(target, "w") as new:
        for member in old.getmembers():
            data = old.extractfile(member).read()
            for info, content in edit(member.name, data):
                new.addfile(info, io.BytesIO(content) if info.isreg() else None)


def same(name: str, data: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info


def flip_a_byte(keys):
    target = f"{KERNELS}/{keys[2]}/kernel.so"

    def edit(name, data):
        if name == target:
            data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
        return [(same(name, data), data)]
    return edit, "does not match the bundle manifest"


def swap_two_entries(keys):
    """The last two entries' files under each other's names, manifest rewritten to match, unsigned:
    only the entries' own meta.json (which names its key) can tell, and it must be checked before the
    entries ahead of them are published."""
    first, second = keys[-2], keys[-1]
    swapped = {first: second, second: first}

    def edit(name, data):
        if name == SIGNATURE_MEMBER:
            return []
        if name == MANIFEST_MEMBER:
            manifest = json.loads(data)
            entries = manifest["entries"]
            entries[first], entries[second] = entries[second], entries[first]
            data = json.dumps(manifest).encode()
        else:
            parts = name.split("/")
            if len(parts) == 3 and parts[1] in swapped:
                name = f"{parts[0]}/{swapped[parts[1]]}/{parts[2]}"
        return [(same(name, data), data)]
    return edit, "meta.json names the key"


def dot_dot_member(keys):
    def edit(name, data):
        out = [(same(name, data), data)]
        if name == MANIFEST_MEMBER:
            out.append((same("kernels/../../escaped", b"x"), b"x"))
        return out
    return edit, "not a plain relative path"


def symlink_member(keys):
    def edit(name, data):
        out = [(same(name, data), data)]
        if name == MANIFEST_MEMBER:
            link = tarfile.TarInfo(f"{KERNELS}/{keys[0]}/evil")
            link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
            out.append((link, b""))
        return out
    return edit, "not a regular file"


def interleaved_entries(keys):
    """The first entry's last file moved after the second entry's first: every byte still matches the
    signed manifest, but an importer would have to hold entries open without bound."""
    held = []

    def edit(name, data):
        parts = name.split("/")
        if len(parts) == 3 and parts[1] == keys[0] and name.endswith("params.json"):
            held.append((same(name, data), data))
            return []
        if len(parts) == 3 and parts[1] == keys[1] and held:
            return [(same(name, data), data), held.pop()]
        return [(same(name, data), data)]
    return edit, "holds each entry's files together"


@pytest.mark.parametrize("tamper", [flip_a_byte, swap_two_entries, dot_dot_member, symlink_member, interleaved_entries],
                         ids=["flipped byte", "swapped entries", "dot-dot path", "symlink member", "interleaved"])
def test_a_tampered_bundle_is_refused_and_nothing_of_it_is_visible(tmp_path: Path, bundle, tamper, staging) -> None:
    path, keys = bundle
    edit, says = tamper(keys)
    tampered = tmp_path / "tampered.kcb"
    rewrite(path, tampered, edit)
    unsigned = tamper is swap_two_entries
    with pytest.raises(BundleError) as refused:
        import_bundle(tampered, root=tmp_path / "b", toolchain=None, secret=None if unsigned else SECRET,
                      allow_unsigned=unsigned)
    assert says in str(refused.value) and str(tampered) in str(refused.value)
    assert visible(tmp_path / "b") == [] and staging_left(tmp_path / "b") == []
    assert not (tmp_path / "escaped").exists()


def test_a_stager_process_that_dies_refuses_the_import_and_leaves_nothing(tmp_path: Path, bundle,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path, _keys = bundle
    killed: list[int] = []

    class OneKilled(bundle_module.ProcessStaging):
        def __init__(self, *args: object) -> None:
            super().__init__(*args)
            victim = self._stagers[0][0]
            victim.kill()  # a real SIGKILL, before it stages anything
            killed.append(victim.wait())

    monkeypatch.setattr(bundle_module, "stager_count", lambda entries, size: 2)
    monkeypatch.setattr(bundle_module, "ProcessStaging", OneKilled)
    with pytest.raises(BundleError, match=r"a staging process exited with status -9"):
        import_bundle(path, root=tmp_path / "b", toolchain=None, secret=SECRET)
    assert killed == [-9]
    assert visible(tmp_path / "b") == [] and staging_left(tmp_path / "b") == []  # the other's were discarded


def test_a_truncated_a_missigned_and_an_unsigned_bundle_are_refused(tmp_path: Path, bundle, staging) -> None:
    path, _keys = bundle
    cut = tmp_path / "cut.kcb"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    cases = [
        (cut, {"secret": SECRET}, "truncated"),
        (path, {"secret": "another secret"}, "signature does not verify"),
        (path, {"secret": None}, "set KCACHE_BUNDLE_SECRET"),
    ]
    unsigned = tmp_path / "unsigned.kcb"
    export_bundle(unsigned, root=tmp_path / "a", secret=None)
    cases += [(unsigned, {"secret": None}, "not signed"), (unsigned, {"secret": SECRET}, "not signed")]
    for bundle_path, options, says in cases:
        with pytest.raises(BundleError) as refused:
            import_bundle(bundle_path, root=tmp_path / "b", toolchain=None, **options)
        assert says in str(refused.value), (bundle_path.name, options, str(refused.value))
        assert visible(tmp_path / "b") == [] and staging_left(tmp_path / "b") == []
    assert import_bundle(unsigned, root=tmp_path / "b", toolchain=None, secret=None,
                         allow_unsigned=True).imported == len(NAMES)


def test_a_bundle_of_another_toolchain_is_refused_naming_what_differs(tmp_path: Path) -> None:
    root = tmp_path / "a"
    filled_root(root)
    # The synthetic entries name no toolchain; give the bundle one, as TileLang's entries do.
    source = tmp_path / "plain.kcb"
    export_bundle(source, root=root, secret=None)
    toolchained = tmp_path / "toolchained.kcb"

    def edit(name, data):
        if name == MANIFEST_MEMBER:
            manifest = json.loads(data)
            manifest["toolchains"] = [{"tilelang": "0.1.15", "nvcc": "13.0.88"}]
            data = json.dumps(manifest).encode()
        return [(same(name, data), data)]

    rewrite(source, toolchained, edit)
    with pytest.raises(BundleError) as refused:
        import_bundle(toolchained, root=tmp_path / "b", secret=None, allow_unsigned=True,
                      toolchain={"tilelang": "0.1.15", "nvcc": "13.0.90"})
    assert "nvcc: bundle '13.0.88', here '13.0.90'" in str(refused.value)
    assert visible(tmp_path / "b") == []


def test_arch_filter(tmp_path: Path, bundle) -> None:
    path, keys = bundle
    # Synthetic entries are built for no arch: filtered out, all of them.
    report = import_bundle(path, root=tmp_path / "b", toolchain=None, secret=SECRET, archs=["sm_90a"])
    assert (report.imported, report.filtered_out) == (0, len(keys)) and visible(tmp_path / "b") == []


IMPORTER = """
import sys
from kcache.bundle.importer import import_bundle
from kcache.store.entries import EntryStore
seen = []
def pause_at_the_third(step):
    if step == sys.argv[3]:
        seen.append(step)
        if len(seen) == 3:
            print("paused", flush=True)
            sys.stdin.readline()
if sys.argv[3] != "run":
    EntryStore.fault_hook = staticmethod(pause_at_the_third)
report = import_bundle(sys.argv[1], root=sys.argv[2], toolchain=None, secret="bundle-test-secret")
print("done", report.imported, report.already_present, flush=True)
"""


def importer(path: Path, root: Path, pause_at: str) -> subprocess.Popen[str]:
    """An importer in a fresh process that pauses (until a line on its stdin) at the third time it
    reaches publish step `pause_at`, or runs straight through ("run")."""
    return subprocess.Popen([sys.executable, "-c", IMPORTER, str(path), str(root), pause_at], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                            cwd=str(PROJECT))


def kcache_verify(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), "verify"], capture_output=True,
                          text=True, env=child_env(), cwd=str(PROJECT), timeout=120, check=False)


def test_two_importers_at_once_leave_every_entry_whole(tmp_path: Path, bundle) -> None:
    path, keys = bundle
    root = tmp_path / "b"
    first = importer(path, root, "components_written")
    assert first.stdout.readline().strip() == "paused"  # mid-import: its third entry half staged, none visible
    second = importer(path, root, "run")  # imports everything while the first holds its third entry
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    first.stdin.write("\n")
    first.stdin.flush()
    out_first, err_first = first.communicate(timeout=120)
    assert first.returncode == 0, err_first
    counts = [tuple(map(int, o.split()[1:3])) for o in (out_first.strip(), out.strip())]
    assert sum(imported for imported, _ in counts) == len(keys)
    assert all(imported + present == len(keys) for imported, present in counts)
    assert visible(root) == keys and kcache_verify(root).returncode == 0 and staging_left(root) == []


@pytest.mark.parametrize("pause_at, visible_after_kill", [("components_written", 0), ("renamed", 3)],
                         ids=["while staging", "while renaming"])
def test_an_importer_killed_mid_import_leaves_only_whole_entries(tmp_path: Path, bundle, pause_at: str,
                                                                 visible_after_kill: int) -> None:
    """Killed while it stages, an importer has published nothing (the batch renames only once every
    entry is staged and synced); killed between its renames, it leaves whole entries and the rest
    staged. gc removes what it staged; a new import brings the rest."""
    path, keys = bundle
    root = tmp_path / "b"
    victim = importer(path, root, pause_at)
    assert victim.stdout.readline().strip() == "paused"
    victim.kill()
    victim.wait()
    assert len(visible(root)) == visible_after_kill and kcache_verify(root).returncode == 0
    assert staging_left(root)  # the staged entries not renamed, which gc removes
    kcache.KernelCache(root).gc()
    assert staging_left(root) == []
    report = import_bundle(path, root=root, toolchain=None, secret=SECRET)
    assert (report.imported, report.already_present) == (len(keys) - visible_after_kill, visible_after_kill)
    assert visible(root) == keys


def test_the_cli_exports_and_imports(tmp_path: Path) -> None:
    keys = filled_root(tmp_path / "a")

    def cli(*argv: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kcache", *argv], capture_output=True, text=True,
                              env=child_env(**env), cwd=str(PROJECT), timeout=120, check=False)

    path = tmp_path / "cli.kcb"
    done = cli("--dir", str(tmp_path / "a"), "export", str(path), KCACHE_BUNDLE_SECRET=SECRET)
    assert done.returncode == 0 and f"exported {len(keys)} entries" in done.stdout, done.stdout + done.stderr
    refused = cli("--dir", str(tmp_path / "b"), "import", str(path), "--any-toolchain")
    assert refused.returncode == 2 and "set KCACHE_BUNDLE_SECRET" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    done = cli("--dir", str(tmp_path / "b"), "--json", "import", str(path), "--any-toolchain",
               KCACHE_BUNDLE_SECRET=SECRET)
    assert done.returncode == 0 and json.loads(done.stdout)["imported"] == len(keys), done.stderr
    assert visible(tmp_path / "b") == keys
