"""A bundle's manifest: the members that carry it, its signature, and the checks on its form.

Shared by export (kcache.bundle.export), which writes and signs it, and by import and the
coverage check (kcache.bundle.importer, kcache.bundle.coverage), which read it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

from kcache.bundle.entries import BundleError
from kcache.bundle.sections import SECTIONS
from kcache.store.components import COMPONENTS
from kcache.store.layout import is_key
from kcache.store.manifest import MANIFEST_NAME

BUNDLE_FORMAT = 1
MANIFEST_MEMBER = "kcache-bundle.json"
SIGNATURE_MEMBER = "kcache-bundle.sig"
SIGNATURE_LABEL = b"kcache-bundle-v1\0"
ENTRY_FILES = COMPONENTS | {MANIFEST_NAME}
MAX_MANIFEST_BYTES = 256 << 20  # a bundle manifest is about 1 KB an entry
MAX_SIGNATURE_BYTES = 1024
MAX_ENTRY_FILE_BYTES = 1 << 30

FROM_ENVIRONMENT = "from KCACHE_BUNDLE_SECRET"  # the default of `secret=`


def bundle_secret(given: str | None) -> str | None:
    """The secret to sign or verify with: `given`, or KCACHE_BUNDLE_SECRET for FROM_ENVIRONMENT;
    None where there is none (an empty one is none)."""
    return (os.environ.get("KCACHE_BUNDLE_SECRET") or None) if given is FROM_ENVIRONMENT else (given or None)


def sign(secret: str, manifest: bytes) -> bytes:
    return signer(secret, manifest).hexdigest().encode()


def signer(secret: str, manifest: bytes = b"") -> hmac.HMAC:
    """The HMAC of a manifest, to which more of it may be fed (`update`) before its hexdigest."""
    return hmac.new(secret.encode(), SIGNATURE_LABEL + manifest, hashlib.sha256)


def arch_of(meta: dict[str, Any]) -> str:
    target = meta.get("target")
    if not isinstance(target, dict):
        return "?"
    return str(target.get("arch") or target.get("kind") or "?")


def parse_manifest(data: bytes, path: Path) -> dict[str, Any]:
    """The bundle manifest, every field of the expected type (it is signed, but may be unsigned), each
    file's size within MAX_ENTRY_FILE_BYTES: the sizes an import reads are these. Each section's entries
    (kcache.bundle.sections: Triton's, Helion's) are under its name (none where the bundle has no
    such section)."""
    try:
        manifest: dict[str, Any] = json.loads(data)
        if manifest.get("format") != BUNDLE_FORMAT:
            raise ValueError(f"bundle format {manifest.get('format')!r}; this kcache reads {BUNDLE_FORMAT}")
        for section in SECTIONS:
            manifest.setdefault(section.folder, {})
        if not isinstance(manifest.get("toolchains"), list) or not isinstance(manifest.get("entries"), dict) \
                or not all(isinstance(manifest[section.folder], dict) for section in SECTIONS):
            raise ValueError("no toolchains or entries")
        for key, entry in manifest["entries"].items():
            _check_entry(key, entry, set(entry["files"]) == ENTRY_FILES, "a kernel entry's files")
        for section in SECTIONS:
            for key, entry in manifest[section.folder].items():
                _check_entry(key, entry, section.listed_files_fit(set(entry["files"])), f"{section.owner} entry's files")
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise BundleError(str(path), f"its manifest is not a kcache bundle manifest: {err}") from None
    except RecursionError:  # JSON nested deeper than Python's recursion limit: no manifest of ours
        raise BundleError(str(path), "its manifest is not a kcache bundle manifest: nested too deeply") from None
    return manifest


def _check_entry(key: str, entry: dict[str, Any], files_fit: bool, what: str) -> None:
    if not is_key(key):
        raise ValueError(f"{key!r} is not a cache key")
    if not files_fit:
        raise ValueError(f"entry {key[:16]} lists {sorted(entry['files'])}, not {what}")
    for size, digest in entry["files"].values():
        if not (isinstance(size, int) and 0 <= size <= MAX_ENTRY_FILE_BYTES and isinstance(digest, str)
                and len(digest) == 64):
            raise ValueError(f"entry {key[:16]} has a bad size or sha256")
    if not isinstance(entry.get("arch"), str):
        raise ValueError(f"entry {key[:16]} names no arch")


def toolchain_mismatch(theirs: list[Any], ours: Any) -> str:
    """Why a bundle built by the toolchains `theirs` is refused on a machine whose toolchain is `ours`."""
    if len(theirs) != 1 or not isinstance(theirs[0], dict) or not isinstance(ours, dict):
        return f"it was built by {len(theirs)} toolchains, and this machine's is another; export it again here"
    differ = [f"{name}: bundle {theirs[0].get(name)!r}, here {ours.get(name)!r}"
              for name in sorted(set(theirs[0]) | set(ours)) if theirs[0].get(name) != ours.get(name)]
    return ("it was built by another toolchain, so none of its entries would be hit here ("
            + "; ".join(differ[:4]) + "). Build the bundle where the toolchain matches.")
