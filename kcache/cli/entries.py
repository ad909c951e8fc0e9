"""`kcache stats`, `ls`, `show` and `tunes`: what a root holds, read without locks or TileLang; and
the reading of an entry's small JSON files that every command shares."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from kcache.cli.contract import NotFound
from kcache.cli.entry_params import describe_params, kernel_params
from kcache.cli.format import count_of, format_table, human_age, human_size, human_time, short_key
from kcache.cli.helion import helion_entries, helion_row
from kcache.config import Settings
from kcache.maintenance.eviction import EntryUsage, scan_entries
from kcache.store import dirfd, layout
from kcache.store.bounded_read import read_regular_at
from kcache.store.components import COMPONENTS, DEVICE_SOURCE, HOST_SOURCE, KERNELS, LIBRARY, META, PARAMS
from kcache.store.entries import EntryStore
from kcache.store.manifest import MANIFEST_NAME
from kcache.triton.crashes import CRASH_FILE
from kcache.triton.store import KERNEL_SUFFIX
from kcache.triton.store import META as TRITON_META

AUTOTUNER = "autotuner"
# meta.json, manifest.json, params.json: a few kilobytes; anything far bigger is not kcache's.
MAX_JSON_BYTES = 1 << 20
# `ls` clips a long parameter list (a kernel of many tensors) to keep one line per entry; --json has it all.
LS_PARAMS_WIDTH = 48


def cmd_ls(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    now = time.time()
    listing = []
    for entry in scan_entries(settings.root):
        meta = entry_meta(entry.path)
        fields = dict_field(meta, "key_fields")
        jit = dict_field(meta, "jit")  # a @tilelang.jit kernel: its function's name and arguments
        listing.append({"key": entry.key, "kind": "tilelang", "kernel": str(jit.get("name") or meta.get("kernel", "?")),
                        "params": kernel_params(json_file(entry.path / PARAMS)), "out_idx": fields.get("out_idx"),
                        "target": _arch(meta.get("target")), "config": jit.get("args") or None,
                        "size_bytes": entry.size, "created": meta.get("created"), "last_used": entry.last_used})
    listing += [_triton_row(entry) for entry in scan_entries(settings.root, layout.TRITON)]
    listing += [helion_row(entry) for entry in helion_entries(settings.root)]
    listing.sort(key=lambda e: -e["last_used"])
    rows = [(short_key(e["key"]), e["kind"], e["kernel"], _clipped(describe_params(e["params"]), LS_PARAMS_WIDTH),
             json.dumps(e["out_idx"]) if e["out_idx"] is not None else "-", e["target"],
             _clipped(e["config"] or "-", LS_PARAMS_WIDTH), human_size(e["size_bytes"]),
             f"{human_age(now - e['created'])} ago" if isinstance(e["created"], (int, float)) else "-",
             f"{human_age(now - e['last_used'])} ago")
            for e in listing]
    return listing, format_table(["key", "kind", "kernel", "params", "out_idx", "target", "config", "size", "created",
                                  "last used"], rows), 0


def is_triton_crash(entry_dir: Path) -> bool:
    """Whether a Triton entry is a remembered crash (kcache.triton.crashes), by its kcache-triton.json."""
    meta = json_file(entry_dir / TRITON_META)
    return isinstance(meta, dict) and meta.get("files") == [CRASH_FILE]


def _triton_row(entry: EntryUsage) -> dict[str, Any]:
    """A Triton entry (kcache.triton) as `ls` shows it: a compile group ("triton": its kernel's name and
    target, from Triton's own metadata) or a single file Triton put ("triton file": its name)."""
    meta = json_file(entry.path / TRITON_META)
    meta = meta if isinstance(meta, dict) else {}
    group, files = meta.get("group"), meta.get("files")
    kernel, target, crash_config = "?", "-", None
    if isinstance(group, str):
        kernel = group.rsplit(".", 1)[0]
        compiled = json_file(entry.path / group)
        aimed = dict_field(compiled, "target") if isinstance(compiled, dict) else {}
        if aimed:
            target = f"{aimed.get('backend', '?')} sm_{aimed.get('arch', '?')}"
    elif files == [CRASH_FILE]:  # a compile that crashed, remembered (kcache.triton.crashes)
        crash = json_file(entry.path / CRASH_FILE)
        # Recorded as an autotuner's log names it, `add_kernel (Triton) [BLOCK=64, num_warps=4]`: the
        # kernel in its column, the config in the config column.
        described = str(crash.get("kernel", "?")) if isinstance(crash, dict) else "?"
        kernel, _, tail = described.partition(" [")
        kernel = kernel.removesuffix(KERNEL_SUFFIX)
        crash_config = tail[:-1] if tail.endswith("]") else None
        if isinstance(crash, dict):  # how it died and when: `BLOCK=64, num_warps=4; crashed: SIGABRT on DATE`
            died = f"{crash.get('signal') or 'exit ' + str(crash.get('exit_code'))} on {crash.get('created', '?')}"
            crash_config = f"{crash_config}; crashed: {died}" if crash_config else f"crashed: {died}"
    elif isinstance(files, list) and files:
        kernel = str(files[0])
    kind = "triton" if isinstance(group, str) else "triton crash" if files == [CRASH_FILE] else "triton file"
    config = meta.get("config") if isinstance(meta.get("config"), str) else None
    if config is None and files == [CRASH_FILE]:
        config = crash_config
    if config is None and isinstance(group, str):  # recorded before kcache kept the config: Triton's options
        compiled = json_file(entry.path / group)
        config = ", ".join(f"{name}={compiled[name]}" for name in ("num_warps", "num_stages")
                           if isinstance(compiled, dict) and name in compiled) or None
    return {"key": entry.key, "kind": kind, "kernel": kernel,
            "params": None, "out_idx": None, "target": target, "config": config, "size_bytes": entry.size,
            "created": meta.get("created"), "last_used": entry.last_used}


def _clipped(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def cmd_show(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    """A summary first (what a person asks: which kernel, for what, when, how big), then the files, then
    every other detail of meta.json once."""
    store = kernel_store(settings)
    matches = [key for key in store.keys() if key.startswith(args.key.lower())]
    # A Triton entry by kcache's key (`kcache ls`) or by Triton's own (its cache directory's name).
    triton = [entry for entry in scan_entries(settings.root, layout.TRITON)
              if entry.key.startswith(args.key.lower()) or _triton_key(entry.path).startswith(args.key.upper())]
    if len(matches) + len(triton) != 1:
        why = "no entry matches" if not matches + triton else f"{len(matches) + len(triton)} entries match"
        where = f"{store.entries_dir} (TileLang's) or {settings.root / layout.TRITON} (Triton's)"
        raise NotFound(f"show: {why} {args.key!r} under {where} (see `kcache ls`)", settings.root)
    if triton:
        return _show_triton(triton[0])
    path = store.entry_path(matches[0])
    manifest = json_file(path / MANIFEST_NAME)
    meta = entry_meta(path)
    sizes = _file_sizes(path)
    created = meta.get("created") if isinstance(meta.get("created"), (int, float)) else None
    fields = dict_field(meta, "key_fields")
    params = kernel_params(json_file(path / PARAMS))
    summary = {"kernel": meta.get("kernel", "?"), "key": matches[0], "params": params, "out_idx": fields.get("out_idx"),
               "target": _arch(meta.get("target")), "created_at": created, "size_bytes": sum(sizes.values()), "files": len(sizes)}
    result = {"key": matches[0], "path": str(path), "summary": summary, "meta": meta, "manifest": manifest,
              "sources": {name: str(path / name) for name in (DEVICE_SOURCE, HOST_SOURCE, LIBRARY)}}
    rows = [("kernel", summary["kernel"]), ("key", matches[0]), ("params", describe_params(params)),
            ("out_idx", json.dumps(summary["out_idx"]) if summary["out_idx"] is not None else "-"),
            ("target", summary["target"]),
            ("created", f"{human_time(created)} ({human_age(time.time() - created)} ago)" if created is not None
             else "-"),
            ("size", f"{human_size(summary['size_bytes'])} in {count_of(len(sizes), 'file', 'files')}"),
            ("path", str(path))]
    lines = [format_table(["", ""], rows, show_header=False), "", "files:",
             _indent(format_table(["", ""], [(name, human_size(size)) for name, size in sorted(sizes.items())],
                                  show_header=False)), "", "details:"]
    lines += [f"  {name}: {value}" for name, value in _details(meta)]
    return result, "\n".join(lines), 0


def _triton_key(entry_dir: Path) -> str:
    """Triton's own key of a Triton entry (its kcache-triton.json's), upper-cased as Triton writes it; "-"
    where there is none, which no key given matches."""
    meta = json_file(entry_dir / TRITON_META)
    found = meta.get("triton_key") if isinstance(meta, dict) else None
    return found.upper() if isinstance(found, str) and found else "-"


def _show_triton(entry: EntryUsage) -> tuple[Any, str, int]:
    """`show` of a Triton entry: what `ls` says of it, then its files, then Triton's own metadata."""
    summary = _triton_row(entry)
    meta = json_file(entry.path / TRITON_META)
    meta = meta if isinstance(meta, dict) else {}
    group = meta.get("group")
    compiled = json_file(entry.path / group) if isinstance(group, str) else None
    sizes = _file_sizes(entry.path)
    created = summary["created"] if isinstance(summary["created"], (int, float)) else None
    rows = [("kind", summary["kind"]), ("kernel", summary["kernel"]), ("key", entry.key),
            ("triton key", str(meta.get("triton_key", "?"))), ("target", summary["target"]),
            ("created", f"{human_time(created)} ({human_age(time.time() - created)} ago)" if created else "-"),
            ("size", f"{human_size(entry.size)} in {count_of(len(sizes), 'file', 'files')}"), ("path", str(entry.path))]
    lines = [format_table(["", ""], rows, show_header=False), "", "files:",
             _indent(format_table(["", ""], [(name, human_size(size)) for name, size in sorted(sizes.items())],
                                  show_header=False))]
    if isinstance(compiled, dict):
        lines += ["", "Triton's metadata:"] + [f"  {name}: {_compact(value)}" for name, value in sorted(compiled.items())]
    return {"key": entry.key, "path": str(entry.path), "summary": summary, "meta": meta, "triton": compiled}, \
        "\n".join(lines), 0


# The fields of meta.json (and of its key_fields) that show's summary shows already.
_SUMMARIZED = {"kernel", "key", "created", "out_idx"}


def _details(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """meta.json's fields, nested ones as dotted names, each value once: a key field equal to the
    entry's own (target, toolchain, execution_backend) is not repeated."""
    fields = dict_field(meta, "key_fields")
    flat = {name: value for name, value in meta.items() if name not in _SUMMARIZED and name != "key_fields"}
    flat.update({f"key_fields.{name}": value for name, value in fields.items()
                 if name not in _SUMMARIZED and not (name in meta and meta[name] == value)})
    rows = []
    for name, value in sorted(flat.items()):
        nested = value.items() if isinstance(value, dict) and name != "target" and value else [("", value)]
        rows += [(f"{name}.{part}" if part else name, _compact(item)) for part, item in nested]
    return rows


def _file_sizes(entry: Path) -> dict[str, int]:
    """Every file of the entry (its manifest too), as `ls` and eviction count them."""
    try:
        return {item.name: item.stat(follow_symlinks=False).st_size for item in os.scandir(entry)}
    except FileNotFoundError:  # evicted meanwhile
        return {}


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


# A TileLang target's attributes whose usual values `ls` and `show` leave out: "sm_90a" says it.
_USUAL_TARGET = {"kind": "cuda", "keys": None, "host": None, "tag": "", "max_num_threads": 1024, "thread_warp_size": 32}


def _arch(target: Any) -> str:
    """The target's arch ("sm_90a"), its kind where not CUDA ("hip gfx942"), then each attribute set
    otherwise than usual ("sm_90a max_num_threads=512"): two targets of one kernel are told apart."""
    if not isinstance(target, dict):
        return "-"
    shown = [str(target["kind"])] if target.get("kind") not in (None, "cuda") else []
    shown += [str(target["arch"])] if target.get("arch") else [] if shown else [str(target.get("kind") or "-")]
    shown += [f"{name}={_compact(value)}" for name, value in sorted(target.items())
              if name not in ("arch", "kind") and (name not in _USUAL_TARGET or
                                                   (_USUAL_TARGET[name] is not None and value != _USUAL_TARGET[name]))]
    return " ".join(shown)


def cmd_tunes(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    now = time.time()
    listing = []
    for path in sorted(autotune_results(settings.root), key=lambda p: p.name):
        meta = entry_meta(path)
        device = dict_field(meta, "device")
        listing.append({"key": path.name, "factory": meta.get("factory") or meta.get("source") or "?",
                        "config": json_file(path / "best_config.json"), "device": device.get("name") or "-",
                        "tuned": meta.get("tuned")})
    rows = [(short_key(e["key"]), e["factory"], json.dumps(e["config"], sort_keys=True)[:60], e["device"],
             f"{human_age(now - e['tuned'])} ago" if isinstance(e["tuned"], (int, float)) else "-") for e in listing]
    return listing, format_table(["key", "factory", "best config", "device", "tuned"], rows), 0


# ---------------------------------------------------------------- an entry's files, for every command


def kernel_store(settings: Settings) -> EntryStore:
    return EntryStore(settings.root, KERNELS, COMPONENTS, bind_key=True)


def autotune_results(root: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(root / AUTOTUNER) if not e.name.startswith(".") and e.is_dir()]
    except FileNotFoundError:
        return []


def json_file(path: Path) -> Any:
    """A small JSON file of an entry, read through its directory's descriptor: a link, a FIFO (which
    would block the open) or a device is unreadable, never waited on."""
    try:
        directory = os.open(path.parent, dirfd.DIR_FLAGS)
        try:
            data = read_regular_at(directory, path.name, MAX_JSON_BYTES)
        finally:
            os.close(directory)
        return json.loads(data)
    except (OSError, ValueError) as err:
        return {"unreadable": f"{path}: {err}"}


def entry_meta(entry: Path) -> dict[str, Any]:
    value = json_file(entry / META)
    return value if isinstance(value, dict) else {}


def dict_field(mapping: dict[str, Any], name: str) -> dict[str, Any]:
    """mapping[name] if it is a dict, else {}: a field of a file that anyone may have edited."""
    value = mapping.get(name)
    return value if isinstance(value, dict) else {}
