"""What a Triton entry's key was derived from, as far as its files tell: for `kcache why-miss`.

Triton's key is a digest of its version and compiler sources, the kernel's source, the backend and
the compile options (and some environment variables); a manager is handed the digest only. A group's
metadata (`<kernel>.json`) keeps the options, the target and Triton's version, and its `.source`
file the kernel's source as Triton keyed it. So each compile here logs these fields as a miss
(kcache.cache.miss_explain's log) when it puts its group, and `why-miss` compares them with those of
the stored groups of the same kernel. A miss the JIT guard refused has no group, so no fields: Triton
compiled nothing that kcache could read them from.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kcache.errors import CorruptEntry, UntrustedEntry
from kcache.triton.store import META, kernel_name, store_of

# Metadata Triton computes from the compile rather than keys it by (or that names this compile).
OUTPUT_FIELDS = frozenset({"hash", "name", "shared", "tmem_size", "global_scratch_size", "global_scratch_align",
                           "profile_scratch_size", "profile_scratch_align", "tensordesc_meta"})


def key_fields(group: str, files: dict[str, bytes], record: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The fields of a group's key its files tell (target, Triton's version, each option), with the
    kernel's source digest and constexprs its compile recorded (`record`: kcache.triton.compile_record,
    as kcache-triton.json keeps it), or None where its metadata does not parse. Without a record (an
    entry of an older kcache), the source is the IR Triton made, without the module's attributes."""
    try:
        metadata = json.loads(files[group])
    except (KeyError, ValueError):
        return None
    if not isinstance(metadata, dict):
        return None
    fields = {name: value for name, value in metadata.items() if name not in OUTPUT_FIELDS}
    record = record if isinstance(record, dict) else {}
    source = files.get(f"{group.rsplit('.', 1)[0]}.source")
    if isinstance(record.get("source"), str):
        fields["source_sha256"] = record["source"]
    elif source is not None:
        fields["source_sha256"] = hashlib.sha256(_without_module_attributes(source)).hexdigest()
    if isinstance(record.get("constexprs"), dict):
        fields["constexprs"] = record["constexprs"]
    return fields


# The `module attributes {...}` of the IR Triton made from the kernel: where a frontend (Gluon) writes the
# compile's options into it ("ttg.num-warps" = 8), they are options, compared as such.
_MODULE_ATTRIBUTES = re.compile(rb"^(\s*module)\s+attributes\s*\{[^\n]*\}(\s*\{)", re.M)


def _without_module_attributes(source: bytes) -> bytes:
    """The kernel's source as `why-miss` compares it: without the module's attributes, so that a change
    of num_warps alone is named as num_warps, not also as a change of source."""
    return _MODULE_ATTRIBUTES.sub(rb"\1\2", source, count=1)


def stored_fields(root: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(key, {"kernel", "key_fields", "created"}) of every stored Triton group of `root` that verifies,
    shaped as miss_explain.explain compares kernel entries' meta.json."""
    store = store_of(Path(root))
    for key in store.keys():
        try:
            files = store.read(key)
            meta = json.loads(files[META]) if files is not None else None
        except (OSError, ValueError, CorruptEntry, UntrustedEntry):  # `kcache verify` reports those
            continue
        group = meta.get("group") if isinstance(meta, dict) else None
        fields = key_fields(group, files, meta) if isinstance(group, str) and files is not None else None
        if fields is not None:
            yield key, {"kernel": kernel_name(group), "key_fields": fields, "created": meta.get("created")}
