"""Triton programs that benches and tests run (`python -m stress.programs.triton_programs.NAME`): `compile`
(kernels compiled for sm_90, no GPU needed; also run by path, alone), `precompile` (Helion's forked
precompile), `tune` (a 16-config `@triton.autotune`, GPU), `gpu` (kernels launched, GPU); and `assemblers`,
the counting wrappers of Triton's assemblers that count their compiles."""
