"""The benchmark suite, `python -m stress.bench`: one module per scenario (registered in
stress.bench.scenarios), their profiles (`*_profile`, run by `--profile`), the dataset they record into
(stress.bench.dataset, judged by stress.bench.goals) and its plots (stress.bench.plots).

The harness beside it (`python -m stress`: workers, chaos, invariants) lives in stress/ itself; the
suite imports the harness, never the other way."""
