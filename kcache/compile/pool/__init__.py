"""The process's own compile pool: this process's workers, a job pickled into each.

The lane of `KCACHE_COMPILE_ISOLATION=pool`, the fallback when the compile service cannot be
reached, and the service's own set of workers. `process_pool` (the pool), `job_on_worker` (a job's
outcome, whatever its worker does), `worker_source` (forks of a template, or exec), `shared_pools`
(the process's shared pool), `live_pools` (every pool, closed at exit).
"""
