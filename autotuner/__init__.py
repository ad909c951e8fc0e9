"""Autotune results stored with kcache's publish protocol (see the autotuner issue).

Results will live under `<root>/autotuner/`; the cache's gc already cleans
stale staging there (kcache.maintenance.staging_dirs walks the whole root).
"""
