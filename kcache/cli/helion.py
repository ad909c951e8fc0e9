"""Helion's autotune picks (kcache.helion) as the entry commands show them: `ls` rows, `stats`' count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kcache.helion.store import kernel_of
from kcache.maintenance.eviction import EntryUsage, scan_entries
from kcache.store import layout

META = "kcache-helion.json"  # kcache.helion.store's names: the tools read files, never Helion's classes
VALUE = "best_config.json"
_READ_LIMIT = 1 << 20


def helion_entries(root: Path) -> list[EntryUsage]:
    return scan_entries(root, layout.HELION)


def helion_row(entry: EntryUsage) -> dict[str, Any]:
    """A Helion pick as `ls` shows it: kind "helion", the kernel its record names (else "?"), its config."""
    record = _json(entry.path / VALUE)
    meta = _json(entry.path / META)
    kernel = kernel_of(record)
    try:  # Helion keeps the config as its own JSON string inside the record
        config = json.loads(record["config"]) if isinstance(record.get("config"), str) else {}
    except ValueError:
        config = {}
    config = config if isinstance(config, dict) else {}
    shown = ", ".join(f"{name}={json.dumps(config[name])}" for name in ("block_sizes", "num_warps", "num_stages")
                      if name in config)
    return {"key": entry.key, "kind": "helion", "kernel": kernel, "params": None, "config": shown or None,
            "out_idx": None, "target": "-", "size_bytes": entry.size, "created": meta.get("created"),
            "last_used": entry.last_used}


def _json(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            found = json.loads(file.read(_READ_LIMIT))
    except (OSError, ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}
