"""`kcache config`: every KCACHE_* setting in force, its value and where the value comes from (the
environment, `--dir`, or kcache's default), as `ccache -p` shows its configuration.

A value that does not parse is shown with what is wrong, not stopped on (every other command stops on
it with one line): this is where a user looks to find it. The secrets are never printed, only whether
they are set.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from kcache import setting_values as values
from kcache.cli.format import format_table
from kcache.config import SETTING_NAMES, unknown_settings

SECRETS = frozenset({"KCACHE_REMOTE_SECRET", "KCACHE_BUNDLE_SECRET"})


def _flag(name: str) -> Callable[[], Any]:
    return lambda: values.env_parsed(name, values.parse_flag, False)


def _seconds(name: str, default: float) -> Callable[[], Any]:
    return lambda: values.env_seconds(name, default)


def _sharing(reader: str) -> Callable[[], Any]:
    def read() -> Any:
        from kcache.store import sharing

        return getattr(sharing, reader)()

    return read


# Each setting: (its default as docs/operations.md's table words it, what checks a value of it).
DEFAULTS: dict[str, tuple[str, Callable[[], Any] | None]] = {
    "KCACHE_DIR": ("the user cache directory", None),
    "KCACHE_LOCK_TIMEOUT": ("15min", values.lock_timeout_setting),
    "KCACHE_TUNE_WAIT": ("1h", _seconds("KCACHE_TUNE_WAIT", values.DEFAULT_TUNE_WAIT_S)),
    "KCACHE_STAGING_TTL": ("1h", _seconds("KCACHE_STAGING_TTL", values.DEFAULT_STAGING_TTL_S)),
    "KCACHE_GC_INTERVAL": ("10min", _seconds("KCACHE_GC_INTERVAL", values.DEFAULT_GC_INTERVAL_S)),
    "KCACHE_MAX_SIZE": ("10G", lambda: values.env_parsed("KCACHE_MAX_SIZE", values.parse_size, None)),
    "KCACHE_MAX_AGE": ("no limit", lambda: values.env_parsed("KCACHE_MAX_AGE", values.parse_age, None)),
    "KCACHE_REMOTE": ("none", lambda: values.remote_urls(values.remote_url_setting())),
    "KCACHE_REMOTE_SECRET": ("none", None),
    "KCACHE_REMOTE_TTL": ("no limit", lambda: values.env_parsed("KCACHE_REMOTE_TTL", values.parse_age, None)),
    "KCACHE_REMOTE_MAX_ENTRY": ("64M", lambda: values.env_parsed("KCACHE_REMOTE_MAX_ENTRY", values.parse_size, None)),
    "KCACHE_REMOTE_LEASE": ("30s", values.remote_lease_setting),
    "KCACHE_BUNDLE_SECRET": ("none", None),
    "KCACHE_RECORD": ("none", None),
    "KCACHE_JIT_GUARD": ("off", values.jit_guard_setting),
    "KCACHE_READONLY": ("0", values.readonly_setting),
    "KCACHE_ON_UNWRITABLE": ("fallback", values.on_unwritable_setting),
    "KCACHE_UMASK": ("none", _sharing("configured_umask")),
    "KCACHE_GROUP": ("the root's group", _sharing("configured_group")),
    "KCACHE_TILELANG": ("0", None),
    "KCACHE_EXEC_DIR": ("none", None),
    "KCACHE_COMPILE_ISOLATION": ("server", lambda: values.env_choice("KCACHE_COMPILE_ISOLATION",
                                                                     values.ISOLATION_MODES)),
    "KCACHE_SERVER_IDLE": ("10min", _seconds("KCACHE_SERVER_IDLE", 600.0)),
    "KCACHE_CALLER_FORK": ("1", values.caller_fork_setting),
    "KCACHE_COMPILE_MEMORY": ("50% of RAM", values.compile_memory_budget),
    "KCACHE_COMPILE_WORKERS": ("usable CPU count", lambda: values.env_count("KCACHE_COMPILE_WORKERS")),
    "KCACHE_COMPILE_TIMEOUT": ("10min", _seconds("KCACHE_COMPILE_TIMEOUT", values.DEFAULT_COMPILE_TIMEOUT_S)),
    "KCACHE_DEBUG": ("0", _flag("KCACHE_DEBUG")),
    "KCACHE_TRITON_ISOLATION": ("worker", values.triton_isolation_setting),
    "KCACHE_LOG": ("warning", values.log_setting),
}


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    command("config", "every KCACHE_* setting in force: its value and its source (env, --dir or default), "
            "as ccache -p; a value that does not parse says why")


def settings_in_force(directory: str | None = None, environ: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per setting: name, value (shown), source ("env", "--dir", "default"), problem (or None)."""
    env = os.environ if environ is None else environ
    rows = []
    for name in sorted(SETTING_NAMES):
        default, check = DEFAULTS[name]
        raw = env.get(name, "").strip()
        if name == "KCACHE_DIR" and directory is not None:
            rows.append({"name": name, "value": directory, "source": "--dir", "problem": None})
            continue
        if not raw:
            shown = str(values.default_root()) if name == "KCACHE_DIR" else default
            rows.append({"name": name, "value": shown, "source": "default", "problem": None})
            continue
        problem = None
        if check is not None:
            try:
                check()
            except (ValueError, LookupError, OSError) as err:  # the readers' one-line messages
                problem = " ".join(str(err).split())
        rows.append({"name": name, "value": "(set, not shown)" if name in SECRETS else raw, "source": "env",
                     "problem": problem})
    return rows


def cmd_config(args: argparse.Namespace, settings: Any) -> tuple[Any, str, int]:
    rows = settings_in_force(args.dir)
    unknown = unknown_settings()
    table = format_table(["setting", "source", "value"],
                         [(row["name"], row["source"],
                           row["value"] + (f"  (not valid: {row['problem']})" if row["problem"] else "")) for row in rows])
    notes = [f"{name} is not a kcache setting: it has no effect" + (f" (did you mean {near}?)" if near else "")
             for name, near in unknown.items()]
    bad = [row for row in rows if row["problem"]]
    return ({"settings": rows, "unknown": unknown}, "\n".join([table, *notes]), 1 if bad else 0)
