"""One machine of `python -m stress.bench.standalone.deploy` (a root, given by KCACHE_DIR, and this process): runs
unmodified programs of stress/programs/tilelang_programs one after the other, under `kcache.install()` or
TileLang alone (`--plain`), and reports when each one's kernel was ready, what kcache compiled, and
where each program's outputs were saved. Run by the bench, never by hand.

The programs end with `report.finish(program, kernels, check)`; this process puts its own `finish`
there before importing them, so that it sees each kernel the moment the program has it (the kernel is
ready), then launches it through the program's own `check` (unless --no-launch) and saves the outputs."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stress.procs import worker_report
from stress.programs import TILELANG_PROGRAMS

PROGRAMS = TILELANG_PROGRAMS


class KernelsReady:
    """Stands in for the programs' `report.finish`: notes when the program's kernels were returned, and
    with `launch` runs them once (the program's check, synchronized) and saves what they computed."""

    def __init__(self, launch: bool, outputs: Path) -> None:
        self.launch = launch
        self.outputs = outputs
        self.last: dict[str, Any] = {}

    def __call__(self, program: str, kernels: dict[str, Any], check: Callable[[], dict[str, Any]] | None = None) -> None:
        ready = time.perf_counter()
        self.last = {"ready_perf": ready, "ready_at": time.time(),
                     "sources": {name: hashlib.sha256(kernel.get_kernel_source().encode()).hexdigest()
                                 for name, kernel in kernels.items()}}
        if self.launch and check is not None:
            import torch

            outputs = check()
            torch.cuda.synchronize()
            self.last["launched_s"] = time.perf_counter() - ready
            saved = self.outputs / f"{program}.pt"
            torch.save({name: tensor.cpu() for name, tensor in outputs.items()}, saved)
            self.last["outputs"] = str(saved)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stress.bench.jobs.deploy_machine")
    parser.add_argument("--program", action="append", required=True, help="a module of stress/programs/tilelang_programs")
    parser.add_argument("--outputs", required=True, help="the directory each program's outputs are saved in")
    parser.add_argument("--no-launch", action="store_true", help="build and load the kernels, never run them")
    parser.add_argument("--plain", action="store_true", help="TileLang alone: no kcache.install()")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(PROGRAMS))
    import report  # the programs' own module: its `finish` is replaced before any program imports it
    import tilelang  # noqa: F401 - what any TileLang program imports first

    cache = None
    refusal: tuple[type[BaseException], ...] = ()  # only kcache's JIT guard refuses
    if not args.plain:
        import kcache
        from kcache.cache.default import default_cache

        kcache.install()
        cache = default_cache()
        refusal = (kcache.UnexpectedCompile,)
    ready = KernelsReady(launch=not args.no_launch, outputs=Path(args.outputs))
    report.finish = ready
    imported_at = time.time()
    rows = []
    for program in args.program:
        module = importlib.import_module(program)
        ready.last = {}
        started = time.perf_counter()
        try:
            module.main()
        except refusal as refused:
            rows.append({"program": program, "refused": str(refused)})
            continue
        row = {"program": program, "call_to_ready_s": ready.last.pop("ready_perf") - started, **ready.last}
        rows.append(row)
    worker_report({"imported_at": imported_at, "programs": rows,
                   "stats": cache.stats() if cache is not None else None})


if __name__ == "__main__":
    main()
