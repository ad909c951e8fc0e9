"""Security review, issue 54 ("Security, third review"): the untried surface of kcache's Triton entries.

1. Triton's entries in the remote tiers (a real redis-server, a real S3-protocol server), with and
   without KCACHE_REMOTE_SECRET: a value (manifest) of one key replayed under another (another
   group's, a lone file's such as a launcher's), an unsigned forgery where a secret is configured, an
   oversized value and a wrong Redis type, and an entry whose kcache-triton.json lies. Each must be
   refused with a warning, the kernel compiled locally, never an exception out of Triton's compile and
   never the planted bytes loaded. Compiles are counted by Triton's assembler (tests/test_triton.py).
2. Signed bundles with a `triton` section: names that climb or are absolute, a slash in a file's
   name, a member the manifest does not list, a listed file missing, kcache-triton.json that names
   another key, group or file set, a symlink or hard link member. Each refuses the whole bundle in
   one line, and nothing is left in the importing root's triton/.
3. TRITON_CACHE_MANAGER, which `kcache run` and `kcache.install()` put into os.environ: what the
   program's children see (one whose Python has no kcache), `kcache.uninstall()`, and a manager the
   user chose.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

from kcache import triton as kcache_triton  # noqa: E402

from .helpers import PROJECT, child_env  # noqa: E402
from .redis_server import redis_server  # noqa: E402
from .s3_server import s3_server  # noqa: E402
from .test_triton import MANAGER, program_env, ptxas, runs, triton_entries  # noqa: E402, F401 - ptxas: a fixture

SECRET = "cluster-secret"
BUNDLE_SECRET = "deploy-secret"
NAMESPACE_PREFIX = "kcache:triton:v1:"  # Redis: kcache.triton.roots._remote's namespace
S3_ENTRIES = "triton/v1/entries/"  # the same namespace in a bucket (kcache.tiers.s3_tier.S3Tier.entry_name)
META = "kcache-triton.json"

# A launcher-like file that Triton puts alone (no group): its key is another Triton key (base32 of a sha256).
LONE_KEY = base64.b32encode(hashlib.sha256(b"a launcher's source").digest()).decode().rstrip("=")
LONE_FILE = "__triton_launcher.so"
LONE_BYTES = b"\x7fELF a launcher's bytes"

# A node: compile the kernels named in argv[1] (stress.programs.triton_programs.compile's), then put and get the lone
# files of argv[2] through kcache's manager, as Triton's driver does for its launcher; print one JSON
# object: each kernel's cubin sha256, and each lone file's sha256 as get_file returned it (or None).
NODE = """
import hashlib, json, sys
sys.path.insert(0, {project!r})
from kcache.triton.manager import CacheManager
from stress.programs.triton_programs.compile import compile_kernel
out = {{name: compile_kernel(name) for name in sys.argv[1].split(",") if name}}
lone = json.loads(sys.argv[2])
for key, name, data in lone.get("put", []):
    CacheManager(key).put(bytes.fromhex(data), name, binary=True)
for key, name in lone.get("get", []):
    path = CacheManager(key).get_file(name)
    out[name] = None if path is None else hashlib.sha256(open(path, "rb").read()).hexdigest()
print(json.dumps(out))
"""


def node(root: Path, ptxas: Path, kernels: str, env: dict[str, str], lone: dict | None = None,  # noqa: F811
         **extra: str) -> dict[str, Any]:
    """A fresh process on a node whose root is `root`: its JSON output and its stderr."""
    done = subprocess.run([sys.executable, "-c", NODE.format(project=str(PROJECT)), kernels, json.dumps(lone or {})],
                          capture_output=True, text=True, env=program_env(ptxas, root, **env, **extra, **MANAGER),
                          cwd=str(PROJECT), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]  # nothing escaped Triton's compile
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1]) | {"stderr": done.stderr}


def entry_files(root: Path, key: str) -> dict[str, bytes]:
    directory = root / "triton" / key
    return {name: (directory / name).read_bytes() for name in os.listdir(directory)}


def group_keys(root: Path) -> dict[str, str]:
    """{group or lone file name: entry key} of a root's Triton entries."""
    found = {}
    for key in triton_entries(root):
        meta = json.loads((root / "triton" / key / META).read_text())
        found[meta["group"] or meta["files"][0]] = key
    return found


def lone_key() -> str:
    from kcache.triton.store import entry_key

    return entry_key(LONE_KEY, LONE_FILE)


