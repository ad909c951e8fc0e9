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
from kcache.redaction import masked

SECRETS = frozenset({"KCACHE_REMOTE_SECRET", "KCACHE_BUNDLE_SECRET"})


# Each setting's default, as docs/operations.md's table words it. Its check is the one every command,
# `kcache run` and install() make (setting_values.SETTING_CHECKS): here it is shown, not stopped on.
DEFAULTS: dict[str, str] = {
    "KCACHE_DIR": "the user cache directory",
    "KCACHE_LOCK_TIMEOUT": "15min",
    "KCACHE_TUNE_WAIT": "1h",
    "KCACHE_STAGING_TTL": "1h",
    "KCACHE_GC_INTERVAL": "10min",
    "KCACHE_MAX_SIZE": "10G",
    "KCACHE_MAX_AGE": "no limit",
    "KCACHE_REMOTE": "none",
    "KCACHE_REMOTE_SECRET": "none",
    "KCACHE_REMOTE_TTL": "no limit",
    "KCACHE_REMOTE_MAX_ENTRY": "64M",
    "KCACHE_REMOTE_LEASE": "30s",
    "KCACHE_BUNDLE_SECRET": "none",
    "KCACHE_RECORD": "none",
    "KCACHE_JIT_GUARD": "off",
    "KCACHE_READONLY": "0",
    "KCACHE_ON_UNWRITABLE": "fallback",
    "KCACHE_UMASK": "none",
    "KCACHE_GROUP": "the root's group",
    "KCACHE_TILELANG": "0",
    "KCACHE_EXEC_DIR": "none",
    "KCACHE_COMPILE_ISOLATION": "server",
    "KCACHE_SERVER_IDLE": "10min",
    "KCACHE_CALLER_FORK": "1",
    "KCACHE_COMPILE_MEMORY": "50% of RAM",
    "KCACHE_COMPILE_WORKERS": "usable CPU count",
    "KCACHE_COMPILE_TIMEOUT": "10min",
    "KCACHE_DEBUG": "0",
    "KCACHE_TRITON_ISOLATION": "worker",
    "KCACHE_LOG": "warning",
}


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    command("config", "every KCACHE_* setting in force: its value and its source (env, --dir or default), "
            "as ccache -p; a value that does not parse says why")


def settings_in_force(directory: str | None = None, environ: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per setting: name, value (shown), source ("env", "--dir", "default"), problem (or None)."""
    env = os.environ if environ is None else environ
    rows = []
    for name in sorted(SETTING_NAMES):
        default = DEFAULTS[name]
        raw = env.get(name, "").strip()
        if name == "KCACHE_DIR" and directory is not None:
            rows.append({"name": name, "value": directory, "source": "--dir", "problem": None})
            continue
        if not raw:
            shown = str(values.default_root()) if name == "KCACHE_DIR" else default
            rows.append({"name": name, "value": shown, "source": "default", "problem": None})
            continue
        problem = values.setting_problem(name)
        rows.append({"name": name, "value": "(set, not shown)" if name in SECRETS else masked(raw), "source": "env",
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
