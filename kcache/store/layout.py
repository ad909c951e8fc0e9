"""Where things live under a cache root, and how staging directories are named.

    <root>/kernels/<key>/            published kernel entries (immutable)
    <root>/autotuner/<key>/          published autotune results
    <root>/triton/<key>/             published Triton compile groups (kcache.triton)
    <root>/.staging/<key>.<host>.<pid>.<uuid>   one writer's private work
    <root>/.quarantine/<key>.<time>.<uuid>      corrupt entries moved aside
    <root>/.locks/<key>.lock         per-key compile locks
    <root>/.logs/                    full compiler logs of failed compiles
    <root>/.toolchain/               memoized toolchain fingerprints
    <root>/.stats/                   per-process counters, folded totals, the size record
    <root>/.trash/                   evicted entries, renamed here before they are deleted
    <root>/.kcache-root              the marker: this directory is a kcache root (gc checks it)
    <root>/.gc-stamp                 when gc last ran at open
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

STAGING = ".staging"
QUARANTINE = ".quarantine"
LOCKS = ".locks"
LOGS = ".logs"
TOOLCHAIN = ".toolchain"
STATS = ".stats"
TRASH = ".trash"
# Marks a directory as a kcache root: gc deletes nothing in a directory without it.
ROOT_MARKER = ".kcache-root"
GC_STAMP = ".gc-stamp"
# Subdirectories that hold entries of a kind other than kernels (each with its own .staging).
TRITON = "triton"  # Triton's compile groups (kcache.triton)
HELION = "helion"  # Helion's autotune picks (kcache.helion)
NAMESPACES = ("autotuner", TRITON, HELION)

_HEX_DIGITS = frozenset("0123456789abcdef")


def is_key(name: str) -> bool:
    """16 to 128 lowercase hex digits. (Not a regular expression: compiling one costs a fresh process's
    hit about 0.07 ms.)"""
    return 16 <= len(name) <= 128 and _HEX_DIGITS.issuperset(name)


def check_key(key: str) -> str:
    """Keys name directories: only lowercase hex may pass, so none escapes the root."""
    if not is_key(key):
        raise ValueError(f"invalid cache key {key!r}: expected 16 to 128 lowercase hex digits")
    return key


_ENTRY_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,199}"


def check_entry_name(name: str) -> str:
    """A caller-chosen entry name (an autotune result's directory): one path component, not hidden.

    Names starting with a dot are kcache's own (.staging, .quarantine, ...).
    """
    if re.fullmatch(_ENTRY_NAME, name) is None:  # compiled at the first use (re's cache): a hit checks none
        raise ValueError(
            f"invalid entry directory name {name!r}: use letters, digits and _ . + = - "
            "(at most 200, not starting with a dot)"
        )
    return name


def staging_key(name: str) -> str:
    """The key part of a staging directory's name: the key itself, or a digest of a free-form name
    (gc recognizes staging directories by a hex key)."""
    return name if is_key(name) else hashlib.sha256(name.encode()).hexdigest()[:32]


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (the owner of a staging directory or stats file)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def this_host() -> str:
    import socket  # here: a hit names no host

    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "unknown"


class StagingName:
    """A staging directory's name: `<key>.<host>.<pid>.<token>`; equal when every part is. (A class with
    slots: a dataclass costs about 1 ms at import and a NamedTuple about 0.1 ms, on every fresh
    process's hit path.)"""

    __slots__ = ("key", "host", "pid", "token")

    def __init__(self, key: str, host: str, pid: int, token: str) -> None:
        self.key = key
        self.host = host
        self.pid = pid
        self.token = token

    def __eq__(self, other: object) -> bool:
        return type(other) is StagingName and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __repr__(self) -> str:
        return f"StagingName({self.key!r}, {self.host!r}, {self.pid!r}, {self.token!r})"

    def __str__(self) -> str:
        return f"{self.key}.{self.host}.{self.pid}.{self.token}"

    @classmethod
    def fresh(cls, key: str) -> StagingName:
        import uuid  # here: only a writer names a staging directory

        return cls(key, this_host(), os.getpid(), uuid.uuid4().hex)

    @classmethod
    def parse(cls, name: str) -> StagingName | None:
        key, _, rest = name.partition(".")
        host, _, tail = rest.rpartition(".")
        host, _, pid = host.rpartition(".")
        if not (is_key(key) and host and pid.isdigit() and tail):
            return None
        return cls(key, host, int(pid), tail)


def staging_root(root: Path) -> Path:
    return root / STAGING
