"""What the harness, the benches and the tests run: TileLang kernels (`kernels`, `tune_kernels`,
unmodified programs in `tilelang_programs/`), Triton and Helion programs (run as `python -m` or by
path, so their names do not shadow the packages they import), and the fake compiler (`synthetic`)."""

from pathlib import Path

TILELANG_PROGRAMS = Path(__file__).resolve().parent / "tilelang_programs"  # run by path, a sys.path entry

