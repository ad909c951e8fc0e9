"""`python -m stress.bench.standalone.bundle`: how fast a bundle imports (issue 18's goal: 1 GB/s of entries, or
the disk's limit), beside a plain copy of the same bytes as the disk's reference.

Entries come from stress's synthetic compiler at `--entry-kb` each (a TileLang GEMM's entry is a few
hundred KB); `--entries` of them are exported signed, then imported into an empty root on the same
filesystem (verify everything, then publish each with staging and rename), timed from the call to
its return. Two references: the bundle file copied once (`shutil.copyfile` and fsync: what the disk
does for the same bytes in one file), and the bundle extracted by GNU tar, then synced (`tar -xf`
and `sync -f`: what the disk does for the same files, unverified). Prints one line "result {json}";
`--rows FILE` writes the import rate against each reference as the bench's rows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from stress.procs import worker_report

from ..suite.own_run import own_parser, run_own, write_rows
from ..suite.rows import row


def rate_rows(entries: int, entry_kb: int, rates: dict[str, float]) -> list[dict[str, Any]]:
    """The import rate (GB/s) against a plain copy's and against tar's: the bench's rows."""
    label = f"import rate, {entries:,} entries of {entry_kb} KiB"
    return [row("bundle", label, rates["import"], rates["copy"], "GB/s", "a plain copy of the bundle"),
            row("bundle", "import rate against GNU tar's extract and sync", rates["import"], rates["tar"],
                "GB/s", "tar")]


def main(argv: list[str] | None = None) -> int:
    parser = own_parser("bundle")
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--entry-kb", type=int, default=512)
    parser.add_argument("--dir", help="where to work (default: the temporary directory)")
    args = parser.parse_args(argv)
    os.environ["KCACHE_SYNTHETIC_COMPILE_S"] = "0"
    import dataclasses

    from kcache import KernelCache, Settings
    from kcache.bundle.importer import export_bundle, import_bundle
    from stress.programs import synthetic

    scale = args.entry_kb * 1024 / sum(synthetic.SIZES.values())
    synthetic.SIZES = {name: int(size * scale) for name, size in synthetic.SIZES.items()}
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-bundle-", dir=args.dir))
    try:
        # In process: the artifacts' sizes are this process's (a compile worker would import its own).
        settings = dataclasses.replace(Settings.from_env(work / "a"), compile_isolation="inprocess")
        source = KernelCache(work / "a", backend=synthetic, settings=settings)
        for index in range(args.entries):
            source.get_or_compile(synthetic.SyntheticFunc(f"k{index}"), "synthetic")
        bundle = work / "bundle.kcb"
        started = time.perf_counter()
        exported = export_bundle(bundle, root=work / "a", secret="bench")
        export_s = time.perf_counter() - started
        started = time.perf_counter()
        shutil.copyfile(bundle, work / "copy.kcb")
        with open(work / "copy.kcb", "rb") as copy:
            os.fsync(copy.fileno())
        copy_s = time.perf_counter() - started
        extracted = work / "extracted"
        extracted.mkdir()
        started = time.perf_counter()
        subprocess.run(["tar", "-xf", str(bundle), "-C", str(extracted)], check=True)
        subprocess.run(["sync", "-f", str(extracted)], check=True)
        tar_s = time.perf_counter() - started
        imported = import_bundle(bundle, root=work / "b", secret="bench", toolchain=None)
        gb = imported.bytes / 1e9
        rates = {"import": gb / imported.seconds, "copy": bundle.stat().st_size / 1e9 / copy_s, "tar": gb / tar_s}
        worker_report({
            "entries": imported.imported, "bytes": imported.bytes, "bundle_bytes": bundle.stat().st_size,
            "export_s": round(export_s, 3), "import_s": round(imported.seconds, 3),
            "import_gb_per_s": round(rates["import"], 3), "stage_s": round(imported.stage_seconds, 3),
            "publish_s": round(imported.publish_seconds, 3), "copy_s": round(copy_s, 3),
            "tar_extract_sync_s": round(tar_s, 3), "tar_gb_per_s": round(rates["tar"], 3),
            "copy_gb_per_s": round(rates["copy"], 3), "exported": exported.entries,
        })
        write_rows(args.rows, rate_rows(imported.imported, args.entry_kb, rates))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    run_own("bundle", main)
