"""Settings, from arguments first and then from KCACHE_* environment variables."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcache.store import sharing
from kcache.store.user_dirs import user_cache_dir

DEFAULT_LOCK_TIMEOUT_S = 900.0
# How long a process waits for another's tune of the same identity: tunes take minutes, not seconds.
DEFAULT_TUNE_WAIT_S = 3600.0
DEFAULT_STAGING_TTL_S = 3600.0
DEFAULT_GC_INTERVAL_S = 600.0
# Below the lock timeout, so that a stuck compile fails its own caller before its waiters give up.
DEFAULT_COMPILE_TIMEOUT_S = 600.0
ISOLATION_MODES = ("server", "pool", "inprocess")  # the first is the default
DROPIN_ENV = "KCACHE_TILELANG"  # `import kcache` installs the drop-in into TileLang (kcache.dropin.install)
JIT_GUARD_MODES = ("off", "warn", "error")  # KCACHE_JIT_GUARD (kcache.cache.deployment); off by default
UNWRITABLE_POLICIES = ("fallback", "readonly", "error")
DEFAULT_MAX_SIZE = 10 << 30
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
               "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40}
_EXAMPLES = {"size": "10G, 512MiB, 1.5GB, 0 for no limit", "duration": "30d, 12h, 15min, 90s, 1w, 3600"}
# Every time setting and option takes these units (and plain seconds): one syntax everywhere.
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

log = logging.getLogger("kcache")

# Every KCACHE_* variable kcache reads (docs/operations.md's settings table lists them).
SETTING_NAMES = frozenset({
    "KCACHE_DIR", "KCACHE_LOCK_TIMEOUT", "KCACHE_TUNE_WAIT", "KCACHE_STAGING_TTL", "KCACHE_GC_INTERVAL",
    "KCACHE_MAX_SIZE", "KCACHE_MAX_AGE", "KCACHE_REMOTE", "KCACHE_REMOTE_SECRET", "KCACHE_REMOTE_TTL",
    "KCACHE_REMOTE_MAX_ENTRY", "KCACHE_REMOTE_LEASE", "KCACHE_BUNDLE_SECRET", "KCACHE_RECORD", "KCACHE_JIT_GUARD",
    "KCACHE_READONLY", "KCACHE_ON_UNWRITABLE", "KCACHE_UMASK", "KCACHE_GROUP", "KCACHE_TILELANG", "KCACHE_EXEC_DIR",
    "KCACHE_COMPILE_ISOLATION", "KCACHE_SERVER_IDLE", "KCACHE_CALLER_FORK", "KCACHE_COMPILE_MEMORY",
    "KCACHE_COMPILE_WORKERS", "KCACHE_COMPILE_TIMEOUT", "KCACHE_DEBUG",
})
# Not settings, but no typos either: what kcache sets for its own worker processes, and what its stress
# harness and tests read (KCACHE_TEST_* included).
INTERNAL_NAMES = frozenset({
    "KCACHE_POOL_PARENT", "KCACHE_PROTOCOL_FDS", "KCACHE_TEMPLATE_CONTROL", "KCACHE_TEMPLATE_RESTORE",
    "KCACHE_SYNTHETIC_COMPILE_S", "KCACHE_BENCH_VERBOSE", "KCACHE_CORPUS_REPEATS", "KCACHE_CORPUS_RESULTS",
    "KCACHE_FIDELITY_UNRELATED", "KCACHE_PHASES_LOG",
})
INTERNAL_PREFIX = "KCACHE_TEST_"


def default_root() -> Path:
    """$KCACHE_DIR, else the platform's per-user cache directory."""
    configured = os.environ.get("KCACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path(user_cache_dir("kcache"))


def parse_duration(text: str) -> float:
    """"90s", "15min", "12h", "30d", "1w", "3600" (seconds): the one syntax of every time setting."""
    return _number_and_unit(text, _DURATION_UNITS, "duration")


def _parse_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("not a whole number") from None
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _parse_flag(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError("not a flag (use 1 or 0)")
    return value in ("1", "true", "yes", "on")


def _env_seconds(name: str, default: float) -> float:
    seconds: float = _env_parsed(name, parse_duration, default)
    return seconds


# The compile service's workers may use this share of the machine's memory unless KCACHE_COMPILE_MEMORY says.
DEFAULT_COMPILE_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class Settings:
    root: Path
    # How long a process waits for another's compile of the same key.
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
    # How long a process waits for another process's (or node's) tune of the same identity.
    tune_wait_s: float = DEFAULT_TUNE_WAIT_S
    # Staging directories of other hosts (and reused pids) older than this are garbage.
    staging_ttl_s: float = DEFAULT_STAGING_TTL_S
    # Opening a cache runs gc at most this often per root.
    gc_interval_s: float = DEFAULT_GC_INTERVAL_S
    # "server": in this user's compile service, shared by every process (the process's own pool when it
    # cannot be reached); "pool": in the process's own long-lived worker processes (a crash kills a
    # worker); "inprocess": in the caller. The service is the default since it met its goals on the
    # H100 (docs/benchmarks.md): no slower than the pool in any measured case, and far cheaper in most.
    compile_isolation: str = "server"
    # The compile service exits after this long without a job.
    server_idle_s: float = 600.0
    # At most this many compiles at once in the pool (None: the usable CPU count).
    compile_workers: int | None = None
    # One compile's time limit in the pool (None: no limit).
    compile_timeout_s: float | None = DEFAULT_COMPILE_TIMEOUT_S
    # The compile service's workers together stay under this (None: no budget); see compile_memory_budget.
    compile_memory_bytes: int | None = None
    # Least-recently-used kernel entries are evicted above this total (None: unbounded).
    max_size_bytes: int | None = DEFAULT_MAX_SIZE
    # Entries unused for longer than this are evicted (None: no age limit).
    max_age_s: float | None = None
    # The remote tiers, nearest first, comma-separated: redis://host:port/db, s3://bucket/prefix
    # (None: none). See remote_urls.
    remote_url: str | None = None
    # Signs remote entries with an HMAC; unsigned or mis-signed ones are refused.
    remote_secret: str | None = field(default=None, repr=False)
    # Remote entries expire after this (None: never; Redis's own eviction policy applies).
    remote_ttl_s: float | None = None
    # Entries bigger than this are not uploaded.
    remote_max_entry_bytes: int = 64 << 20
    # A node's compile lease lapses this long after its holder stops renewing it (dies).
    remote_lease_s: float = 30.0
    # Serve hits only; compile misses privately; write nothing under the root.
    readonly: bool = False
    # What a cache whose root this process cannot write does: "fallback" (read it, write a per-user
    # root), "readonly" (read it, write nothing) or "error" (UnwritableCache at open).
    on_unwritable: str = "fallback"

    @classmethod
    def from_env(cls, root: str | os.PathLike[str] | None = None) -> Settings:
        return cls(
            root=Path(root).expanduser() if root is not None else default_root(),
            lock_timeout_s=_env_seconds("KCACHE_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT_S),
            tune_wait_s=_env_seconds("KCACHE_TUNE_WAIT", DEFAULT_TUNE_WAIT_S),
            staging_ttl_s=_env_seconds("KCACHE_STAGING_TTL", DEFAULT_STAGING_TTL_S),
            gc_interval_s=_env_seconds("KCACHE_GC_INTERVAL", DEFAULT_GC_INTERVAL_S),
            compile_isolation=_env_choice("KCACHE_COMPILE_ISOLATION", ISOLATION_MODES),
            compile_workers=_env_count("KCACHE_COMPILE_WORKERS"),
            compile_timeout_s=_env_seconds("KCACHE_COMPILE_TIMEOUT", DEFAULT_COMPILE_TIMEOUT_S) or None,
            server_idle_s=_env_seconds("KCACHE_SERVER_IDLE", 600.0) or 600.0,
            compile_memory_bytes=compile_memory_budget(),
            max_size_bytes=_env_parsed("KCACHE_MAX_SIZE", parse_size, DEFAULT_MAX_SIZE),
            max_age_s=_env_parsed("KCACHE_MAX_AGE", parse_age, None),
            remote_url=os.environ.get("KCACHE_REMOTE") or None,
            remote_secret=os.environ.get("KCACHE_REMOTE_SECRET") or None,
            remote_ttl_s=_env_parsed("KCACHE_REMOTE_TTL", parse_age, None),
            remote_max_entry_bytes=_env_parsed("KCACHE_REMOTE_MAX_ENTRY", parse_size, 64 << 20) or (64 << 20),
            remote_lease_s=_env_seconds("KCACHE_REMOTE_LEASE", 30.0) or 30.0,
            readonly=_env_parsed("KCACHE_READONLY", _parse_flag, False),
            on_unwritable=_env_choice("KCACHE_ON_UNWRITABLE", UNWRITABLE_POLICIES),
        )._checked()

    def _checked(self) -> Settings:
        # The sharing settings are read where files are made (process-wide, workers included); a
        # bad value must fail when the cache opens, not in the middle of a compile.
        sharing.configured_umask()
        sharing.configured_group()
        jit_guard_setting()  # read at each compile, where a bad value would first show
        caller_fork_setting()  # read at the first compile
        remote_urls(self.remote_url)  # used at the first miss, where a typo would only warn
        return self


REMOTE_SCHEMES = ("redis", "rediss", "unix", "s3")


def remote_urls(value: str | None) -> list[str]:
    """The remote tiers of KCACHE_REMOTE, nearest first: "redis://h:6379/0,s3://bucket/prefix" is Redis,
    then S3. ValueError naming the entry for an unknown scheme or an empty entry."""
    if not value:
        return []
    urls = [part.strip() for part in value.split(",")]
    for url in urls:
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if scheme not in REMOTE_SCHEMES or (scheme == "s3" and not url[len("s3://"):].split("/", 1)[0]):
            raise ValueError(f"KCACHE_REMOTE={value!r}: {url!r} is not a remote tier's URL; use redis://HOST:PORT/DB "
                             "or s3://BUCKET/PREFIX, nearest first, separated by commas")
    return urls


def caller_fork_setting() -> bool:
    """KCACHE_CALLER_FORK (default on): while the compile service is not warm, a process that imported
    TileLang compiles in a fork of itself (kcache.compile.fork.caller_fork)."""
    enabled: bool = _env_parsed("KCACHE_CALLER_FORK", _parse_flag, True)
    return enabled


def jit_guard_setting() -> str:
    """KCACHE_JIT_GUARD, checked: one of JIT_GUARD_MODES."""
    return _env_choice("KCACHE_JIT_GUARD", JIT_GUARD_MODES)


def _number_and_unit(text: str, units: dict[str, int], what: str) -> float:
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*", text)
    if match is None or match.group(2).lower() not in units:
        raise ValueError(f"{text!r} is not a {what} (examples: {_EXAMPLES[what]})")
    return float(match.group(1)) * units[match.group(2).lower()]


def parse_size(text: str) -> int | None:
    """"10G", "512MiB", "1.5GB", "1048576"; "0" or "none" means no limit (as in ccache)."""
    if text.strip().lower() in ("0", "none", "unlimited"):
        return None
    return int(_number_and_unit(text, _SIZE_UNITS, "size"))


def parse_memory(text: str) -> int | None:
    """A size ("24G", see parse_size) or a share of this machine's memory ("50%")."""
    if text.strip().endswith("%"):
        share = float(text.strip()[:-1])
        if not 0 < share <= 100:
            raise ValueError(f"{text!r} is not a share of memory between 0% and 100%")
        return int(_total_memory() * share / 100)
    return parse_size(text)


def compile_memory_budget() -> int | None:
    """KCACHE_COMPILE_MEMORY, default half of this machine's memory: the compile service starts no
    more workers than fit (docs/operations.md)."""
    budget: int | None = _env_parsed("KCACHE_COMPILE_MEMORY", parse_memory, int(_total_memory() * DEFAULT_COMPILE_MEMORY_SHARE))
    return budget


def _total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_age(text: str) -> float | None:
    """A duration (parse_duration) as a limit: "0" or "none" means no limit."""
    if text.strip().lower() in ("0", "none"):
        return None
    return parse_duration(text)


def _env_parsed(name: str, parse: Any, default: Any) -> Any:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except ValueError as err:
        raise ValueError(f"{name}={raw!r}: {err}") from None


def _env_choice(name: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return choices[0]
    if raw not in choices:
        raise ValueError(f"{name}={raw!r} must be one of {', '.join(choices)}")
    return raw


def _env_count(name: str) -> int | None:
    count: int | None = _env_parsed(name, _parse_count, None)
    return count


def unknown_settings(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The KCACHE_* variables of the environment that kcache does not read (a typo is silently ignored
    otherwise), each with the setting it most likely meant, or None."""
    names = os.environ if environ is None else environ
    unknown = sorted(name for name in names if name.startswith("KCACHE_") and name not in SETTING_NAMES
                     and name not in INTERNAL_NAMES and not name.startswith(INTERNAL_PREFIX))
    return {name: _nearest_setting(name) for name in unknown}


def _nearest_setting(name: str) -> str | None:
    import difflib  # only where an unknown name is set: not on every import of kcache

    # Compared without the shared prefix, which would make every name look alike.
    suffixes = {known.removeprefix("KCACHE_"): known for known in SETTING_NAMES}
    close = difflib.get_close_matches(name.removeprefix("KCACHE_"), list(suffixes), n=1)
    return suffixes[close[0]] if close else None


def describe_unknown_settings(unknown: dict[str, str | None]) -> str:
    """"KCACHE_MAXSIZE (did you mean KCACHE_MAX_SIZE?) is not a kcache setting, so it has no effect"."""
    names = ", ".join(f"{name} (did you mean {nearest}?)" if nearest else name for name, nearest in unknown.items())
    return names + (" is not a kcache setting, so it has no effect" if len(unknown) == 1
                    else " are not kcache settings, so they have no effect")


_unknown_warned: list[bool] = []
_unknown_warned_lock = threading.Lock()


def warn_unknown_settings() -> None:
    """One warning per process naming the KCACHE_* variables that kcache ignores (`kcache doctor`
    reports them too)."""
    unknown = unknown_settings()
    with _unknown_warned_lock:
        if not unknown or _unknown_warned:
            return
        _unknown_warned.append(True)
    log.warning("kcache: %s: correct or unset %s (docs/operations.md lists the settings)",
                describe_unknown_settings(unknown), "it" if len(unknown) == 1 else "them")
