"""Autotune results stored with kcache's publish protocol.

    result.save_to_disk(path)                  # atomic: staged beside `path`, one rename
    AutotuneResult.load_from_disk(path)        # a result, or None (with one warning if damaged)
    result_path(root, key)                     # <root>/autotuner/<key>, the default place
    tune(factory, configs, ref_prog=..., target=...)   # compile all configs in the pool, benchmark, save;
                                               # once per job: concurrent tunes of it wait for one
    @autotune(configs=[...], key=["M", "N"])   # the same, as a decorator over a kernel factory

The cache's gc cleans stale staging under `<root>/autotuner/` like everywhere else.
"""

from autotuner.benchmark import cuda_event_profiler
from autotuner.decorator import autotune
from autotuner.tune import NoBenchmarkDevice, TuneFailed, tune
from kcache.results.autotune import AutotuneResult, ConfigOutcome, result_path
from kcache.results.tune_once import TuneWaitTimeout

__all__ = ["AutotuneResult", "ConfigOutcome", "NoBenchmarkDevice", "TuneFailed", "TuneWaitTimeout", "autotune",
           "cuda_event_profiler", "result_path", "tune"]
