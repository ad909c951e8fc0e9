"""A pytest plugin, loaded (`-p stress.bench.jobs.compile_spans`) into the plain cold runs of `python -m
stress.bench --only triton-library`: how long each of the run's Triton compiles took, from Triton's
compilation listener, and each of its C builds (its driver's module, a kernel's launcher: the C compiler's
run, `triton.runtime.build._build`), and which tune each belongs to; written as JSON to the file that
KT_COMPILE_SPANS names when the run ends. Nothing is recorded where that variable is unset.

The file: {"tunes": {tune: [seconds, ...]}, "alone": [seconds, ...], "builds": {"tunes": {...}, "alone":
[...]}, "halves": {tune: [[source, front half s, back half s], ...]}}: a compile or build under an
`Autotuner.run` (found up the stack by that method's code, as kcache's compile-ahead finds it) is its
tune's, named by the tuner and the tuning key; any other is alone. A tune's compiles are also split in
halves: the front (Triton's `ir_initialization`: its key, its lookup and the kernel's Python made IR),
the back (its lowering stages and store), with the source they were made from (`ASTSource.hash()`:
configs of one source can share a front half). A hit (`cache_hit`) took no compile. A listener the
library set itself is called after this one's note.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

SPANS_VARIABLE = "KT_COMPILE_SPANS"
_recorded: dict[str, Any] = {"tunes": {}, "alone": [], "builds": {"tunes": {}, "alone": []}, "halves": {}}


def pytest_configure(config: Any) -> None:
    if not os.environ.get(SPANS_VARIABLE):
        return
    from triton import knobs

    previous = knobs.compilation.listener

    def listen(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
        if not cache_hit:
            front = times.ir_initialization / 1e6
            back = (sum(us for _, us in times.lowering_stages) + times.store_results) / 1e6
            tune = tune_of(sys._getframe(1))
            if tune is None:
                _recorded["alone"].append(front + back)
            else:
                _recorded["tunes"].setdefault(tune, []).append(front + back)
                source = src.hash() if callable(getattr(src, "hash", None)) else repr(src)
                _recorded["halves"].setdefault(tune, []).append([source, front, back])
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

    knobs.compilation.listener = listen
    _time_c_builds()


def _time_c_builds() -> None:
    """Triton's C builds timed, by tune: `compile_module_from_src` calls the module's `_build` by name."""
    from triton.runtime import build

    compile_c = getattr(build, "_build", None)
    if compile_c is None:
        return

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return compile_c(*args, **kwargs)
        finally:
            builds, tune = _recorded["builds"], tune_of(sys._getframe(1))
            took = time.perf_counter() - started
            (builds["alone"] if tune is None else builds["tunes"].setdefault(tune, [])).append(took)

    build._build = timed


def pytest_unconfigure(config: Any) -> None:
    path = os.environ.get(SPANS_VARIABLE)
    if path:
        Path(path).write_text(json.dumps(_recorded))


def tune_of(frame: FrameType | None) -> str | None:
    """"<tuner's id> <tuning key>" of the `Autotuner.run` up the stack from `frame`, or None."""
    autotuner = sys.modules.get("triton.runtime.autotuner")
    run_code = getattr(getattr(autotuner, "Autotuner", None), "run", None)
    run_code = getattr(run_code, "__code__", None)
    while frame is not None:
        if frame.f_code is run_code:
            return f"{id(frame.f_locals.get('self')):x} {frame.f_locals.get('key')!r}"
        frame = frame.f_back
    return None
