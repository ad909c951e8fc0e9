"""Autotune results stored with kcache's publish protocol.

    result.save_to_disk(path)                  # atomic: staged beside `path`, one rename
    AutotuneResult.load_from_disk(path)        # a result, or None (with one warning if damaged)
    result_path(root, key)                     # <root>/autotuner/<key>, the default place

The cache's gc cleans stale staging under `<root>/autotuner/` like everywhere else.
"""

from .result import AutotuneResult, ConfigOutcome, result_path

__all__ = ["AutotuneResult", "ConfigOutcome", "result_path"]
