"""The S3 tier's entry manifest: one JSON document per entry, its publish point. It lists every file
(name, size, sha256; the files themselves are blobs stored by content), holds meta.json inline,
names the key, and is signed with KCACHE_REMOTE_SECRET, bound to the object's name.

A manifest is input from whoever can write to the bucket: `parse_manifest` refuses (RemoteCorrupt)
whatever is not exactly one of ours for this key, and never raises anything else.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from kcache.tiers.remote_guard import RemoteCorrupt, bound_mac
from kcache.tiers.s3_bucket import canonical

ENTRY_FORMAT = "kcache-s3-entry-1"
# A manifest lists a handful of files: anything far bigger is not one of ours (not downloaded).
MAX_MANIFEST_BYTES = 64 << 10
# Stored inside the entry's manifest, not as blobs: meta.json names the key, so no two entries share
# it, and reading it inline saves a request per hit. It is JSON text.
INLINE_FILES = frozenset({"meta.json"})
Listing = list[tuple[str, int, str]]  # (name, size, sha256) of every file
Parsed = tuple[Listing, dict[str, bytes]]  # a manifest's listing, and its inline files


def manifest_body(key: str, name: str, listing: Listing, files: dict[str, bytes], secret: bytes | None) -> bytes:
    """The manifest of entry `key`, stored as object `name`."""
    document: dict[str, Any] = {"format": ENTRY_FORMAT, "key": key, "files": [list(item) for item in listing],
                                "inline": {file: files[file].decode() for file in sorted(INLINE_FILES & set(files))}}
    if secret:
        document["mac"] = bound_mac(secret, name, canonical(document)).hex()
    return canonical(document)


def parse_manifest(body: bytes, key: str, name: str, secret: bytes | None, required: frozenset[str],
                   max_entry_bytes: int, *, exact: bool = True) -> Parsed:
    """The listing and inline files of the manifest `body` of entry `key` (object `name`): exactly the
    files `required` (`exact=False`: at least them). Raises RemoteCorrupt for anything else."""
    try:
        document = json.loads(body)
        if not isinstance(document, dict):
            raise RemoteCorrupt("not a kcache entry manifest")
        signature = document.pop("mac", None)
        if secret and not (isinstance(signature, str) and hmac.compare_digest(
                signature, bound_mac(secret, name, canonical(document)).hex())):
            raise RemoteCorrupt("its signature does not verify with KCACHE_REMOTE_SECRET for this key (unsigned, "
                                "another secret, or a manifest copied from another key)")
        if document.get("format") != ENTRY_FORMAT:
            raise RemoteCorrupt(f"not a kcache entry manifest (format {document.get('format')!r})")
        if document.get("key") != key:
            raise RemoteCorrupt(f"it names the key {str(document.get('key'))[:16]!r}, not this one")
        listing: Listing = []
        for item in document["files"]:
            file, size, digest = item
            if not (isinstance(file, str) and isinstance(size, int) and size >= 0 and isinstance(digest, str)
                    and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
                raise RemoteCorrupt(f"bad file entry {item!r}")
            listing.append((file, size, digest))
        inline = {file: text.encode() for file, text in document.get("inline", {}).items()}
    except RemoteCorrupt:
        raise
    except Exception as err:  # any parse failure of untrusted bytes is a refused manifest, never a crash
        raise RemoteCorrupt(f"unreadable manifest: {type(err).__name__}: {err}") from None
    names = [file for file, _, _ in listing]
    if len(set(names)) != len(names) or (set(names) != required if exact else not required <= set(names)):
        raise RemoteCorrupt(f"it lists {sorted(names)}, not the entry's components {sorted(required)}")
    if not set(inline) <= INLINE_FILES & required:
        raise RemoteCorrupt(f"it holds {sorted(inline)} inline, where only {sorted(INLINE_FILES)} may be")
    if sum(size for _, size, _ in listing) > max_entry_bytes:
        raise RemoteCorrupt(f"its files add up to more than the {max_entry_bytes} bytes of "
                            "KCACHE_REMOTE_MAX_ENTRY (not downloaded)")
    return listing, inline