def with_manifest(files: dict[str, bytes]) -> dict[str, bytes]:
    """`files` with a manifest.json that lists them (as the store writes it)."""
    from kcache.store.manifest import MANIFEST_NAME, format_manifest

    plain = {name: data for name, data in files.items() if name != MANIFEST_NAME}
    listing = {name: (len(data), hashlib.sha256(data).hexdigest()) for name, data in plain.items()}
    return {**plain, MANIFEST_NAME: format_manifest(listing)}


# ---------------------------------------------------------------- the remote tiers, as their writer sees them


@dataclass
class Remote:
    """A real Redis or S3 server holding Triton's entries, and raw access to it (an attacker's, or a
    secret holder's where `sign` is given the secret)."""

    kind: str
    env: dict[str, str]
    client: Any

    def name(self, key: str) -> str:
        return (NAMESPACE_PREFIX if self.kind == "redis" else S3_ENTRIES) + key

    def raw(self, key: str) -> bytes | None:
        if self.kind == "redis":
            return self.client.get(self.name(key))
        import obstore

        try:
            return bytes(obstore.get(self.client, self.name(key)).bytes())
        except FileNotFoundError:
            return None

    def put_raw(self, key: str, data: bytes) -> None:
        if self.kind == "redis":
            self.client.set(self.name(key), data)
        else:
            import obstore

            obstore.put(self.client, self.name(key), data)

    def copy(self, source: str, target: str) -> None:
        """The stored value (manifest) of `source` replayed, byte for byte, under `target`."""
        data = self.raw(source)
        assert data is not None, f"nothing stored under {source}"
        self.put_raw(target, data)

    def plant(self, key: str, files: dict[str, bytes], secret: str | None) -> None:
        """A well-formed entry of `files` under `key`, signed with `secret` (None: unsigned)."""
        from kcache.store.manifest import MANIFEST_NAME

        files = with_manifest(files)
        if self.kind == "redis":
            from kcache.tiers.redis_tier import pack

            self.put_raw(key, pack(files, secret.encode() if secret else None, self.name(key)))
            return
        import obstore

        from kcache.tiers.s3_manifest import manifest_body

        plain = {name: data for name, data in files.items() if name != MANIFEST_NAME}
        listing = sorted((name, len(data), hashlib.sha256(data).hexdigest()) for name, data in plain.items())
        for _name, _size, digest in listing:
            obstore.put(self.client, f"blobs/{digest}", plain[_name])
        self.put_raw(key, manifest_body(key, self.name(key), listing, plain, secret.encode() if secret else None))


@pytest.fixture(params=["redis", "s3"])
def remote(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Remote]:
    if request.param == "redis":
        import redis

        with redis_server(tmp_path) as (url, _server):
            client = redis.Redis.from_url(url)
            try:
                yield Remote("redis", {"KCACHE_REMOTE": url}, client)
            finally:
                client.close()
    else:
        with s3_server() as server:
            for name, value in server.env.items():
                monkeypatch.setenv(name, value)
            from kcache.tiers.s3_bucket import open_bucket

            url = server.url("triton-surface")
            yield Remote("s3", {**server.env, "KCACHE_REMOTE": url}, open_bucket(url))


def refusals(stderr: str, key: str) -> list[str]:
    """The lines of `stderr` that refuse the entry `key` (a remote value, or the entry once fetched)."""
    return [line for line in stderr.splitlines() if key in line and ("ignoring" in line or "quarantined" in line)]


def compiled_node_a(tmp_path: Path, ptxas: Path, remote: Remote, secret: str | None,  # noqa: F811
                    kernels: str = "add,softmax") -> tuple[dict[str, Any], dict[str, str]]:
    """Node A compiles `kernels` and puts the lone launcher, uploading all to the tier: its output, and
    {group or file: entry key}."""
    env = {**remote.env, **({"KCACHE_REMOTE_SECRET": secret} if secret else {})}
    first = node(tmp_path / "node-a", ptxas, kernels, env, {"put": [[LONE_KEY, LONE_FILE, LONE_BYTES.hex()]]})
    keys = group_keys(tmp_path / "node-a")
    assert keys[LONE_FILE] == lone_key()
    for key in keys.values():
        assert remote.raw(key) is not None, f"node A did not upload {key}"
    return first, keys


SECRETS = pytest.mark.parametrize("secret", [None, SECRET], ids=["no-secret", "secret"])


# ---------------------------------------------------------------- 1 (a), (b): substitution and forgery


