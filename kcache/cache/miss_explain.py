"""Why a key missed: its key fields against the nearest stored entries of the same kernel.

A key is a digest: two keys that differ say nothing of why. So every entry's meta.json keeps the
fields its key was derived from (`key_fields`: target, out_idx, pass_configs, compile flags,
execution backend, toolchain, compile context, and the source as a sha256), and every miss that
compiles, or that the JIT guard refuses, is appended to this user's miss log,
`<root>/.logs/misses-<uid>.jsonl` (one JSON line each: key, kernel, when, the fields).

`explain` compares a missed key's fields with those of every stored entry of the same kernel name
and reports the nearest one (fewest differing fields; the newest on a tie) and what differs, field
by field: "toolchain[nvcc]: stored '... V13.0.88 ...', yours '... V13.0.90 ...'". Nested fields are
named by path (`pass_configs[tl.disable_tma_lower]`, `target[arch]`). An entry written before kcache
kept key fields is compared on what its meta.json has (target, backend, toolchain), and says so.

This is diagnostics: every read is trust-checked like a memo (a planted meta.json or log can
mislead a report, never run code), and a log that cannot be written costs the log line only.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcache.store import dirfd, layout, sharing, trust
from kcache.store.components import KERNELS, META
from kcache.store.fsutil import make_dirs_at

log = logging.getLogger("kcache")

MAX_META_BYTES = 1 << 20
# The log is rotated (to misses-<uid>.1.jsonl) past this size: a few thousand misses.
MAX_MISS_LOG_BYTES = 4 << 20
# Fields meta.json has had since the first entry format: what an entry without key_fields is compared on.
LEGACY_FIELDS = ("target", "execution_backend", "toolchain")
ABSENT = "(absent)"


def miss_log_name(generation: int = 0) -> str:
    return f"misses-{os.geteuid()}{'.' + str(generation) if generation else ''}.jsonl"


# ---------------------------------------------------------------- comparing fields


def flatten(fields: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"pass_configs": {"tl.x": 1}} -> {"pass_configs[tl.x]": 1}: every leaf named by its path (an
    empty dict has none: no pass_configs and `{}` are the same request)."""
    flat: dict[str, Any] = {}
    for name, value in fields.items():
        path = f"{prefix}[{name}]" if prefix else ("source" if name == "source_sha256" else str(name))
        if isinstance(value, dict):
            flat.update(flatten(value, path))
        else:
            flat[path] = value
    return flat


@dataclass(frozen=True)
class FieldDifference:
    field: str
    stored: Any
    yours: Any

    def render(self) -> str:
        return f"{self.field}: stored {_shown(self.stored)}, yours {_shown(self.yours)}"


def _shown(value: Any) -> str:
    if value is ABSENT:
        return ABSENT
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return repr(value[:16] + "...")  # a sha256: its head tells two apart
    return text if len(text) <= 120 else text[:117] + "..."


def differences(stored: dict[str, Any], yours: dict[str, Any]) -> list[FieldDifference]:
    """The fields (flattened) whose values differ, absent ones included, sorted by name."""
    left, right = flatten(stored), flatten(yours)
    return [FieldDifference(name, left.get(name, ABSENT), right.get(name, ABSENT))
            for name in sorted(set(left) | set(right)) if left.get(name, ABSENT) != right.get(name, ABSENT)]


# ---------------------------------------------------------------- explaining a miss


@dataclass
class MissExplanation:
    """A missed key against the stored entries of its kernel in one root."""

    key: str
    kernel: str
    root: str
    candidates: int = 0  # stored entries of the same kernel (the key itself excluded)
    nearest: str | None = None  # the nearest one's key
    nearest_created: float | None = None
    partial: bool = False  # the nearest was stored before entries kept key fields
    differences: list[FieldDifference] = field(default_factory=list)

    def headline(self) -> str:
        """What the nearest entry is and how many fields differ (the differences follow it)."""
        if self.nearest is None:
            return (f"no other entry of kernel {self.kernel} is stored in {self.root} to compare with: none was "
                    "compiled, imported or fetched here under another key")
        count = len(self.differences)
        also = f" (of {self.candidates} stored entries of {self.kernel})" if self.candidates > 1 else ""
        partial = (" (stored before kcache kept key fields, so compared on target, backend and toolchain only)"
                   if self.partial else "")
        if not count:
            return (f"the nearest stored entry{also}, {self.nearest[:16]}, differs in no field kcache keeps{partial}, "
                    "so the key differs in something kcache does not record")
        return f"the nearest stored entry{also}, {self.nearest[:16]}, differs in {count} field{'s' * (count > 1)}{partial}"

    def summary(self) -> str:
        """One paragraph: what a guard's error or warning adds."""
        if not self.differences:
            return self.headline()
        shown = "; ".join(d.render() for d in self.differences[:6])
        more = f"; and {len(self.differences) - 6} more" if len(self.differences) > 6 else ""
        return f"{self.headline()}: {shown}{more}"

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "kernel": self.kernel, "root": self.root, "candidates": self.candidates,
                "nearest": self.nearest, "nearest_created": self.nearest_created, "partial": self.partial,
                "differences": [{"field": d.field, "stored": None if d.stored is ABSENT else d.stored,
                                 "yours": None if d.yours is ABSENT else d.yours,
                                 "stored_absent": d.stored is ABSENT, "yours_absent": d.yours is ABSENT}
                                for d in self.differences]}


