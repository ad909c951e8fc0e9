"""Stress harness and benchmarks for kcache (`python -m stress`, `python -m stress.bench`): the harness
here (run, worker, chaos, invariants, procs, the run's processes and services), what it runs in
`programs/`, the test servers in `servers/`, the benchmark suite in `bench/`."""
