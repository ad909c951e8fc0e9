"""The values of the KCACHE_* variables: their defaults, their syntax (sizes, durations, flags), and
readers of single settings. Apart from `kcache.config`'s `Settings`, whose frozen dataclass costs
about 3 ms of import: a fresh process's Triton hit (`kcache.triton.roots`) reads its few
settings here."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcache.errors import SettingError
from kcache.redaction import masked
from kcache.store import sharing
from kcache.store.user_dirs import user_cache_dir

DEFAULT_LOCK_TIMEOUT_S = 900.0
# How long a process waits for another's tune of the same identity: tunes take minutes, not seconds.
DEFAULT_TUNE_WAIT_S = 3600.0
DEFAULT_STAGING_TTL_S = 3600.0
DEFAULT_GC_INTERVAL_S = 600.0
# Below the lock timeout, so that a stuck compile fails its own caller before its waiters give up.
DEFAULT_COMPILE_TIMEOUT_S = 600.0
DEFAULT_SERVER_IDLE_S = 600.0
ISOLATION_MODES = ("server", "pool", "inprocess")  # the first is the default
DROPIN_ENV = "KCACHE_TILELANG"  # `import kcache` installs the drop-in into TileLang (kcache.dropin.installer; at TileLang's import: kcache.dropin.on_import)
JIT_GUARD_MODES = ("off", "warn", "error")  # KCACHE_JIT_GUARD (kcache.cache.deployment); off by default
UNWRITABLE_POLICIES = ("fallback", "readonly", "error")
DEFAULT_MAX_SIZE = 10 << 30
DEFAULT_REMOTE_LEASE_S = 30.0
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
               "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40}
_EXAMPLES = {"size": "10G, 512MiB, 1.5GB, 0 for no limit", "duration": "30d, 12h, 15min, 90s, 1w, 3600"}
# Every time setting and option takes these units (and plain seconds): one syntax everywhere.
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

# The compile service's workers may use this share of the machine's memory unless KCACHE_COMPILE_MEMORY says.
DEFAULT_COMPILE_MEMORY_SHARE = 0.5

REMOTE_SCHEMES = ("redis", "rediss", "unix", "s3")


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


def parse_flag(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError("not a flag (use 1 or 0)")
    return value in ("1", "true", "yes", "on")


def env_seconds(name: str, default: float) -> float:
    seconds: float = env_parsed(name, parse_duration, default)
    return seconds


def remote_urls(value: str | None) -> list[str]:
    """The remote tiers of KCACHE_REMOTE, nearest first: "redis://h:6379/0,s3://bucket/prefix" is Redis,
    then S3. ValueError naming the entry for an unknown scheme or an empty entry."""
    if not value:
        return []
    urls = [part.strip() for part in value.split(",")]
    for url in urls:
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if scheme not in REMOTE_SCHEMES or (scheme == "s3" and not url[len("s3://"):].split("/", 1)[0]):
            raise ValueError(f"KCACHE_REMOTE={masked(value)!r}: {masked(url)!r} is not a remote tier's URL; use redis://HOST:PORT/DB "
                             "or s3://BUCKET/PREFIX, nearest first, separated by commas")
    return urls


def caller_fork_setting() -> bool:
    """KCACHE_CALLER_FORK (default on): while the compile service is not warm, a process that imported
    TileLang compiles in a fork of itself (kcache.compile.fork.caller_fork)."""
    enabled: bool = env_parsed("KCACHE_CALLER_FORK", parse_flag, True)
    return enabled


def jit_guard_setting() -> str:
    """KCACHE_JIT_GUARD, checked: one of JIT_GUARD_MODES."""
    return env_choice("KCACHE_JIT_GUARD", JIT_GUARD_MODES)


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
    budget: int | None = env_parsed("KCACHE_COMPILE_MEMORY", parse_memory, int(_total_memory() * DEFAULT_COMPILE_MEMORY_SHARE))
    return budget


def _total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_age(text: str) -> float | None:
    """A duration (parse_duration) as a limit: "0" or "none" means no limit."""
    if text.strip().lower() in ("0", "none"):
        return None
    return parse_duration(text)


def env_parsed(name: str, parse: Any, default: Any) -> Any:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except ValueError as err:
        raise ValueError(f"{name}={raw!r}: {err}") from None


def env_choice(name: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return choices[0]
    if raw not in choices:
        raise ValueError(f"{name}={raw!r} must be one of {', '.join(choices)}")
    return raw


def env_count(name: str) -> int | None:
    count: int | None = env_parsed(name, _parse_count, None)
    return count


# The settings that decide where entries go, read alike by `Settings.from_env` and by a Triton hit
# (`kcache.triton.roots`), which reads them without `Settings`.

def lock_timeout_setting() -> float:
    return env_seconds("KCACHE_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT_S)


def remote_url_setting() -> str | None:
    return os.environ.get("KCACHE_REMOTE") or None


def remote_lease_setting() -> float:
    return env_seconds("KCACHE_REMOTE_LEASE", DEFAULT_REMOTE_LEASE_S) or DEFAULT_REMOTE_LEASE_S


def readonly_setting() -> bool:
    readonly: bool = env_parsed("KCACHE_READONLY", parse_flag, False)
    return readonly


def on_unwritable_setting() -> str:
    return env_choice("KCACHE_ON_UNWRITABLE", UNWRITABLE_POLICIES)


TRITON_ISOLATION_LANES = ("worker", "off")


def triton_isolation_setting() -> str:
    """KCACHE_TRITON_ISOLATION: where a Triton compile that misses runs (kcache.triton.isolation)."""
    return env_choice("KCACHE_TRITON_ISOLATION", TRITON_ISOLATION_LANES)


LOG_LEVELS = ("warning", "info", "debug")  # KCACHE_LOG (kcache.lookup_log); the first is the default


def log_setting() -> str:
    """KCACHE_LOG, checked: one of LOG_LEVELS (kcache.lookup_log applies it at `import kcache`)."""
    return env_choice("KCACHE_LOG", LOG_LEVELS)


def _flag_setting(name: str) -> Callable[[], Any]:
    return lambda: env_parsed(name, parse_flag, False)


def _seconds_setting(name: str, default: float) -> Callable[[], Any]:
    return lambda: env_seconds(name, default)


def _parsed_setting(name: str, parse: Callable[[str], Any]) -> Callable[[], Any]:
    return lambda: env_parsed(name, parse, None)


# Every KCACHE_* setting and the reader that checks its value (None: any value is taken as it is, a path
# or a secret). The one check of every way in (check_settings); `kcache config` shows each row's verdict.
SETTING_CHECKS: dict[str, Callable[[], Any] | None] = {
    "KCACHE_DIR": None,
    "KCACHE_LOCK_TIMEOUT": lock_timeout_setting,
    "KCACHE_TUNE_WAIT": _seconds_setting("KCACHE_TUNE_WAIT", DEFAULT_TUNE_WAIT_S),
    "KCACHE_STAGING_TTL": _seconds_setting("KCACHE_STAGING_TTL", DEFAULT_STAGING_TTL_S),
    "KCACHE_GC_INTERVAL": _seconds_setting("KCACHE_GC_INTERVAL", DEFAULT_GC_INTERVAL_S),
    "KCACHE_MAX_SIZE": _parsed_setting("KCACHE_MAX_SIZE", parse_size),
    "KCACHE_MAX_AGE": _parsed_setting("KCACHE_MAX_AGE", parse_age),
    "KCACHE_REMOTE": lambda: remote_urls(remote_url_setting()),
    "KCACHE_REMOTE_SECRET": None,
    "KCACHE_REMOTE_TTL": _parsed_setting("KCACHE_REMOTE_TTL", parse_age),
    "KCACHE_REMOTE_MAX_ENTRY": _parsed_setting("KCACHE_REMOTE_MAX_ENTRY", parse_size),
    "KCACHE_REMOTE_LEASE": remote_lease_setting,
    "KCACHE_BUNDLE_SECRET": None,
    "KCACHE_RECORD": None,
    "KCACHE_JIT_GUARD": jit_guard_setting,
    "KCACHE_READONLY": readonly_setting,
    "KCACHE_ON_UNWRITABLE": on_unwritable_setting,
    "KCACHE_UMASK": sharing.configured_umask,
    "KCACHE_GROUP": sharing.configured_group,
    "KCACHE_TILELANG": _flag_setting(DROPIN_ENV),
    "KCACHE_EXEC_DIR": None,
    "KCACHE_COMPILE_ISOLATION": lambda: env_choice("KCACHE_COMPILE_ISOLATION", ISOLATION_MODES),
    "KCACHE_SERVER_IDLE": _seconds_setting("KCACHE_SERVER_IDLE", 600.0),
    "KCACHE_CALLER_FORK": caller_fork_setting,
    "KCACHE_COMPILE_MEMORY": compile_memory_budget,
    "KCACHE_COMPILE_WORKERS": lambda: env_count("KCACHE_COMPILE_WORKERS"),
    "KCACHE_COMPILE_TIMEOUT": _seconds_setting("KCACHE_COMPILE_TIMEOUT", DEFAULT_COMPILE_TIMEOUT_S),
    "KCACHE_DEBUG": _flag_setting("KCACHE_DEBUG"),
    "KCACHE_TRITON_ISOLATION": triton_isolation_setting,
    "KCACHE_LOG": log_setting,
}


def setting_problem(name: str) -> str | None:
    """What is wrong with the value of setting `name` in the environment, in one line; None if nothing
    (or it is unset)."""
    check = SETTING_CHECKS[name]
    if check is None or not os.environ.get(name, "").strip():
        return None
    try:
        check()
    except (ValueError, LookupError, OSError, OverflowError) as err:  # the readers' one-line messages
        return " ".join(str(err).split())
    return None


def check_settings() -> None:
    """Every KCACHE_* setting that is set, checked by its reader: SettingError naming the first bad one
    (the variable, its value, the forms it takes). Only the variables set are read, so it costs next to
    nothing: the CLI, `kcache run` (before the program), `kcache.install()` and every open of a cache
    (Settings.from_env) call it, so that a bad value stops everything before anything runs, never in the
    middle of a compile."""
    for name in SETTING_CHECKS:
        problem = setting_problem(name)
        if problem is not None:
            raise SettingError(name, problem)


def check_process_settings(remote_url: str | None) -> None:
    """check_settings, and the remote tiers `remote_url` names (a Triton hit's settings: kcache.triton.roots)."""
    check_settings()
    remote_urls(remote_url)