def stored_metas(root: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(key, meta.json) of every kernel entry whose meta.json reads and parses, trust-checked."""
    try:
        with dirfd.subdir(Path(root), KERNELS) as kernels_fd:  # by descriptor: a linked `kernels` is refused
            names = sorted(os.listdir(kernels_fd)) if kernels_fd is not None else []
    except OSError:
        return
    for key in names:
        if not layout.is_key(key):
            continue
        try:
            meta = json.loads(trust.read_trusted(Path(root), Path(KERNELS) / key, META, MAX_META_BYTES))
        except (OSError, ValueError):  # gone, untrusted, damaged: `kcache verify` reports those
            continue
        if isinstance(meta, dict):
            yield key, meta


def comparable_fields(meta: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """An entry's key fields from its meta.json, and whether they are the legacy subset."""
    fields = meta.get("key_fields")
    if isinstance(fields, dict):
        return fields, False
    return {name: meta[name] for name in LEGACY_FIELDS if name in meta}, True


def explain(root: Path, key: str, kernel: str, fields: dict[str, Any],
            stored_entries: Iterable[tuple[str, dict[str, Any]]] | None = None) -> MissExplanation:
    """`key` (of `kernel`, derived from `fields` as describe_key_fields made them) against the entries
    of the same kernel stored in `root`, the key's own entry excluded: its kernel entries, or
    `stored_entries` (key, meta) where given (Triton's groups: kcache.triton.key_fields)."""
    explanation = MissExplanation(key=key, kernel=kernel, root=str(root))
    best: tuple[int, float] | None = None
    for stored_key, meta in stored_entries if stored_entries is not None else stored_metas(root):
        if stored_key == key or meta.get("kernel") != kernel:
            continue
        explanation.candidates += 1
        stored, partial = comparable_fields(meta)
        found = differences(stored, {name: fields[name] for name in stored if name in fields} if partial else fields)
        created = meta.get("created") if isinstance(meta.get("created"), (int, float)) else 0.0
        rank = (len(found) + (1000 if partial else 0), -created)  # complete fields first, then fewest, newest
        if best is None or rank < best:
            best = rank
            explanation.nearest, explanation.nearest_created = stored_key, created
            explanation.partial, explanation.differences = partial, found
    return explanation


# ---------------------------------------------------------------- the miss log


def log_miss(root: Path, key: str, kernel: str, fields: dict[str, Any], *, refused: bool = False,
             crashed: str | None = None) -> None:
    """Append one line for this miss to this user's miss log under `root` (best effort: a read-only or
    full root costs the line, said at debug level). `refused`: the JIT guard stopped the compile.
    `crashed`: the compile crashed, or a crash remembered stopped it (kcache.triton.crashes): how."""
    record = {"key": key, "kernel": kernel, "time": time.time(), "pid": os.getpid(), "host": layout.this_host(),
              "refused": refused, "fields": fields, **({"crashed": crashed} if crashed else {})}
    line = json.dumps(record, sort_keys=True) + "\n"
    try:
        root_fd = dirfd.open_root(Path(root))
        try:
            logs_fd = make_dirs_at(root_fd, layout.LOGS)  # O_NOFOLLOW: a planted link is refused
        finally:
            os.close(root_fd)
        try:
            _append(logs_fd, line.encode())
        finally:
            os.close(logs_fd)
    except OSError as err:
        log.debug("kcache: could not log the miss of %s under %s: %s", key[:16], root, err)


def _append(logs_fd: int, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    for _attempt in range(2):
        fd = os.open(miss_log_name(), flags, 0o644, dir_fd=logs_fd)
        try:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid():  # a file another user placed under our name: not ours to write
                raise PermissionError(f"{miss_log_name()} is owned by uid {info.st_uid}, not this user")
            if info.st_size <= MAX_MISS_LOG_BYTES:
                if info.st_size == 0:
                    sharing.fix_mode(fd, sharing.file_mode(0o644))
                os.write(fd, data)  # one write of one line, O_APPEND: lines of processes never interleave
                return
            # Full: rotated by name, then the line goes to a fresh log (a line a concurrent writer
            # appends to the old one meanwhile is a diagnostic in the older generation, never lost).
            os.replace(miss_log_name(), miss_log_name(1), src_dir_fd=logs_fd, dst_dir_fd=logs_fd)
        finally:
            os.close(fd)


def logged_misses(root: Path) -> list[dict[str, Any]]:
    """This user's logged misses under `root`, oldest first (the rotated generation, then the current)."""
    records: list[dict[str, Any]] = []
    for generation in (1, 0):
        try:
            data = trust.read_trusted(Path(root), Path(layout.LOGS), miss_log_name(generation), MAX_MISS_LOG_BYTES * 2)
        except (OSError, ValueError):
            continue
        for line in data.decode(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash mid-write
            if isinstance(record, dict) and isinstance(record.get("key"), str) and isinstance(record.get("fields"), dict):
                records.append(record)
    return records
