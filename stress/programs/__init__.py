"""What the harness, the benches and the tests run: TileLang kernels (`kernels`, `tune_kernels`,
unmodified programs in `tilelang_programs/`), Triton programs in `triton_programs/` and a Helion one
(`helion_program`), run as `python -m` or by path (a folder of programs is named after its compiler, never
as it, so that it shadows no package they import), and the fake compiler (`synthetic`)."""

from pathlib import Path

TILELANG_PROGRAMS = Path(__file__).resolve().parent / "tilelang_programs"  # run by path, a sys.path entry

