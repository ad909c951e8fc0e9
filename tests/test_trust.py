"""The trust check before loading code: a planted or exposed entry is never loaded (real modes and owners)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

import kcache
from stress.programs import synthetic


def planted(cache_root: Path) -> tuple[Path, str]:
    """Publish k0, then replace its library with a foreign one (rewriting the manifest to match)."""
    from kcache.store.manifest import MANIFEST_NAME, build_manifest

    kcache.KernelCache(cache_root, backend=synthetic).get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
    (entry,) = (cache_root / "kernels").iterdir()
    (entry / "kernel.so").write_bytes(b"planted code" * 100)
    (entry / MANIFEST_NAME).unlink()
    (entry / MANIFEST_NAME).write_bytes(build_manifest(entry))
    import hashlib

    return entry, hashlib.sha256(b"planted code" * 100).hexdigest()


@pytest.mark.parametrize("exposure", ["world-writable entry", "world-writable kernels dir", "entry of another user"])
def test_an_exposed_entry_is_never_loaded_and_never_quarantined(cache_root: Path, caplog, exposure: str) -> None:
    entry, planted_sha = planted(cache_root)
    if exposure == "world-writable entry":
        entry.chmod(0o777)
    elif exposure == "world-writable kernels dir":
        entry.parent.chmod(0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        os.chown(entry, 65534, 65534)
    cache = kcache.KernelCache(cache_root, backend=synthetic)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        kernel = cache.get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
        cache.get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")  # a memory hit: no second warning
    assert kernel.library_sha != planted_sha  # compiled privately, not the planted library
    assert cache.stats()["compiles"] == 1 and cache.stats()["corrupt_entries"] == 0
    assert entry.exists() and not (cache_root / ".quarantine").exists()  # not ours to delete
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "not loading" in warnings[0]

    # The control: once the exposure is fixed, the (manifest-consistent) entry loads.
    entry.chmod(0o755)
    entry.parent.chmod(0o755)
    os.chown(entry, os.geteuid(), os.getegid())
    fixed = kcache.KernelCache(cache_root, backend=synthetic).get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
    assert fixed.library_sha == planted_sha


def test_a_symlinked_entry_is_refused(cache_root: Path, tmp_path: Path) -> None:
    entry, planted_sha = planted(cache_root)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(entry), elsewhere)
    entry.symlink_to(elsewhere)
    kernel = kcache.KernelCache(cache_root, backend=synthetic).get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
    assert kernel.library_sha != planted_sha
