"""Settings, from arguments first and then from KCACHE_* environment variables."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kcache.setting_values import (  # Settings' defaults and the readers of its fields
    DEFAULT_COMPILE_TIMEOUT_S,
    DEFAULT_GC_INTERVAL_S,
    DEFAULT_LOCK_TIMEOUT_S,
    DEFAULT_MAX_SIZE,
    DEFAULT_REMOTE_LEASE_S,
    DEFAULT_SERVER_IDLE_S,
    DEFAULT_STAGING_TTL_S,
    DEFAULT_TUNE_WAIT_S,
    ISOLATION_MODES,
    SETTING_CHECKS,
    check_settings,
    compile_memory_budget,
    default_root,
    env_choice,
    env_count,
    env_parsed,
    env_seconds,
    lock_timeout_setting,
    on_unwritable_setting,
    parse_age,
    parse_size,
    readonly_setting,
    remote_lease_setting,
    remote_url_setting,
)

log = logging.getLogger("kcache")

# Every KCACHE_* variable kcache reads (docs/operations.md's settings table lists them), each checked by
# setting_values.check_settings.
SETTING_NAMES = frozenset(SETTING_CHECKS)
# Not settings, but no typos either: what kcache sets for its own worker processes, and what its stress
# harness and tests read (KCACHE_TEST_* included).
INTERNAL_NAMES = frozenset({
    "KCACHE_POOL_PARENT", "KCACHE_PROTOCOL_FDS", "KCACHE_TEMPLATE_CONTROL", "KCACHE_TEMPLATE_RESTORE",
    "KCACHE_SYNTHETIC_COMPILE_S", "KCACHE_BENCH_VERBOSE", "KCACHE_BENCH_COMMIT", "KCACHE_CORPUS_REPEATS", "KCACHE_CORPUS_RESULTS",
    "KCACHE_FIDELITY_UNRELATED", "KCACHE_PHASES_LOG",
})
INTERNAL_PREFIX = "KCACHE_TEST_"


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
    server_idle_s: float = DEFAULT_SERVER_IDLE_S
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
    remote_url: str | None = field(default=None, repr=False)  # a Redis URL may hold a password
    # Signs remote entries with an HMAC; unsigned or mis-signed ones are refused.
    remote_secret: str | None = field(default=None, repr=False)
    # Remote entries expire after this (None: never; Redis's own eviction policy applies).
    remote_ttl_s: float | None = None
    # Entries bigger than this are not uploaded.
    remote_max_entry_bytes: int = 64 << 20
    # A node's compile lease lapses this long after its holder stops renewing it (dies).
    remote_lease_s: float = DEFAULT_REMOTE_LEASE_S
    # Serve hits only; compile misses privately; write nothing under the root.
    readonly: bool = False
    # What a cache whose root this process cannot write does: "fallback" (read it, write a per-user
    # root), "readonly" (read it, write nothing) or "error" (UnwritableCache at open).
    on_unwritable: str = "fallback"

    @classmethod
    def from_env(cls, root: str | os.PathLike[str] | None = None) -> Settings:
        """The settings of the environment. Every KCACHE_* value is checked first, those read where they
        are used included (the sharing ones where files are made, the JIT guard at each compile, the
        remote tiers at the first miss): SettingError for a bad one, at open, never mid-compile."""
        check_settings()
        return cls(
            root=Path(root).expanduser() if root is not None else default_root(),
            lock_timeout_s=lock_timeout_setting(),
            tune_wait_s=env_seconds("KCACHE_TUNE_WAIT", DEFAULT_TUNE_WAIT_S),
            staging_ttl_s=env_seconds("KCACHE_STAGING_TTL", DEFAULT_STAGING_TTL_S),
            gc_interval_s=env_seconds("KCACHE_GC_INTERVAL", DEFAULT_GC_INTERVAL_S),
            compile_isolation=env_choice("KCACHE_COMPILE_ISOLATION", ISOLATION_MODES),
            compile_workers=env_count("KCACHE_COMPILE_WORKERS"),
            compile_timeout_s=env_seconds("KCACHE_COMPILE_TIMEOUT", DEFAULT_COMPILE_TIMEOUT_S) or None,
            server_idle_s=env_seconds("KCACHE_SERVER_IDLE", DEFAULT_SERVER_IDLE_S) or DEFAULT_SERVER_IDLE_S,
            compile_memory_bytes=compile_memory_budget(),
            max_size_bytes=env_parsed("KCACHE_MAX_SIZE", parse_size, DEFAULT_MAX_SIZE),
            max_age_s=env_parsed("KCACHE_MAX_AGE", parse_age, None),
            remote_url=remote_url_setting(),
            remote_secret=os.environ.get("KCACHE_REMOTE_SECRET") or None,
            remote_ttl_s=env_parsed("KCACHE_REMOTE_TTL", parse_age, None),
            remote_max_entry_bytes=env_parsed("KCACHE_REMOTE_MAX_ENTRY", parse_size, 64 << 20) or (64 << 20),
            remote_lease_s=remote_lease_setting(),
            readonly=readonly_setting(),
            on_unwritable=on_unwritable_setting(),
        )


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
# A thread of the parent may hold it at a fork (a Triton compile forks from any thread): made anew.
os.register_at_fork(after_in_child=lambda: globals().update(_unknown_warned_lock=threading.Lock()))


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
