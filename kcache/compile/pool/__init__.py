"""The process's own compile pool: this process's workers, a job pickled into each.

The lane of `KCACHE_COMPILE_ISOLATION=pool`, the fallback when the compile service cannot be
reached, and the service's own set of workers.
"""
