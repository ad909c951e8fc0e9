"""`kcache export`, `kcache import` and `kcache verify-coverage`: deployment bundles from the command
line. An interrupted export or import (SIGINT, SIGTERM) says what it left: no bundle, or nothing
imported (kcache.interruption; the CLI prints the one line)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from kcache.cli.format import count_of, format_table, human_size
from kcache.config import Settings
from kcache.interruption import Interrupted


def cmd_export(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    from kcache.bundle.importer import export_bundle, read_key_list

    try:
        report = export_bundle(args.bundle, root=settings.root,
                               keys=read_key_list(args.keys) if args.keys else None, archs=args.arch,
                               since=time.time() - args.since if args.since is not None else None)
    except Interrupted as stop:
        stop.done = stop.done or f"no bundle was written ({args.bundle} is as it was; its partial file was removed)"
        raise
    text = (f"exported {count_of(report.entries, 'entry', 'entries')}"
            + _of_them(report)
            + f" ({human_size(report.bytes)}; archs "
            f"{', '.join(report.archs) or '-'}) to {report.bundle}, {'signed' if report.signed else 'unsigned'}")
    if report.missing:
        text += f"\n{count_of(len(report.missing), 'key', 'keys')} asked for but not in {settings.root}: " + \
            ", ".join(k[:16] for k in report.missing[:10])
    return vars(report), text, 1 if report.missing else 0


def cmd_import(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    from kcache.bundle.importer import import_bundle

    options: dict[str, Any] = {"toolchain": None} if args.any_toolchain else {}
    try:
        report = import_bundle(args.bundle, root=settings.root, allow_unsigned=args.unsigned, archs=args.arch,
                               **options)
    except Interrupted as stop:
        stop.done = stop.done or (f"nothing was imported into {settings.root} (what was staged of {args.bundle} "
                                  "was removed)")
        raise
    text = (f"imported {count_of(report.imported, 'entry', 'entries')}"
            + _of_them(report)
            + f" ({human_size(report.bytes)}) into "
            f"{settings.root} in {report.seconds:.2f} s; {report.already_present} already there"
            + (f", {report.filtered_out} of other archs skipped" if report.filtered_out else ""))
    return vars(report), text, 0


def cmd_verify_coverage(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    from kcache.bundle.importer import missing_coverage, read_key_records

    records = read_key_records(args.keys)
    where = args.bundle or str(settings.root)
    missing = missing_coverage(records, bundle=args.bundle) if args.bundle else missing_coverage(records,
                                                                                                root=settings.root)
    rows = [(r["key"][:16], str(r.get("kernel", "?")), _arch_of_target(r.get("target"))) for r in missing]
    text = (f"{where} covers all {count_of(len(records), 'key', 'keys')} of {args.keys}" if not missing else
            f"{count_of(len(missing), 'key', 'keys')} of {len(records)} would compile, missing from {where}:\n"
            + format_table(["key", "kernel", "arch"], rows))
    return {"keys": len(records), "missing": missing, "covered_by": where}, text, 1 if missing else 0


def _arch_of_target(target: Any) -> str:
    try:
        parsed = json.loads(target) if isinstance(target, str) else target
    except ValueError:
        return str(target)
    return str(parsed.get("arch") or parsed.get("kind")) if isinstance(parsed, dict) else str(parsed or "?")


def _of_them(report: Any) -> str:
    """" (2 of them Triton's, 1 Helion's)": how many of a report's entries each section holds."""
    counts = [f"{report.triton} Triton's"] if report.triton else []
    counts += [f"{report.helion} Helion's"] if report.helion else []
    return f" ({counts[0].replace(' ', ' of them ', 1)}{''.join(', ' + c for c in counts[1:])})" if counts else ""
