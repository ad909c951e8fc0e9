"""kcache.triton.compile_cost: a Triton back half's estimated cost, the elements per thread of its IR's
tensor results, from the IR as the caller's front half prints it (locations and all)."""

from __future__ import annotations

from types import SimpleNamespace

from kcache.triton.compile_cost import estimated_cost, per_thread_elements

PRINTED = """#loc = loc("/src/kernel.py":3:0)
module {
  tt.func public @k(%x: !tt.ptr<f32> loc("x"(#loc))) attributes {noinline = false} {
    %0 = tt.make_range {end = 1024 : i32, start = 0 : i32} : tensor<1024xi32> loc(#loc1)
    %1 = tt.splat %x : !tt.ptr<f32> -> tensor<1024x!tt.ptr<f32>> loc(#loc2)
    %2 = tt.load %1 : tensor<1024x!tt.ptr<f32>> loc("/src/kernel.py":5:12)
    %3 = "tt.reduce"(%2) <{axis = 0 : i32}> ({
    ^bb0(%a: f32 loc(#loc4), %b: f32 loc(#loc4)):
      %4 = arith.addf %a, %b : f32 loc(#loc4)
      tt.reduce.return %4 : f32 loc(#loc4)
    }) : (tensor<1024xf32>) -> f32 loc(#loc5)
    %acc = arith.constant dense<0.000000e+00> : tensor<128x64xf32> loc(#loc6)
    tt.store %1, %2 : tensor<1024x!tt.ptr<f32>> loc(#loc7)
    tt.return loc(#loc8)
  } loc(#loc)
} loc(#loc)
"""


def test_each_ops_tensor_result_counts_its_elements_per_thread_and_nothing_else_counts() -> None:
    # make_range, splat and load: 1024 each; the constant 128 x 64; the reduce's scalar, the store's
    # operands and the function's signature nothing. Four warps of 32 threads share them.
    assert per_thread_elements(PRINTED, num_warps=4) == (3 * 1024 + 128 * 64) / 128
    assert per_thread_elements(PRINTED, num_warps=8) == per_thread_elements(PRINTED, num_warps=4) / 2
    assert per_thread_elements(PRINTED, num_warps=4, threads_per_warp=64) == per_thread_elements(PRINTED, 8)


def test_a_jobs_estimate_reads_its_warps_and_the_targets_warp_size() -> None:
    job = SimpleNamespace(source=PRINTED, options=SimpleNamespace(num_warps=4), target=SimpleNamespace(warp_size=32))
    assert estimated_cost(job) == per_thread_elements(PRINTED, 4)
    amd = SimpleNamespace(source=PRINTED, options=SimpleNamespace(num_warps=4), target=SimpleNamespace(warp_size=64))
    assert estimated_cost(amd) == per_thread_elements(PRINTED, 4) / 2
    assert estimated_cost(SimpleNamespace(source=PRINTED, options=SimpleNamespace(), target=None)) is None


def front_half_ir(kernel: str, constexprs: dict[str, int], num_warps: int, num_stages: int = 3) -> str:
    """The IR of a compile's front half, as kcache.triton.frontend makes it in the caller."""
    from triton._C.libtriton import ir
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    from stress.programs.triton_programs.compile import KERNELS, TARGET

    fn, signature, _ = KERNELS[kernel]
    backend = make_backend(TARGET)
    options = backend.parse_options({"num_warps": num_warps, "num_stages": num_stages})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = ASTSource(fn, signature, constexprs).make_ir(TARGET, options, backend.get_codegen_implementation(options),
                                                          backend.get_module_map(), context)
    return str(module)


def test_on_tritons_own_ir_the_estimate_grows_with_the_block_and_shrinks_with_the_warps() -> None:
    add = {block: front_half_ir("add", {"BLOCK": block}, 4) for block in (1024, 2048)}
    assert per_thread_elements(add[1024], 4) > 0
    assert per_thread_elements(add[2048], 4) == 2 * per_thread_elements(add[1024], 4)  # its every tensor is a block
    assert per_thread_elements(add[1024], 8) == per_thread_elements(add[1024], 4) / 2


def test_of_the_bench_matmuls_configs_the_one_that_compiles_longest_is_estimated_costliest() -> None:
    """The 16 configs of stress.programs.triton_programs.tune: compiled for sm_90 one after another on
    this project's CPU machine (docs/design/triton.md), 128 x 128 x 64 at 4 warps took longest (0.48 s)
    and 64 x 64 x 32 at 8 warps shortest (0.09 s)."""
    from stress.programs.triton_programs.compile import MATMUL_CONFIGS

    estimates = {(bm, bn, bk, warps, stages): per_thread_elements(
        front_half_ir("matmul", {"BM": bm, "BN": bn, "BK": bk}, warps, stages), warps)
        for bm, bn, bk, warps, stages in MATMUL_CONFIGS}
    ranked = sorted(estimates, key=estimates.__getitem__)
    assert ranked[-1] == (128, 128, 64, 4, 3) and ranked[0] == (64, 64, 32, 8, 4)