@SECRETS
def test_a_triton_entry_replayed_under_another_key_is_refused_and_the_kernel_compiled_here(
        tmp_path: Path, ptxas: Path, remote: Remote, secret: str | None) -> None:  # noqa: F811
    """Node A uploads the groups of add and softmax and a lone launcher. Then, byte for byte, softmax's
    value is replayed under add's key, the launcher's under softmax's, and add's under the launcher's.
    Node B gets none of them: each refused with a warning naming its key, both kernels compiled here
    (with A's cubins), and the launcher a miss (None: Triton builds it), never add's file."""
    first, keys = compiled_node_a(tmp_path, ptxas, remote, secret)
    add, softmax, lone = keys["add_kernel.json"], keys["softmax_kernel.json"], keys[LONE_FILE]
    assert runs(ptxas) == 2
    replayed = {add: remote.raw(softmax), softmax: remote.raw(lone), lone: remote.raw(add)}
    for key, value in replayed.items():  # each read before any was replaced
        remote.put_raw(key, value)
    for key, value in replayed.items():
        assert remote.raw(key) == value  # the attack is in place
    env = {**remote.env, **({"KCACHE_REMOTE_SECRET": secret} if secret else {})}
    second = node(tmp_path / "node-b", ptxas, "add,softmax", env, {"get": [[LONE_KEY, LONE_FILE]]})
    assert runs(ptxas) == 4, second["stderr"][-3000:]  # both compiled here
    assert (second["add"], second["softmax"]) == (first["add"], first["softmax"])
    assert second[LONE_FILE] is None, "the launcher's name served another entry's file"
    why = "signature does not verify" if secret else "names the key"  # Redis's value, or S3's manifest
    counts = {}
    for name, key in (("add", add), ("softmax", softmax), ("launcher", lone)):
        said = refusals(second["stderr"], key)
        assert said and all(why in line for line in said), f"{name}: {said} {second['stderr'][-3000:]}"
        counts[name] = len(said)
    # One warning per refused value (each GET of it in Redis, each manifest read in S3, warns again).
    assert counts == {"add": 1, "softmax": 1, "launcher": 1}, f"warnings per refused value: {counts}"


@pytest.mark.parametrize("how", ["unsigned", "another secret"])
def test_a_triton_entry_forged_without_the_secret_is_refused(
        tmp_path: Path, ptxas: Path, remote: Remote, how: str) -> None:  # noqa: F811
    """With KCACHE_REMOTE_SECRET set, a whole well-formed entry for add's key (softmax's cubin under
    add's names, a kcache-triton.json that names add's key, Triton key and group), unsigned or signed
    with another secret, is refused: add is compiled here with its own cubin."""
    first, keys = compiled_node_a(tmp_path, ptxas, remote, SECRET)
    add, softmax = keys["add_kernel.json"], keys["softmax_kernel.json"]
    genuine = entry_files(tmp_path / "node-a", add)
    theirs = entry_files(tmp_path / "node-a", softmax)
    forged = {name: data for name, data in genuine.items() if name != "manifest.json"}
    forged["add_kernel.cubin"] = theirs["softmax_kernel.cubin"]  # the attacker's code under add's name
    remote.plant(add, forged, None if how == "unsigned" else "not-the-secret")
    before = runs(ptxas)
    second = node(tmp_path / "node-b", ptxas, "add", {**remote.env, "KCACHE_REMOTE_SECRET": SECRET})
    assert runs(ptxas) == before + 1 and second["add"] == first["add"], second["stderr"][-3000:]
    said = refusals(second["stderr"], add)
    assert said and all("signature does not verify" in line for line in said), second["stderr"][-3000:]
    assert len(said) == 1, f"{len(said)} warnings for one refused value: {said}"


# ---------------------------------------------------------------- 1 (c): oversized, wrong type


