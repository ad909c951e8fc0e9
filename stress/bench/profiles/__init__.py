"""Where a scenario's time goes, phase by phase: diagnostics beside `python -m stress.bench --only NAME
--profile`, not goals. One module per profiled scenario, named after it."""
