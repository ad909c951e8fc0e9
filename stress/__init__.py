"""Stress harness and benchmarks for kcache (`python -m stress`, `python -m stress.bench`)."""