def test_an_oversized_or_mistyped_triton_value_in_redis_is_refused_before_it_is_downloaded(
        tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    """8 MiB under add's key against KCACHE_REMOTE_MAX_ENTRY=1MiB, a hash under softmax's: measured in
    Redis, never sent (Redis's own output counter), each refused with one warning, both kernels compiled
    here, Redis never marked down."""
    import redis

    with redis_server(tmp_path) as (url, _server):
        client = redis.Redis.from_url(url)
        try:
            remote = Remote("redis", {"KCACHE_REMOTE": url}, client)
            first, keys = compiled_node_a(tmp_path, ptxas, remote, None)
            add, softmax = keys["add_kernel.json"], keys["softmax_kernel.json"]
            client.set(remote.name(add), b"\0" * (8 << 20))
            client.delete(remote.name(softmax))
            client.hset(remote.name(softmax), "field", "planted")
            client.config_resetstat()
            before = runs(ptxas)
            second = node(tmp_path / "node-b", ptxas, "add,softmax", remote.env, KCACHE_REMOTE_MAX_ENTRY="1MiB")
            sent = int(client.info("stats")["total_net_output_bytes"])
        finally:
            client.close()
    assert runs(ptxas) == before + 2 and (second["add"], second["softmax"]) == (first["add"], first["softmax"])
    assert sent < 1 << 20, f"{sent} bytes sent: the planted 8 MiB was downloaded"
    over, hashed = refusals(second["stderr"], add), refusals(second["stderr"], softmax)
    assert over and all("over the 1048576 of KCACHE_REMOTE_MAX_ENTRY (not downloaded)" in line for line in over)
    assert hashed and all("a Redis hash where a string value belongs" in line for line in hashed), hashed
    assert "is unavailable" not in second["stderr"], second["stderr"][-3000:]
    assert (len(over), len(hashed)) == (1, 1), f"warnings per refused value: {over} {hashed}"


def test_an_oversized_triton_manifest_or_blob_in_s3_is_refused_before_it_is_downloaded(
        tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    """In a bucket: a 1 MiB "manifest" under add's key (over the 64 KiB of one), a manifest for softmax
    listing an 8 MiB cubin (over KCACHE_REMOTE_MAX_ENTRY=1MiB), and the launcher's blob swapped for
    one of another size: each refused from sizes alone, with one warning; nothing served."""
    import obstore

    with s3_server() as server:
        from kcache.tiers.s3_bucket import open_bucket

        for name, value in server.env.items():
            os.environ[name] = value
        try:
            url = server.url("triton-oversized")
            remote = Remote("s3", {**server.env, "KCACHE_REMOTE": url}, open_bucket(url))
            first, keys = compiled_node_a(tmp_path, ptxas, remote, None)
            add, softmax, lone = keys["add_kernel.json"], keys["softmax_kernel.json"], keys[LONE_FILE]
            remote.put_raw(add, b" " * (1 << 20))
            big = {name: data for name, data in entry_files(tmp_path / "node-a", softmax).items()
                   if name != "manifest.json"}
            big["softmax_kernel.cubin"] = b"\0" * (8 << 20)
            remote.plant(softmax, big, None)
            listing = json.loads(remote.raw(lone))
            (digest,) = [d for name, _size, d in listing["files"] if name == LONE_FILE]
            obstore.put(remote.client, f"blobs/{digest}", b"\0" * (4 << 20))
            before = runs(ptxas)
            second = node(tmp_path / "node-b", ptxas, "add,softmax", remote.env, {"get": [[LONE_KEY, LONE_FILE]]},
                          KCACHE_REMOTE_MAX_ENTRY="1MiB")
        finally:
            for name in server.env:
                os.environ.pop(name, None)
    assert runs(ptxas) == before + 2 and (second["add"], second["softmax"]) == (first["add"], first["softmax"])
    assert second[LONE_FILE] is None
    counts = {}
    for name, key, why in (("add", add, "not downloaded"), ("softmax", softmax, "KCACHE_REMOTE_MAX_ENTRY (not downloaded)"),
                           ("launcher", lone, "not downloaded")):
        said = refusals(second["stderr"], key)
        assert said and all(why in line for line in said), (name, said, second["stderr"][-3000:])
        counts[name] = len(said)
    assert "is unavailable" not in second["stderr"], second["stderr"][-3000:]
    assert counts == {"add": 1, "softmax": 1, "launcher": 1}, f"warnings per refused value: {counts}"


# ---------------------------------------------------------------- 1 (d): kcache-triton.json that lies


def _lies(genuine: dict[str, bytes], other: dict[str, bytes]) -> dict[str, Callable[[dict], dict]]:
    """Edits of add's entry (files without manifest.json) whose kcache-triton.json lies."""
    other_meta = json.loads(other[META])

    def meta_edit(**changes: Any) -> Callable[[dict], dict]:
        def edit(files: dict) -> dict:
            meta = json.loads(files[META])
            meta.update(changes)
            return {**files, META: json.dumps(meta).encode()}
        return edit

    listed = sorted(name for name in genuine if name not in (META, "manifest.json"))

    def unlisted_json(files: dict) -> dict:  # Triton takes a group's first .json as its metadata
        return {**files, "a_kernel.json": other[other_meta["group"]]}

    return {
        "another triton_key": meta_edit(triton_key=other_meta["triton_key"]),
        "another group": meta_edit(group=other_meta["group"]),
        "no group": meta_edit(group=None),
        "another key": meta_edit(key=other_meta["key"]),
        "fewer files": meta_edit(files=[name for name in listed if not name.endswith(".ptx")]),
        "more files": meta_edit(files=[*listed, "add_kernel.extra"]),
        "an unlisted file": unlisted_json,
    }


LIES = ["another triton_key", "another group", "no group", "another key", "fewer files", "more files",
        "an unlisted file"]


@SECRETS
def test_a_triton_entry_whose_record_lies_is_refused_and_compiled_here(
        tmp_path: Path, ptxas: Path, remote: Remote, secret: str | None) -> None:  # noqa: F811
    """For each lie of kcache-triton.json, a well-formed entry under add's key, signed with the secret
    where one is set (the tier's check passes, or not: the Triton check must hold either way): node B
    (a fresh root each) refuses it with one warning, and compiles add here."""
    first, keys = compiled_node_a(tmp_path, ptxas, remote, secret)
    add, softmax = keys["add_kernel.json"], keys["softmax_kernel.json"]
    genuine = {n: d for n, d in entry_files(tmp_path / "node-a", add).items() if n != "manifest.json"}
    other = entry_files(tmp_path / "node-a", softmax)
    env = {**remote.env, **({"KCACHE_REMOTE_SECRET": secret} if secret else {})}
    failures, counts = [], {}
    for index, (lie, edit) in enumerate(_lies(genuine, other).items()):
        remote.plant(add, edit(genuine), secret)
        assert remote.raw(add) is not None
        before = runs(ptxas)
        second = node(tmp_path / f"node-b{index}", ptxas, "add", env)
        said = refusals(second["stderr"], add)
        counts[lie] = len(said)
        if runs(ptxas) != before + 1 or second["add"] != first["add"] or not said:
            failures.append(f"{lie}: {runs(ptxas) - before} compiles, refusals: {said}")
    assert sorted(LIES) == sorted(counts)
    assert not failures, "\n".join(failures)  # each lie refused, add compiled here
    assert set(counts.values()) == {1}, f"warnings per refused entry: {counts}"


# ---------------------------------------------------------------- 2: bundles with a triton section


def bundle_cli(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), *argv], capture_output=True, text=True,
                          env=child_env(KCACHE_BUNDLE_SECRET=BUNDLE_SECRET), cwd=str(PROJECT), timeout=300)


