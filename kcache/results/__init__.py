"""Autotune results, stored as entries of the cache's own protocol under `<root>/autotuner/`.

The result format belongs to kcache, not to the `autotuner` package, because both the tuner and
the TileLang drop-in (TileLang's own AutoTuner) save and load it, and the cache's tools (gc, the
CLI) manage it. `autotuner` re-exports `AutotuneResult`.
"""
