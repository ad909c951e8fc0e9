"""The CLI scenario of `python -m stress.bench`: `kcache stats` and `kcache ls` on 10,000 entries.

The entries are copies of one synthetic entry under distinct keys (the CLI
reads sizes, times and meta.json; it never loads a kernel), and 50 processes'
stats files. Each command runs in a fresh interpreter, as a user types it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ..procs import worker_env
from .suite.rows import row
from .suite.timing import percentile, seconds_of


def fabricate(root: Path, entries: int) -> None:
    from kcache import KernelCache
    from kcache.store.manifest import build_manifest

    from ..programs import synthetic

    cache = KernelCache(root, backend=synthetic)
    cache.get_or_compile(synthetic.SyntheticFunc("template"), "synthetic")
    (template,) = cache.store.keys()
    source = root / "kernels" / template
    meta = json.loads((source / "meta.json").read_bytes())
    for i in range(entries - 1):
        key = hashlib.sha256(f"copy-{i}".encode()).hexdigest()
        target = root / "kernels" / key
        target.mkdir()
        for item in os.scandir(source):
            if item.name not in ("meta.json", "manifest.json"):
                shutil.copyfile(item.path, target / item.name)
        # Its own key in its meta.json (`kcache verify` refuses an entry copied from another key), and
        # the manifest of its files.
        (target / "meta.json").write_text(json.dumps({**meta, "key": key}))
        (target / "manifest.json").write_bytes(build_manifest(target))
    from kcache.maintenance.counter_file import stats_file

    own = stats_file(root)
    own.flush()
    for i in range(50):
        shutil.copyfile(own.path, own.path.parent / f"otherhost.{1000 + i}.cafe{i:04d}.json")


def measure(work: Path, entries: int, repeats: int, env: dict[str, str]) -> dict[str, list[float]]:
    root = work / "cli"
    fabricate(root, entries)
    kcache = [sys.executable, "-m", "kcache", "--dir", str(root)]
    seconds_of([*kcache, "gc"], env)  # records the size that `stats` reports
    return {command: [seconds_of([*kcache, command], env) for _ in range(repeats)]
            for command in ("stats", "ls", "verify")}


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    entries, repeats = options.cli_entries, 5
    samples = measure(work, entries, repeats, worker_env(env))
    return [row(f"cli ({entries} entries)", f"kcache {command}, p50 of {repeats}", percentile(s, 50), None, "s", "-")
            for command, s in samples.items()]