@pytest.fixture
def triton_bundle(tmp_path: Path, ptxas: Path) -> tuple[Path, dict[str, str]]:  # noqa: F811
    """A signed bundle of a root holding add's group and a lone launcher; {group or file: key}."""
    root = tmp_path / "a"
    node(root, ptxas, "add", {}, {"put": [[LONE_KEY, LONE_FILE, LONE_BYTES.hex()]]})
    bundle = tmp_path / "triton.kcb"
    exported = bundle_cli(root, "export", str(bundle))
    assert exported.returncode == 0 and "2 of them Triton's" in exported.stdout, exported.stdout + exported.stderr
    return bundle, group_keys(root)


@dataclass
class Member:
    name: str
    data: bytes = b""
    type: bytes = tarfile.REGTYPE
    link: str = ""


def members_of(bundle: Path) -> list[Member]:
    with tarfile.open(bundle) as tar:
        return [Member(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def write_bundle(path: Path, members: list[Member], manifest: dict | None = None) -> Path:
    """The tar of `members`; with `manifest`, that manifest (re-signed) in place of the first two."""
    from kcache.bundle.manifest import MANIFEST_MEMBER, SIGNATURE_MEMBER, sign

    if manifest is not None:
        data = json.dumps(manifest).encode()
        members = [Member(MANIFEST_MEMBER, data), Member(SIGNATURE_MEMBER, sign(BUNDLE_SECRET, data)),
                   *[m for m in members if m.name not in (MANIFEST_MEMBER, SIGNATURE_MEMBER)]]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for member in members:
            info = tarfile.TarInfo(member.name)
            info.type = member.type
            info.linkname = member.link
            info.size = len(member.data) if member.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(member.data) if member.type == tarfile.REGTYPE else None)
    return path


def manifest_of(members: list[Member]) -> dict:
    from kcache.bundle.manifest import MANIFEST_MEMBER

    return json.loads(next(m.data for m in members if m.name == MANIFEST_MEMBER))


def listed(manifest: dict, key: str, name: str, data: bytes) -> None:
    manifest["triton"][key]["files"][name] = [len(data), hashlib.sha256(data).hexdigest()]


def nothing_imported(root: Path) -> None:
    triton = root / "triton"
    assert triton_entries(root) == [], triton_entries(root)
    staging = triton / ".staging"
    assert not staging.exists() or os.listdir(staging) == [], os.listdir(staging)
    kernels = root / ".staging"
    assert not kernels.exists() or os.listdir(kernels) == []


def _renamed(members: list[Member], old: str, new: str) -> list[Member]:
    return [Member(new, m.data, m.type, m.link) if m.name == old else m for m in members]


def bundle_attacks(members: list[Member], keys: dict[str, str]) -> dict[str, tuple[list[Member], dict | None]]:
    """Each attack: the members, and the (re-signed) manifest to put first, or None to keep them as they are."""
    add, lone = keys["add_kernel.json"], keys[LONE_FILE]
    cubin = f"triton/{add}/add_kernel.cubin"
    cubin_data = next(m.data for m in members if m.name == cubin)
    attacks: dict[str, tuple[list[Member], dict | None]] = {}

    def manifest() -> dict:
        return manifest_of(members)

    # Names that climb out, or are absolute, or hold a slash in the file's part: in the members only ...
    attacks["member .."] = (_renamed(members, cubin, f"triton/{add}/../{add}/add_kernel.cubin"), None)
    attacks["member absolute"] = (_renamed(members, cubin, f"/tmp/triton/{add}/add_kernel.cubin"), None)
    attacks["member with a slash in the file"] = (_renamed(members, cubin, f"triton/{add}/sub/add_kernel.cubin"), None)
    # ... and listed so in the signed manifest too.
    for label, name in (("..", "../../escaped.so"), ("absolute", "/tmp/escaped.so"), ("slash", "sub/add_kernel.cubin")):
        signed = manifest()
        listed(signed, add, name, b"escaped")
        attacks[f"manifest {label}"] = ([*members, Member(f"triton/{add}/{name}", b"escaped")], signed)
    # A member the manifest does not list (signed as it was).
    attacks["unlisted member"] = ([*members, Member(f"triton/{add}/evil.so", b"\x7fELF")], None)
    attacks["unlisted member of an unlisted key"] = ([*members, Member(f"triton/{'e' * 64}/evil.so", b"\x7fELF")],
                                                      None)
    # A file listed (and signed) that the tar lacks.
    signed = manifest()
    listed(signed, add, "evil.so", b"\x7fELF")
    attacks["listed but missing"] = (members, signed)
    # A file listed, signed and present that kcache-triton.json does not list.
    attacks["listed, present, not in its record"] = ([*members, Member(f"triton/{add}/evil.so", b"\x7fELF")], signed)
    # kcache-triton.json that lies, re-listed and re-signed.
    meta_name = f"triton/{add}/{META}"
    meta = json.loads(next(m.data for m in members if m.name == meta_name))
    lone_meta = json.loads(next(m.data for m in members if m.name == f"triton/{lone}/{META}"))
    for lie, changes in (("another key", {"key": lone}), ("another group", {"group": "softmax_kernel.json"}),
                         ("no group", {"group": None}), ("a group it lacks", {"group": "evil_kernel.json"}),
                         ("another triton_key", {"triton_key": lone_meta["triton_key"]}),
                         ("fewer files", {"files": [n for n in meta["files"] if not n.endswith(".ptx")]}),
                         ("more files", {"files": [*meta["files"], "evil.so"]})):
        data = json.dumps({**meta, **changes}).encode()
        signed = manifest()
        listed(signed, add, META, data)
        attacks[f"record: {lie}"] = ([Member(m.name, data) if m.name == meta_name else m for m in members], signed)
    # A lone file's record naming a group.
    lone_meta_name = f"triton/{lone}/{META}"
    data = json.dumps({**lone_meta, "group": LONE_FILE}).encode()
    signed = manifest()
    listed(signed, lone, META, data)
    attacks["lone record names a group"] = ([Member(m.name, data) if m.name == lone_meta_name else m
                                             for m in members], signed)
    # Links in place of a file.
    for kind, label in ((tarfile.SYMTYPE, "symlink"), (tarfile.LNKTYPE, "hard link")):
        linked = [Member(cubin, b"", kind, "/etc/passwd" if kind == tarfile.SYMTYPE else f"triton/{lone}/{LONE_FILE}")
                  if m.name == cubin else m for m in members]
        attacks[f"{label} member"] = (linked, None)
        signed = manifest()
        listed(signed, add, "add_kernel.cubin", b"")
        attacks[f"{label} member, listed as empty"] = (linked, signed)
    assert cubin_data
    return attacks


BUNDLE_ATTACKS = [
    "member ..", "member absolute", "member with a slash in the file", "manifest ..", "manifest absolute",
    "manifest slash", "unlisted member", "unlisted member of an unlisted key", "listed but missing",
    "listed, present, not in its record", "record: another key", "record: another group", "record: no group",
    "record: a group it lacks", "record: another triton_key", "record: fewer files", "record: more files",
    "lone record names a group", "symlink member", "symlink member, listed as empty", "hard link member",
    "hard link member, listed as empty",
]


def test_a_triton_bundle_that_climbs_lists_wrongly_lies_or_links_is_refused_whole(
        tmp_path: Path, triton_bundle: tuple[Path, dict[str, str]]) -> None:
    """Every attack on a signed bundle's triton section (signed again where the manifest changed: a
    secret's holder's mistake, or a bundle imported --unsigned) refuses the whole bundle in one line,
    exit status non-zero, and leaves the importing root's triton/ without an entry or a staging
    directory. The untouched bundle, rewritten the same way, imports: the rewriting is not the refusal."""
    bundle, keys = triton_bundle
    members = members_of(bundle)
    control = bundle_cli(tmp_path / "control", "import", str(write_bundle(tmp_path / "control.kcb", members)))
    assert control.returncode == 0 and "2 of them Triton's" in control.stdout, control.stderr
    resigned = write_bundle(tmp_path / "resigned.kcb", members, manifest_of(members))
    assert bundle_cli(tmp_path / "resigned", "import", str(resigned)).returncode == 0
    attacks = bundle_attacks(members, keys)
    assert sorted(attacks) == sorted(BUNDLE_ATTACKS)
    failures = []
    for index, (attack, (attacked, manifest)) in enumerate(attacks.items()):
        path = write_bundle(tmp_path / f"attack-{index}.kcb", attacked, manifest)
        root = tmp_path / f"root-{index}"
        done = bundle_cli(root, "import", str(path), "--any-toolchain")  # no TileLang entry: no toolchain to check
        lines = done.stderr.strip().splitlines()
        problems = []
        if done.returncode == 0:
            problems.append(f"imported: {done.stdout.strip()}")
        if len(lines) != 1 or not lines[0].startswith(f"kcache: bundle {path}: ") or "Traceback" in done.stderr:
            problems.append(f"stderr {done.stderr[-600:]!r}")
        try:
            nothing_imported(root)
        except AssertionError as err:
            problems.append(f"left in the root: {err}")
        escaped = [p for p in (Path("/tmp/escaped.so"), tmp_path / "escaped.so", root / "escaped.so") if p.exists()]
        if escaped:
            problems.append(f"wrote {escaped}")
        if problems:
            failures.append(f"{attack}: {'; '.join(problems)}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------- 3: TRITON_CACHE_MANAGER in os.environ


@pytest.fixture
def python_without_kcache(tmp_path: Path) -> Path:
    """A venv's Python with Triton (hard links to this interpreter's, as tests/test_triton.py's users get
    it) and without kcache: another project's Python that the user's program may start."""
    from importlib.metadata import distribution

    import triton

    venv = tmp_path / "other-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site_packages = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        capture_output=True, text=True, check=True).stdout.strip())
    for source in (Path(triton.__file__).parent, Path(distribution("triton")._path)):  # noqa: SLF001
        shutil.copytree(source, site_packages / source.name, copy_function=os.link,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PROJECT / "stress" / "programs" / "triton_programs" / "compile.py", tmp_path / "triton_program.py")
    return python


PARENT = """
import json, os, subprocess, sys
# The harness's PYTHONPATH entry (this checkout, for kcache run) is no part of another project's
# environment, unless the test keeps it: everything else the program has (TRITON_CACHE_MANAGER, and what
# kcache put on PYTHONPATH with it), the child inherits.
env = dict(os.environ)
env["PYTHONPATH"] = os.pathsep.join(entry for entry in env.get("PYTHONPATH", "").split(os.pathsep)
                                    if entry and ({keep_checkout} or entry != {checkout!r}))
child = subprocess.run([{python!r}, {program!r}, "add"], capture_output=True, text=True, env=env)
print(json.dumps({{"manager": os.environ.get("TRITON_CACHE_MANAGER"), "rc": child.returncode,
                  "stdout": child.stdout, "stderr": child.stderr[-1500:]}}))
"""


@pytest.mark.parametrize("kcache_there", [False, True], ids=["no kcache", "kcache's source without its dependencies"])
def test_a_child_whose_python_has_no_kcache_still_compiles_its_triton_kernels(
        tmp_path: Path, python_without_kcache: Path, kcache_there: bool) -> None:
    """`kcache run parent.py`, where parent.py starts another project's Python (Triton, no kcache; or
    kcache's source on its path but not cloudpickle and platformdirs) that compiles a Triton kernel: the
    child must not fail because of kcache's TRITON_CACHE_MANAGER, and says once that it uses Triton's
    own cache. Without kcache run, the same child compiles (the control)."""
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT.format(python=str(python_without_kcache), program=str(tmp_path / "triton_program.py"),
                                    checkout=str(PROJECT), keep_checkout=kcache_there))
    env = child_env(KCACHE_DIR=str(tmp_path / "root"), TRITON_CACHE_DIR=str(tmp_path / "plain"))
    env.pop("TRITON_CACHE_MANAGER", None)
    control = subprocess.run([sys.executable, str(parent)], capture_output=True, text=True, env=env,
                             cwd=str(tmp_path), timeout=300)
    assert control.returncode == 0 and json.loads(control.stdout)["rc"] == 0, control.stdout + control.stderr
    done = subprocess.run([sys.executable, "-m", "kcache", "run", str(parent)], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["manager"] == kcache_triton.ENV_VALUE  # the program itself runs on kcache's
    assert seen["rc"] == 0, f"the child without kcache failed: {seen['stderr']}"
    assert json.loads(seen["stdout"].splitlines()[-1])["add"]
    assert seen["stderr"].count("cannot use kcache") == 1 and "Triton's own cache" in seen["stderr"], seen["stderr"]


INSTALLED = """
import json, os
import kcache
seen = {"before": os.environ.get("TRITON_CACHE_MANAGER")}
kcache.install()
seen["installed"] = os.environ.get("TRITON_CACHE_MANAGER")
kcache.install()  # a second install changes nothing of it
seen["again"] = os.environ.get("TRITON_CACHE_MANAGER")
kcache.uninstall()
seen["uninstalled"] = os.environ.get("TRITON_CACHE_MANAGER", "<unset>")
print(json.dumps(seen))
"""


@pytest.mark.parametrize("users", [None, "my_project.cache:Manager", "kcache.triton:CacheManager"],
                         ids=["unset", "their own", "kcache's, set by the user"])
def test_install_sets_tritons_manager_only_where_the_user_named_none_and_uninstall_unsets_it(
        tmp_path: Path, users: str | None) -> None:
    """kcache.install() sets TRITON_CACHE_MANAGER only where it was unset (kcache's, or a user's own
    left alone), and kcache.uninstall() removes only what install() set."""
    env = child_env(KCACHE_DIR=str(tmp_path / "root"))
    env.pop("TRITON_CACHE_MANAGER", None)
    env.pop("KCACHE_TILELANG", None)
    if users is not None:
        env["TRITON_CACHE_MANAGER"] = users
    done = subprocess.run([sys.executable, "-c", INSTALLED], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    expected = users or kcache_triton.ENV_VALUE
    assert seen == {"before": users, "installed": expected, "again": expected,
                    "uninstalled": users or "<unset>"}, seen


RUN_PROGRAM = """
import json, os
print(json.dumps({"manager": os.environ.get("TRITON_CACHE_MANAGER")}))
"""


def test_kcache_run_leaves_a_users_own_triton_manager_alone(tmp_path: Path) -> None:
    program = tmp_path / "prog.py"
    program.write_text(RUN_PROGRAM)
    env = child_env(KCACHE_DIR=str(tmp_path / "root"), TRITON_CACHE_MANAGER="my_project.cache:Manager")
    done = subprocess.run([sys.executable, "-m", "kcache", "run", str(program)], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"manager": "my_project.cache:Manager"}
