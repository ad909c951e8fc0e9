"""On a GPU: unmodified TileLang programs (lazy and eager `@tilelang.jit`, `@tilelang.autotune`)
under `kcache run`, in several processes at once, give TileLang's own results (checked against
torch), compile each kernel once across the processes, tune once (one config in every process), and
leave TileLang's cache directory alone; a later process loads the AutoTuner's saved result."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

from .test_dropin import ProgramRuns, files_under, result_of, start  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.tilelang,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible; run these on the GPU machine"),
]
PROGRAMS = ("gemm", "elementwise", "reduction", "eager_add", "autotuned_gemm")
AUTOTUNE_CONFIGS = 16
COPIES = 3


def test_unmodified_programs_on_the_gpu(tmp_path: Path) -> None:
    runs = ProgramRuns(PROGRAMS, COPIES, tmp_path)
    for result in runs.results:
        assert result["outputs"], result  # ran on the GPU, each output compared with torch in the program
        if result["program"] != "autotuned_gemm":  # a tune may pick another config, summing in another order
            assert result["outputs"] == runs.plain[result["program"]]["outputs"]
            assert result["sources"] == runs.plain[result["program"]]["sources"]
    # Tuned once (issue 16): the copies of the autotuned program ran at once, and all got one config.
    picks = {str(sorted(r["sources"].items())) for r in runs.results if r["program"] == "autotuned_gemm"}
    assert len(picks) == 1, picks
    # Every distinct kernel once, across all the processes: gemm.py's kernel is also the autotuner's
    # (128, 128, 32, 3 stages) config, the same program, so one entry serves both.
    distinct = len(PROGRAMS) - 1 + AUTOTUNE_CONFIGS - 1
    assert runs.counter.count() == distinct == runs.entries()

    later = result_of(start("autotuned_gemm", tmp_path, with_kcache=True, **runs.env))
    assert later["outputs"] and runs.counter.count() == distinct  # the saved result: nothing compiled
    assert files_under(runs.untouched) == []
