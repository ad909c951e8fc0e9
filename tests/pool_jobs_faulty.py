"""Preloaded by a compile pool to make chosen kernels' compiles abort or hang (see pool_jobs)."""

from tests.pool_jobs import install_faulty_compiler

install_faulty_compiler()
