"""Helion's autotune picks in deployment bundles (issue 57): `kcache export` writes a root's picks into a
`helion` section, `kcache import` publishes them into another root, where Helion's backend reads them;
a bundle whose Helion section lies is refused whole. No GPU and no Helion import: the picks are
published as kcache.helion.Backend publishes them (kcache.helion.store)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kcache.bundle.coverage import bundle_keys
from kcache.helion import store

from .helpers import PROJECT, child_env
from .test_security_triton_surface import BUNDLE_SECRET as SECRET  # write_bundle signs with it
from .test_security_triton_surface import Member, manifest_of, members_of, write_bundle


def pick(block: int) -> str:
    """A record as Helion's cache writes it: its config as Config.to_json's string."""
    return json.dumps({"key": {"type": "LooseAutotuneCacheKey", "fields": {"kernel_source_hash": f"{block:x}"}},
                       "config": json.dumps({"block_sizes": [block, block], "num_warps": 4})})


PICKS = {f"helion-key-{block}": pick(block) for block in (32, 64)}


def cli(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), *argv], capture_output=True, text=True,
                          env=child_env(KCACHE_BUNDLE_SECRET=SECRET), cwd=str(PROJECT), timeout=300)


@pytest.fixture
def helion_bundle(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    for helion_key, value in PICKS.items():
        assert store.publish_value(source, helion_key, value)
    bundle = tmp_path / "picks.kcb"
    exported = cli(source, "export", str(bundle))
    assert exported.returncode == 0 and "2 of them Helion's" in exported.stdout, exported.stdout + exported.stderr
    return bundle


def test_a_bundle_carries_helions_picks_to_another_root(tmp_path: Path, helion_bundle: Path) -> None:
    assert set(bundle_keys(helion_bundle)) == {store.entry_key(k) for k in PICKS}
    target = tmp_path / "target"
    imported = cli(target, "import", str(helion_bundle), "--arch", "sm_90a")  # a pick goes with any arch
    assert imported.returncode == 0 and "2 of them Helion's" in imported.stdout, imported.stdout + imported.stderr
    assert {k: store.read_value(target, k) for k in PICKS} == PICKS
    again = cli(target, "import", str(helion_bundle))
    assert again.returncode == 0 and "2 already there" in again.stdout, again.stdout
    shown = cli(target, "ls", "--json")
    assert sorted(row["kind"] for row in json.loads(shown.stdout)) == ["helion", "helion"], shown.stdout


def _relisted(manifest: dict, key: str, name: str, data: bytes) -> dict:
    manifest["helion"][key]["files"][name] = [len(data), hashlib.sha256(data).hexdigest()]
    return manifest


Members = list[Member]


def _attacks(members: Members) -> dict[str, tuple[Callable[[Members], Members], Callable[[dict], dict], str]]:
    """Each attack: how it changes the members and the (re-signed) manifest, and what the refusal names."""
    first, second = sorted(store.entry_key(k) for k in PICKS)
    other_meta = next(m.data for m in members if m.name == f"helion/{second}/{store.META}")
    huge = b" " * (store.MAX_VALUE_BYTES + 1)

    def replaced(name: str, data: bytes) -> Callable[[Members], Members]:
        return lambda ms: [Member(m.name, data) if m.name == name else m for m in ms]

    def added(name: str, data: bytes) -> Callable[[Members], Members]:  # beside the entry's other files
        return lambda ms: [*ms[:1 + max(i for i, m in enumerate(ms) if m.name.startswith(f"helion/{first}/"))],
                           Member(name, data),
                           *ms[1 + max(i for i, m in enumerate(ms) if m.name.startswith(f"helion/{first}/")):]]

    return {
        "a record moved under another key": (replaced(f"helion/{first}/{store.META}", other_meta),
                                             lambda mf: _relisted(mf, first, store.META, other_meta),
                                             "names another key"),
        "a value that is not a pick": (replaced(f"helion/{first}/{store.VALUE}", b'{"config": 7}'),
                                       lambda mf: _relisted(mf, first, store.VALUE, b'{"config": 7}'),
                                       "not a Helion config record"),
        "an oversized value": (replaced(f"helion/{first}/{store.VALUE}", huge),
                               lambda mf: _relisted(mf, first, store.VALUE, huge), "more than"),
        "a file a pick does not hold": (added(f"helion/{first}/launcher.so", b"\x7fELF"),
                                        lambda mf: _relisted(mf, first, "launcher.so", b"\x7fELF"),
                                        "not Helion's entry's files"),
    }


def test_a_bundle_whose_helion_section_lies_is_refused_whole(tmp_path: Path, helion_bundle: Path) -> None:
    """Each lie (the manifest signed again to match, as a secret's holder's mistake would) refuses the whole
    bundle in one line naming it, and leaves nothing in the importing root's helion/. The untouched members,
    written the same way, import: the rewriting is not the refusal."""
    members = members_of(helion_bundle)
    control = cli(tmp_path / "control", "import", str(write_bundle(tmp_path / "control.kcb", members,
                                                                     manifest_of(members))))
    assert control.returncode == 0, control.stderr
    failures = []
    for index, (attack, (change, relist, reason)) in enumerate(_attacks(members).items()):
        path = write_bundle(tmp_path / f"attack-{index}.kcb", change(members), relist(manifest_of(members)))
        root = tmp_path / f"root-{index}"
        done = cli(root, "import", str(path))
        lines = done.stderr.strip().splitlines()
        picks = os.listdir(root / "helion") if (root / "helion").exists() else []
        if done.returncode == 0 or len(lines) != 1 or reason not in lines[0] or "Traceback" in done.stderr:
            failures.append(f"{attack}: exit {done.returncode}, stderr {done.stderr[-400:]!r}")
        if [p for p in picks if len(p) == 64]:
            failures.append(f"{attack}: left {picks} in {root / 'helion'}")
    assert not failures, "\n".join(failures)
