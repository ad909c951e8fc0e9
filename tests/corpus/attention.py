"""Attention-family kernels of the differential corpus, written the way TileLang's own examples write them
(examples/flash_attention, flash_decoding, deepseek_mla, blocksparse_attention, attention_sink): one
block of queries per program, keys and values streamed through shared memory, an online softmax in exp2
(the scale folded with log2(e) so each exponent is one ffma), `T.macro` helpers, explicit layout
annotations where the examples had them.

Every factory takes the sizes and returns a fresh PrimFunc; `build` calls it with the small sizes of
its configuration below. Nothing is compiled at import time, and torch is imported only by the checks.

No `from __future__ import annotations` here: TileLang evaluates the `T.Tensor(shape, dtype)` hints of
the `T.macro` helpers against the factory's locals, which postponed annotations would hide.
"""

import tilelang
import tilelang.language as T

from tests.corpus import CorpusKernel

LOG2E = 1.44269504
FAST_MATH = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}


# ---------------------------------------------------------------------------------------------------
# Forward: BSHD, non-causal, fp16, the softmax and the two GEMMs as `T.macro` helpers
# (examples/flash_attention/example_mha_fwd_bshd.py before the macros were inlined).
# ---------------------------------------------------------------------------------------------------


def mha_fwd_bshd(batch, heads, seq_len, dim, is_causal, block_M=64, block_N=64, num_stages=1, threads=128,
                 dtype=T.float16):
    scale = (1.0 / dim) ** 0.5 * LOG2E
    shape = [batch, seq_len, heads, dim]
    accum_dtype = T.float32

    @T.macro
    def MMA0(
        K: T.Tensor(shape, dtype),
        Q_shared: T.SharedBuffer([block_M, dim], dtype),
        K_shared: T.SharedBuffer([block_N, dim], dtype),
        acc_s: T.FragmentBuffer([block_M, block_N], accum_dtype),
        k: T.int32,
        bx: T.int32,
        by: T.int32,
        bz: T.int32,
    ):
        T.copy(K[bz, k * block_N : (k + 1) * block_N, by, :], K_shared)
        if is_causal:
            for i, j in T.Parallel(block_M, block_N):
                acc_s[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, 0, -T.infinity(acc_s.dtype))
        else:
            for i, j in T.Parallel(block_M, block_N):
                acc_s[i, j] = T.if_then_else(k * block_N + j >= seq_len, -T.infinity(acc_s.dtype), 0)
        T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def MMA1(
        V: T.Tensor(shape, dtype),
        V_shared: T.SharedBuffer([block_N, dim], dtype),
        acc_s_cast: T.FragmentBuffer([block_M, block_N], dtype),
        acc_o: T.FragmentBuffer([block_M, dim], accum_dtype),
        k: T.int32,
        by: T.int32,
        bz: T.int32,
    ):
        T.copy(V[bz, k * block_N : (k + 1) * block_N, by, :], V_shared)
        T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def Softmax(
        acc_s: T.FragmentBuffer([block_M, block_N], accum_dtype),
        acc_s_cast: T.FragmentBuffer([block_M, block_N], dtype),
        scores_max: T.FragmentBuffer([block_M], accum_dtype),
        scores_max_prev: T.FragmentBuffer([block_M], accum_dtype),
        scores_scale: T.FragmentBuffer([block_M], accum_dtype),
        scores_sum: T.FragmentBuffer([block_M], accum_dtype),
        logsum: T.FragmentBuffer([block_M], accum_dtype),
    ):
        T.copy(scores_max, scores_max_prev)
        T.fill(scores_max, -T.infinity(accum_dtype))
        T.reduce_max(acc_s, scores_max, dim=1, clear=False)
        for i in T.Parallel(block_M):
            scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
        for i in T.Parallel(block_M):
            scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
        for i, j in T.Parallel(block_M, block_N):
            # exp2(x * log2(e) - max * log2(e)) lets the compiler use one ffma instead of fadd and fmul
            acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
        T.reduce_sum(acc_s, scores_sum, dim=1)
        for i in T.Parallel(block_M):
            logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
        T.copy(acc_s, acc_s_cast)

    @T.macro
    def Rescale(
        acc_o: T.FragmentBuffer([block_M, dim], accum_dtype),
        scores_scale: T.FragmentBuffer([block_M], accum_dtype),
    ):
        for i, j in T.Parallel(block_M, dim):
            acc_o[i, j] *= scores_scale[i]

    @T.prim_func
    def main(
        Q: T.Tensor(shape, dtype),
        K: T.Tensor(shape, dtype),
        V: T.Tensor(shape, dtype),
        Output: T.Tensor(shape, dtype),
    ):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)

            T.copy(Q[bz, bx * block_M : (bx + 1) * block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            loop_range = (
                T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N)) if is_causal
                else T.ceildiv(seq_len, block_N)
            )
            for k in T.Pipelined(loop_range, num_stages=num_stages):
                MMA0(K, Q_shared, K_shared, acc_s, k, bx, by, bz)
                Softmax(acc_s, acc_s_cast, scores_max, scores_max_prev, scores_scale, scores_sum, logsum)
                Rescale(acc_o, scores_scale)
                MMA1(V, V_shared, acc_s_cast, acc_o, k, by, bz)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, bx * block_M : (bx + 1) * block_M, by, :])

    return main


# ---------------------------------------------------------------------------------------------------
# Forward: BHSD with seq_q <= seq_kv (a KV prefix, causal aligned bottom-right), bf16, two stages
# (examples/flash_attention/example_mha_fwd_bhsd.py, its macro version).
# ---------------------------------------------------------------------------------------------------


def mha_fwd_bhsd(batch, heads, seq_q, seq_kv, dim, is_causal, block_M=64, block_N=64, num_stages=2, threads=128,
                 dtype=T.bfloat16):
    scale = (1.0 / dim) ** 0.5 * LOG2E
    q_shape = [batch, heads, seq_q, dim]
    kv_shape = [batch, heads, seq_kv, dim]
    accum_dtype = T.float32
    past_len = seq_kv - seq_q
    assert past_len >= 0, "seq_kv must be greater than or equal to seq_q"

    @T.macro
    def MMA0(
        K: T.Tensor(kv_shape, dtype),
        Q_shared: T.SharedBuffer([block_M, dim], dtype),
        K_shared: T.SharedBuffer([block_N, dim], dtype),
        acc_s: T.FragmentBuffer([block_M, block_N], accum_dtype),
        k: T.int32,
        bx: T.int32,
        by: T.int32,
        bz: T.int32,
    ):
        T.copy(K[bz, by, k * block_N : (k + 1) * block_N, :], K_shared)
        if is_causal:
            for i, j in T.Parallel(block_M, block_N):
                q_idx = bx * block_M + i + past_len
                k_idx = k * block_N + j
                acc_s[i, j] = T.if_then_else(q_idx >= k_idx, 0, -T.infinity(acc_s.dtype))
        else:
            for i, j in T.Parallel(block_M, block_N):
                acc_s[i, j] = T.if_then_else(k * block_N + j >= seq_kv, -T.infinity(acc_s.dtype), 0)
        T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def MMA1(
        V: T.Tensor(kv_shape, dtype),
        V_shared: T.SharedBuffer([block_N, dim], dtype),
        acc_s_cast: T.FragmentBuffer([block_M, block_N], dtype),
        acc_o: T.FragmentBuffer([block_M, dim], accum_dtype),
        k: T.int32,
        by: T.int32,
        bz: T.int32,
    ):
        T.copy(V[bz, by, k * block_N : (k + 1) * block_N, :], V_shared)
        T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def Softmax(
        acc_s: T.FragmentBuffer([block_M, block_N], accum_dtype),
        acc_s_cast: T.FragmentBuffer([block_M, block_N], dtype),
        scores_max: T.FragmentBuffer([block_M], accum_dtype),
        scores_max_prev: T.FragmentBuffer([block_M], accum_dtype),
        scores_scale: T.FragmentBuffer([block_M], accum_dtype),
        scores_sum: T.FragmentBuffer([block_M], accum_dtype),
        logsum: T.FragmentBuffer([block_M], accum_dtype),
    ):
        T.copy(scores_max, scores_max_prev)
        T.fill(scores_max, -T.infinity(accum_dtype))
        T.reduce_max(acc_s, scores_max, dim=1, clear=False)
        for i in T.Parallel(block_M):
            scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
        for i in T.Parallel(block_M):
            scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
        for i, j in T.Parallel(block_M, block_N):
            acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
        T.reduce_sum(acc_s, scores_sum, dim=1)
        for i in T.Parallel(block_M):
            logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
        T.copy(acc_s, acc_s_cast)

    @T.macro
    def Rescale(
        acc_o: T.FragmentBuffer([block_M, dim], accum_dtype),
        scores_scale: T.FragmentBuffer([block_M], accum_dtype),
    ):
        for i, j in T.Parallel(block_M, dim):
            acc_o[i, j] *= scores_scale[i]

    @T.prim_func
    def main(
        Q: T.Tensor(q_shape, dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        Output: T.Tensor(q_shape, dtype),
    ):
        with T.Kernel(T.ceildiv(seq_q, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)

            T.copy(Q[bz, by, bx * block_M : (bx + 1) * block_M, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            loop_range = (
                T.min(T.ceildiv(seq_kv, block_N), T.ceildiv((bx + 1) * block_M + past_len, block_N)) if is_causal
                else T.ceildiv(seq_kv, block_N)
            )
            for k in T.Pipelined(loop_range, num_stages=num_stages):
                MMA0(K, Q_shared, K_shared, acc_s, k, bx, by, bz)
                Softmax(acc_s, acc_s_cast, scores_max, scores_max_prev, scores_scale, scores_sum, logsum)
                Rescale(acc_o, scores_scale)
                MMA1(V, V_shared, acc_s_cast, acc_o, k, by, bz)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, by, bx * block_M : (bx + 1) * block_M, :])

    return main


# ---------------------------------------------------------------------------------------------------
# Forward: BSHD, causal, the shared tiles annotated with swizzled layouts (the examples before
# TileLang inferred the swizzle itself: `T.annotate_layout({Q_shared: make_swizzled_layout(Q_shared)})`).
# ---------------------------------------------------------------------------------------------------


def mha_fwd_bshd_swizzled(batch, heads, seq_len, dim, is_causal, block_M=64, block_N=64, num_stages=2, threads=128):
    scale = (1.0 / dim) ** 0.5 * LOG2E
    shape = [batch, seq_len, heads, dim]
    dtype = T.float16
    accum_dtype = T.float32

    @T.prim_func
    def main(
        Q: T.Tensor(shape, dtype),
        K: T.Tensor(shape, dtype),
        V: T.Tensor(shape, dtype),
        Output: T.Tensor(shape, dtype),
    ):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)

            T.annotate_layout(
                {
                    Q_shared: tilelang.layout.make_swizzled_layout(Q_shared),
                    K_shared: tilelang.layout.make_swizzled_layout(K_shared),
                    V_shared: tilelang.layout.make_swizzled_layout(V_shared),
                    O_shared: tilelang.layout.make_swizzled_layout(O_shared),
                }
            )

            T.copy(Q[bz, bx * block_M : (bx + 1) * block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            loop_range = (
                T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N)) if is_causal
                else T.ceildiv(seq_len, block_N)
            )
            for k in T.Pipelined(loop_range, num_stages=num_stages):
                T.copy(K[bz, k * block_N : (k + 1) * block_N, by, :], K_shared)
                if is_causal:
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, 0, -T.infinity(acc_s.dtype))
                else:
                    T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                for i in T.Parallel(block_M):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.copy(V[bz, k * block_N : (k + 1) * block_N, by, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, bx * block_M : (bx + 1) * block_M, by, :])

    return main


# ---------------------------------------------------------------------------------------------------
# Forward for Hopper: the software pipeline spelled out statement by statement with order/stage/group
# (examples/flash_attention/example_mha_fwd_bshd_wgmma_pipelined.py). TileLang 0.1.15 dropped the
# `group=` argument of T.Pipelined (and its -1 "producer" entries): order and stage now name each of the
# fifteen statements of the loop body, so the body must keep exactly this shape.
# ---------------------------------------------------------------------------------------------------


def mha_fwd_bshd_wgmma_pipelined(batch, heads, seq_len, dim, is_causal, block_M=128, block_N=128, threads=256):
    scale = (1.0 / dim) ** 0.5 * LOG2E
    shape = [batch, seq_len, heads, dim]
    dtype = T.float16
    accum_dtype = T.float32

    @T.prim_func
    def main(
        Q: T.Tensor(shape, dtype),
        K: T.Tensor(shape, dtype),
        V: T.Tensor(shape, dtype),
        Output: T.Tensor(shape, dtype),
    ):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)

            T.copy(Q[bz, bx * block_M : (bx + 1) * block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            loop_range = (
                T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N)) if is_causal
                else T.ceildiv(seq_len, block_N)
            )
            # statements: 0 copy K | 1 mask | 2 gemm QK^T | 3-11 softmax | 12 rescale | 13 copy V | 14 gemm PV.
            # Both loads are issued first; the rescale and the PV gemm of block k-1 (stage 1) run between the
            # QK^T gemm of block k and its softmax (the FA3 intra-warpgroup overlap). The example spelled this
            # order=[-1, 0, 3, 1, -1, 2], stage=[-1, 0, 0, 1, -1, 1] over the statement groups
            # [[0], [1, 2], [3..11], [12], [13], [14]], the -1 loads left to the warp-specialized producer.
            for k in T.Pipelined(
                loop_range,
                order=[0, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 4, 1, 5],
                stage=[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1],
            ):
                T.copy(K[bz, k * block_N : (k + 1) * block_N, by, :], K_shared)
                if is_causal:
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, 0, -T.infinity(acc_s.dtype))
                else:
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(k * block_N + j >= seq_len, -T.infinity(acc_s.dtype), 0)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                for i in T.Parallel(block_M):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)

                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]

                T.copy(V[bz, k * block_N : (k + 1) * block_N, by, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, bx * block_M : (bx + 1) * block_M, by, :])

    return main


# ---------------------------------------------------------------------------------------------------
# Forward with a dynamic sequence length: one compiled kernel for every seq_len, the tails masked
# (`T.dynamic`, the 0.1.15 spelling; `T.symbolic` is its deprecated alias).
# ---------------------------------------------------------------------------------------------------


def mha_fwd_bhsd_dynamic(batch, heads, dim, block_M=64, block_N=64, num_stages=1, threads=128):
    scale = (1.0 / dim) ** 0.5 * LOG2E
    seq_len = T.dynamic("seq_len")
    shape = [batch, heads, seq_len, dim]
    dtype = T.float16
    accum_dtype = T.float32

    @T.prim_func
    def main(
        Q: T.Tensor(shape, dtype),
        K: T.Tensor(shape, dtype),
        V: T.Tensor(shape, dtype),
        Output: T.Tensor(shape, dtype),
    ):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)

            T.copy(Q[bz, by, bx * block_M : (bx + 1) * block_M, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            for k in T.Pipelined(T.ceildiv(seq_len, block_N), num_stages=num_stages):
                T.copy(K[bz, by, k * block_N : (k + 1) * block_N, :], K_shared)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.if_then_else(k * block_N + j >= seq_len, -T.infinity(acc_s.dtype), 0)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                for i in T.Parallel(block_M):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.copy(V[bz, by, k * block_N : (k + 1) * block_N, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, Output[bz, by, bx * block_M : (bx + 1) * block_M, :])

    return main


# ---------------------------------------------------------------------------------------------------
# GQA forward: `groups` query heads share one K/V head (examples/flash_attention/example_gqa_fwd_bshd.py).
# ---------------------------------------------------------------------------------------------------


def gqa_fwd_bshd(batch, heads, seq_len, dim, is_causal, groups, block_M=64, block_N=64, num_stages=2, threads=128):
    scale = (1.0 / dim) ** 0.5 * LOG2E
    head_kv = heads // groups
    q_shape = [batch, seq_len, heads, dim]
    kv_shape = [batch, seq_len, head_kv, dim]
    dtype = T.float16
    accum_dtype = T.float32

    @T.prim_func
    def main(
        Q: T.Tensor(q_shape, dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        Output: T.Tensor(q_shape, dtype),
    ):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)

            T.copy(Q[bz, bx * block_M : (bx + 1) * block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            loop_range = (
                T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N)) if is_causal
                else T.ceildiv(seq_len, block_N)
            )
            for k in T.Pipelined(loop_range, num_stages=num_stages):
                T.copy(K[bz, k * block_N : (k + 1) * block_N, by // groups, :], K_shared)
                if is_causal:
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, 0, -T.infinity(acc_s.dtype))
                else:
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(k * block_N + j >= seq_len, -T.infinity(acc_s.dtype), 0)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                for i in T.Parallel(block_M):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)

                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]

                T.copy(V[bz, k * block_N : (k + 1) * block_N, by // groups, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, bx * block_M : (bx + 1) * block_M, by, :])

    return main


# ---------------------------------------------------------------------------------------------------
# Backward (examples/flash_attention/example_mha_bwd_bshd.py): the preprocess (Delta = rowsum(O * dO)),
# the main kernel (one block of keys per program, dK/dV in registers, dQ accumulated with atomics in
# a layout that matches the 8x8 MMA fragment), the postprocess (dQ back to its logical layout, fp16).
# ---------------------------------------------------------------------------------------------------


def mha_bwd_preprocess(batch, heads, seq_len, dim):
    dtype = T.float16
    accum_dtype = T.float32
    shape = [batch, seq_len, heads, dim]
    blk = 32

    @T.prim_func
    def flash_bwd_prep(
        O: T.Tensor(shape, dtype),
        dO: T.Tensor(shape, dtype),
        Delta: T.Tensor([batch, heads, seq_len], accum_dtype),
    ):
        with T.Kernel(heads, T.ceildiv(seq_len, blk), batch) as (bx, by, bz):
            o = T.alloc_fragment([blk, blk], dtype)
            do = T.alloc_fragment([blk, blk], dtype)
            acc = T.alloc_fragment([blk, blk], accum_dtype)
            delta = T.alloc_fragment([blk], accum_dtype)
            T.clear(acc)
            for k in range(T.ceildiv(dim, blk)):
                T.copy(O[bz, by * blk : (by + 1) * blk, bx, k * blk : (k + 1) * blk], o)
                T.copy(dO[bz, by * blk : (by + 1) * blk, bx, k * blk : (k + 1) * blk], do)
                for i, j in T.Parallel(blk, blk):
                    acc[i, j] += o[i, j] * do[i, j]
            T.reduce_sum(acc, delta, 1)
            T.copy(delta, Delta[bz, bx, by * blk : (by + 1) * blk])

    return flash_bwd_prep


def make_dq_layout(dQ):
    # atomicAdd can not be vectorized, so dQ is reordered to match the 8x8 gemm fragment
    return T.Layout(dQ.shape, lambda b, l, h, d: [b, l // 8, h, d // 8, (d % 2), 4 * (l % 8) + (d % 8) // 2])


def mha_bwd_postprocess(batch, heads, seq_len, dim):
    dtype = T.float16
    accum_dtype = T.float32
    shape = [batch, seq_len, heads, dim]
    blk = 64

    @T.prim_func
    def flash_bwd_post(
        dQ: T.Tensor(shape, accum_dtype),
        dQ_out: T.Tensor(shape, dtype),
    ):
        with T.Kernel(T.ceildiv(seq_len, blk), heads, batch, threads=128) as (bx, by, bz):
            T.annotate_layout({dQ: make_dq_layout(dQ)})
            T.copy(
                dQ[bz, bx * blk : (bx + 1) * blk, by, :],
                dQ_out[bz, bx * blk : (bx + 1) * blk, by, :],
            )

    return flash_bwd_post


def mha_bwd_bshd(batch, heads, seq_len, dim, is_causal, block_M=64, block_N=64, num_stages=2, threads=128):
    sm_scale = (1.0 / dim) ** 0.5
    scale = (1.0 / dim) ** 0.5 * LOG2E
    shape = [batch, seq_len, heads, dim]
    dtype = T.float16
    accum_dtype = T.float32

    @T.prim_func
    def flash_bwd(
        Q: T.Tensor(shape, dtype),
        K: T.Tensor(shape, dtype),
        V: T.Tensor(shape, dtype),
        dO: T.Tensor(shape, dtype),
        lse: T.Tensor([batch, heads, seq_len], accum_dtype),
        Delta: T.Tensor([batch, heads, seq_len], accum_dtype),
        dQ: T.Tensor(shape, accum_dtype),
        dK: T.Tensor(shape, dtype),
        dV: T.Tensor(shape, dtype),
    ):
        with T.Kernel(heads, T.ceildiv(seq_len, block_M), batch, threads=threads) as (bx, by, bz):
            K_shared = T.alloc_shared([block_M, dim], dtype)
            dsT_shared = T.alloc_shared([block_M, block_N], dtype)
            q = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_M, dim], dtype)
            qkT = T.alloc_fragment([block_M, block_N], accum_dtype)
            dsT = T.alloc_fragment([block_M, block_N], accum_dtype)
            qkT_cast = T.alloc_fragment([block_M, block_N], dtype)
            dsT_cast = T.alloc_fragment([block_M, block_N], dtype)
            lse_shared = T.alloc_shared([block_N], accum_dtype)
            delta = T.alloc_shared([block_N], accum_dtype)
            do = T.alloc_shared([block_N, dim], dtype)
            dv = T.alloc_fragment([block_M, dim], accum_dtype)
            dk = T.alloc_fragment([block_M, dim], accum_dtype)
            dq = T.alloc_fragment([block_N, dim], accum_dtype)
            dv_shared = T.alloc_shared([block_M, dim], dtype)
            dk_shared = T.alloc_shared([block_M, dim], dtype)

            T.annotate_layout({dQ: make_dq_layout(dQ)})
            T.copy(K[bz, by * block_M : (by + 1) * block_M, bx, :], K_shared)
            T.copy(V[bz, by * block_M : (by + 1) * block_M, bx, :], V_shared)
            T.clear(dv)
            T.clear(dk)
            loop_st = T.floordiv(by * block_M, block_N) if is_causal else 0
            loop_ed = T.ceildiv(seq_len, block_N)
            for k in T.Pipelined(loop_st, loop_ed, num_stages=num_stages):
                T.copy(Q[bz, k * block_N : (k + 1) * block_N, bx, :], q)
                T.clear(qkT)
                T.gemm(K_shared, q, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(lse[bz, bx, k * block_N : (k + 1) * block_N], lse_shared)
                for i, j in T.Parallel(block_M, block_N):
                    qkT[i, j] = T.exp2(qkT[i, j] * scale - lse_shared[j])
                if is_causal:
                    for i, j in T.Parallel(block_M, block_N):
                        qkT[i, j] = T.if_then_else(by * block_M + i <= k * block_N + j, qkT[i, j], 0)
                T.copy(dO[bz, k * block_N : (k + 1) * block_N, bx, :], do)
                T.clear(dsT)
                T.gemm(V_shared, do, dsT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(qkT, qkT_cast)
                T.gemm(qkT_cast, do, dv, policy=T.GemmWarpPolicy.FullRow)

                T.copy(Delta[bz, bx, k * block_N : (k + 1) * block_N], delta)
                for i, j in T.Parallel(block_M, block_N):
                    dsT_cast[i, j] = qkT[i, j] * (dsT[i, j] - delta[j]) * sm_scale
                T.gemm(dsT_cast, q, dk, policy=T.GemmWarpPolicy.FullRow)

                T.copy(dsT_cast, dsT_shared)
                T.clear(dq)
                T.gemm(dsT_shared, K_shared, dq, transpose_A=True)
                for i, j in T.Parallel(block_N, dim):
                    T.atomic_add(dQ[bz, k * block_N + i, bx, j], dq[i, j])
            T.copy(dv, dv_shared)
            T.copy(dk, dk_shared)
            T.copy(dv_shared, dV[bz, by * block_M : (by + 1) * block_M, bx, :])
            T.copy(dk_shared, dK[bz, by * block_M : (by + 1) * block_M, bx, :])

    return flash_bwd


# GQA backward (examples/flash_attention/example_gqa_bwd.py, flashattn_bwd_atomic_add): several query
# heads write the same K/V head, so dK and dV are fp32 and accumulated with tile-wide atomics.
def gqa_bwd_atomic_add(batch, heads, seq_len, dim_qk, dim_v, is_causal, groups, block_M=64, block_N=64,
                       threads=128, num_stages=2):
    sm_scale = (1.0 / dim_qk) ** 0.5
    scale = (1.0 / dim_qk) ** 0.5 * LOG2E
    head_kv = heads // groups
    q_shape = [batch, seq_len, heads, dim_qk]
    k_shape = [batch, seq_len, head_kv, dim_qk]
    v_shape = [batch, seq_len, head_kv, dim_v]
    dtype = T.float16
    accum_dtype = T.float32

    @T.prim_func
    def flash_bwd(
        Q: T.Tensor(q_shape, dtype),
        K: T.Tensor(k_shape, dtype),
        V: T.Tensor(v_shape, dtype),
        dO: T.Tensor([batch, seq_len, heads, dim_v], dtype),
        lse: T.Tensor([batch, heads, seq_len], accum_dtype),
        Delta: T.Tensor([batch, heads, seq_len], accum_dtype),
        dQ: T.Tensor(q_shape, accum_dtype),
        dK: T.Tensor(k_shape, accum_dtype),
        dV: T.Tensor(v_shape, accum_dtype),
    ):
        with T.Kernel(heads, T.ceildiv(seq_len, block_M), batch, threads=threads) as (bx, by, bz):
            K_shared = T.alloc_shared([block_M, dim_qk], dtype)
            dsT_shared = T.alloc_shared([block_M, block_N], dtype)
            q = T.alloc_shared([block_N, dim_qk], dtype)
            V_shared = T.alloc_shared([block_M, dim_v], dtype)
            qkT = T.alloc_fragment([block_M, block_N], accum_dtype)
            dsT = T.alloc_fragment([block_M, block_N], accum_dtype)
            qkT_cast = T.alloc_fragment([block_M, block_N], dtype)
            dsT_cast = T.alloc_fragment([block_M, block_N], dtype)
            lse_shared = T.alloc_shared([block_N], accum_dtype)
            delta = T.alloc_shared([block_N], accum_dtype)
            do = T.alloc_shared([block_N, dim_v], dtype)
            dv = T.alloc_fragment([block_M, dim_v], accum_dtype)
            dk = T.alloc_fragment([block_M, dim_qk], accum_dtype)
            dq = T.alloc_fragment([block_N, dim_qk], accum_dtype)
            dk_shared = T.alloc_shared([block_M, dim_qk], accum_dtype)
            dv_shared = T.alloc_shared([block_M, dim_v], accum_dtype)

            T.annotate_layout({dQ: make_dq_layout(dQ)})
            T.copy(K[bz, by * block_M : (by + 1) * block_M, bx // groups, :], K_shared)
            T.copy(V[bz, by * block_M : (by + 1) * block_M, bx // groups, :], V_shared)
            T.clear(dv)
            T.clear(dk)
            loop_st = T.floordiv(by * block_M, block_N) if is_causal else 0
            loop_ed = T.ceildiv(seq_len, block_N)
            for k in T.Pipelined(loop_st, loop_ed, num_stages=num_stages):
                T.copy(Q[bz, k * block_N : (k + 1) * block_N, bx, :], q)
                T.clear(qkT)
                T.gemm(K_shared, q, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(lse[bz, bx, k * block_N : (k + 1) * block_N], lse_shared)
                for i, j in T.Parallel(block_M, block_N):
                    qkT[i, j] = T.exp2(qkT[i, j] * scale - lse_shared[j])
                if is_causal:
                    for i, j in T.Parallel(block_M, block_N):
                        qkT[i, j] = T.if_then_else(by * block_M + i <= k * block_N + j, qkT[i, j], 0)
                T.copy(dO[bz, k * block_N : (k + 1) * block_N, bx, :], do)
                T.clear(dsT)
                T.gemm(V_shared, do, dsT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(qkT, qkT_cast)
                T.gemm(qkT_cast, do, dv, policy=T.GemmWarpPolicy.FullRow)

                T.copy(Delta[bz, bx, k * block_N : (k + 1) * block_N], delta)
                for i, j in T.Parallel(block_M, block_N):
                    dsT_cast[i, j] = qkT[i, j] * (dsT[i, j] - delta[j]) * sm_scale
                T.gemm(dsT_cast, q, dk, policy=T.GemmWarpPolicy.FullRow)

                T.copy(dsT_cast, dsT_shared)
                T.clear(dq)
                T.gemm(dsT_shared, K_shared, dq, transpose_A=True)
                for i, j in T.Parallel(block_N, dim_qk):
                    T.atomic_add(dQ[bz, k * block_N + i, bx, j], dq[i, j])
            T.copy(dv, dv_shared)
            T.atomic_add(dV[bz, by * block_M : (by + 1) * block_M, bx // groups, :], dv_shared)
            T.copy(dk, dk_shared)
            T.atomic_add(dK[bz, by * block_M : (by + 1) * block_M, bx // groups, :], dk_shared)

    return flash_bwd


# ---------------------------------------------------------------------------------------------------
# Split-KV flash decoding for GQA with its combine kernel, both `T.macro`s that open their own
# `T.Kernel` (examples/flash_decoding/example_gqa_decode.py as it was with explicit layouts): the
# combine pins its per-split log-sum-exp tiles to threads with `T.Fragment` annotations.
# ---------------------------------------------------------------------------------------------------


def gqa_decode_split(batch, heads, groups, seqlen_kv, dim, block_N=64, block_H=64, num_split=2, num_stages=2,
                     threads=128):
    scale = (1.0 / dim) ** 0.5 * LOG2E
    shape_q = [batch, heads, dim]
    shape_k = [batch, seqlen_kv, groups, dim]
    shape_v = [batch, seqlen_kv, groups, dim]
    shape_o = [batch, heads, dim]
    dtype = T.float16
    accum_dtype = T.float32
    kv_group_num = heads // groups
    part_shape = [batch, heads, num_split, dim]
    valid_block_H = min(block_H, kv_group_num)
    valid_block_N = min(block_N, seqlen_kv // num_split)

    @T.macro
    def flash_attn_split(
        Q: T.Tensor(shape_q, dtype),
        K: T.Tensor(shape_k, dtype),
        V: T.Tensor(shape_v, dtype),
        mask: T.Tensor([batch, seqlen_kv, groups], T.uint8),
        glse: T.Tensor([batch, heads, num_split], dtype),
        Output_partial: T.Tensor(part_shape, dtype),
    ):
        with T.Kernel(batch, heads // valid_block_H, num_split, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_H, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([valid_block_H, dim], dtype)
            acc_s = T.alloc_fragment([block_H, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_H, block_N], dtype)
            mask_local = T.alloc_fragment([block_N], T.uint8)
            acc_o = T.alloc_fragment([block_H, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_H], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_H], accum_dtype)
            scores_scale = T.alloc_fragment([block_H], accum_dtype)
            scores_sum = T.alloc_fragment([block_H], accum_dtype)
            logsum = T.alloc_fragment([block_H], accum_dtype)

            bid = bx
            hid = by
            sid = bz
            cur_kv_head = hid // (kv_group_num // valid_block_H)

            T.copy(Q[bid, hid * valid_block_H : hid * valid_block_H + block_H, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            loop_range = T.ceildiv((seqlen_kv // num_split), block_N)
            for k in T.Pipelined(loop_range, num_stages=num_stages):
                T.copy(
                    K[bid, (seqlen_kv // num_split) * sid + k * valid_block_N : (seqlen_kv // num_split) * sid
                      + (k + 1) * valid_block_N, cur_kv_head, :],
                    K_shared,
                )
                T.copy(
                    mask[bid, (seqlen_kv // num_split) * sid + k * valid_block_N : (seqlen_kv // num_split) * sid
                         + (k + 1) * valid_block_N, cur_kv_head],
                    mask_local,
                )
                T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_H, block_N):
                    acc_s[i, j] = T.if_then_else(
                        (mask_local[j] != 0) & (j < seqlen_kv // num_split), acc_s[i, j], -T.infinity(accum_dtype)
                    )
                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_H):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                for i in T.Parallel(block_H):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_H, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_H):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_H, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.copy(
                    V[bid, (seqlen_kv // num_split) * sid + k * valid_block_N : (seqlen_kv // num_split) * sid
                      + (k + 1) * valid_block_N, cur_kv_head, :],
                    V_shared,
                )
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_H, dim):
                acc_o[i, j] /= logsum[i]
            for i in T.Parallel(block_H):
                logsum[i] = T.log2(logsum[i]) + scores_max[i] * scale

            for i in T.Parallel(block_H):
                if i < valid_block_H:
                    glse[bid, hid * valid_block_H + i, sid] = logsum[i]
            T.copy(acc_o[:valid_block_H, :], O_shared)
            T.copy(O_shared, Output_partial[bid, hid * valid_block_H : (hid + 1) * valid_block_H, sid, :])

    @T.macro
    def combine(
        glse: T.Tensor([batch, heads, num_split], dtype),
        Output_partial: T.Tensor(part_shape, dtype),
        Output: T.Tensor(shape_o, dtype),
    ):
        with T.Kernel(heads, batch, threads=128) as (by, bz):
            po_local = T.alloc_fragment([dim], dtype)
            o_accum_local = T.alloc_fragment([dim], accum_dtype)
            lse_local = T.alloc_fragment([num_split, 128], dtype)
            lse_logsum_local = T.alloc_fragment([128], accum_dtype)
            lse_max_local = T.alloc_fragment([128], accum_dtype)
            scale_local = T.alloc_fragment([128], accum_dtype)

            T.annotate_layout(
                {
                    lse_logsum_local: T.Fragment(lse_logsum_local.shape, forward_thread_fn=lambda i: i),
                    lse_max_local: T.Fragment(lse_max_local.shape, forward_thread_fn=lambda i: i),
                    # lse_local: (local_id, thread_id)
                    lse_local: T.Fragment(lse_local.shape, forward_fn=lambda i, j: (j, i)),
                }
            )

            T.clear(lse_logsum_local)
            T.clear(o_accum_local)
            for k, j in T.Parallel(num_split, 128):
                lse_local[k, j] = glse[bz, by, k]
            T.reduce_max(lse_local, lse_max_local, dim=0, clear=True)
            for k in T.serial(num_split):
                for j in T.Parallel(128):
                    lse_logsum_local[j] += T.exp2(lse_local[k, j] - lse_max_local[j])
            for j in T.Parallel(128):
                lse_logsum_local[j] = T.log2(lse_logsum_local[j]) + lse_max_local[j]
            for k in T.serial(num_split):
                for i in T.Parallel(dim):
                    po_local[i] = Output_partial[bz, by, k, i]
                for j in T.Parallel(128):
                    scale_local[j] = T.exp2(lse_local[k, j] - lse_logsum_local[j])
                # every one of the 128 lanes holds the same scale: lane i scales element i of the row
                for i in T.Parallel(dim):
                    o_accum_local[i] += po_local[i] * scale_local[i]
            for i in T.Parallel(dim):
                Output[bz, by, i] = o_accum_local[i]

    @T.prim_func
    def main(
        Q: T.Tensor(shape_q, dtype),
        K: T.Tensor(shape_k, dtype),
        V: T.Tensor(shape_v, dtype),
        mask: T.Tensor([batch, seqlen_kv, groups], T.uint8),
        glse: T.Tensor([batch, heads, num_split], dtype),
        Output_partial: T.Tensor(part_shape, dtype),
        Output: T.Tensor(shape_o, dtype),
    ):
        flash_attn_split(Q, K, V, mask, glse, Output_partial)
        combine(glse, Output_partial, Output)

    return main


# ---------------------------------------------------------------------------------------------------
# DeepSeek MLA decode (examples/deepseek_mla/example_mla_decode.py, split version): all query heads
# share one latent KV head (its first `dim` columns are also V) plus a rope part; the partial results
# and their log-sum-exps live in `T.alloc_global` workspaces, the combine reduces them with `T.alloc_var`
# scalars; O_shared and S_shared carry the swizzled layouts the example annotated.
# ---------------------------------------------------------------------------------------------------


def mla_decode_split(batch, heads, kv_head_num, seqlen_kv, dim, pe_dim, block_N=64, block_H=64, num_split=2,
                     softmax_scale=None, threads=256):
    if softmax_scale is None:
        softmax_scale = (dim + pe_dim) ** -0.5
    scale = float(softmax_scale * LOG2E)
    dtype = T.float16
    accum_dtype = T.float32
    kv_group_num = heads // kv_head_num
    VALID_BLOCK_H = min(block_H, kv_group_num)
    assert kv_head_num == 1, "kv_head_num must be 1"

    @T.prim_func
    def main_split(
        Q: T.Tensor([batch, heads, dim], dtype),
        Q_pe: T.Tensor([batch, heads, pe_dim], dtype),
        KV: T.Tensor([batch, seqlen_kv, kv_head_num, dim], dtype),
        K_pe: T.Tensor([batch, seqlen_kv, kv_head_num, pe_dim], dtype),
        Output: T.Tensor([batch, heads, dim], dtype),
    ):
        glse = T.alloc_global([batch, heads, num_split], dtype)
        Output_partial = T.alloc_global([batch, heads, num_split, dim], dtype)
        with T.Kernel(batch, heads // min(block_H, kv_group_num), num_split, threads=threads) as (bid, hid, bz):
            Q_shared = T.alloc_shared([block_H, dim], dtype)
            S_shared = T.alloc_shared([block_H, block_N], dtype)
            Q_pe_shared = T.alloc_shared([block_H, pe_dim], dtype)
            KV_shared = T.alloc_shared([block_N, dim], dtype)
            K_pe_shared = T.alloc_shared([block_N, pe_dim], dtype)
            O_shared = T.alloc_shared([block_H, dim], dtype)
            acc_s = T.alloc_fragment([block_H, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_H, block_N], dtype)
            acc_o = T.alloc_fragment([block_H, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_H], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_H], accum_dtype)
            scores_scale = T.alloc_fragment([block_H], accum_dtype)
            scores_sum = T.alloc_fragment([block_H], accum_dtype)
            logsum = T.alloc_fragment([block_H], accum_dtype)

            cur_kv_head = hid // (kv_group_num // block_H)
            T.annotate_layout(
                {
                    O_shared: tilelang.layout.make_swizzled_layout(O_shared),
                    S_shared: tilelang.layout.make_swizzled_layout(S_shared),
                }
            )
            T.use_swizzle(10)

            T.copy(Q[bid, hid * VALID_BLOCK_H : (hid + 1) * VALID_BLOCK_H, :], Q_shared)
            T.copy(Q_pe[bid, hid * VALID_BLOCK_H : (hid + 1) * VALID_BLOCK_H, :], Q_pe_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            loop_range = T.ceildiv((seqlen_kv // num_split), block_N)
            for k in T.Pipelined(loop_range, num_stages=2):
                kv_start = (seqlen_kv // num_split) * bz + k * block_N
                kv_end = (seqlen_kv // num_split) * bz + (k + 1) * block_N
                T.copy(KV[bid, kv_start:kv_end, cur_kv_head, :], KV_shared)
                T.copy(K_pe[bid, kv_start:kv_end, cur_kv_head, :], K_pe_shared)
                T.clear(acc_s)
                T.gemm(Q_shared, KV_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                T.gemm(Q_pe_shared, K_pe_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_H):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                for i in T.Parallel(block_H):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_H, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                T.copy(acc_s, S_shared)
                T.copy(S_shared, acc_s_cast)
                for i in T.Parallel(block_H):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                for i, j in T.Parallel(block_H, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.gemm(acc_s_cast, KV_shared, acc_o, policy=T.GemmWarpPolicy.FullCol)
            for i, j in T.Parallel(block_H, dim):
                acc_o[i, j] /= logsum[i]
            for i in T.Parallel(block_H):
                logsum[i] = T.log2(logsum[i]) + scores_max[i] * scale
            T.copy(logsum, glse[bid, hid * VALID_BLOCK_H : (hid + 1) * VALID_BLOCK_H, bz])
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output_partial[bid, hid * VALID_BLOCK_H : (hid + 1) * VALID_BLOCK_H, bz, :])

        # combine
        with T.Kernel(heads, batch, threads=128) as (hid, bz):
            po_local = T.alloc_fragment([dim], dtype)
            o_accum_local = T.alloc_fragment([dim], accum_dtype)
            lse_local_split = T.alloc_var(accum_dtype)
            lse_logsum_local = T.alloc_var(accum_dtype)
            lse_max_local = T.alloc_var(accum_dtype)
            scale_local = T.alloc_var(accum_dtype)

            T.clear(lse_logsum_local)
            T.clear(o_accum_local)
            lse_max_local = -T.infinity(accum_dtype)
            for k in T.serial(num_split):
                lse_max_local = T.max(lse_max_local, glse[bz, hid, k])
            for k in T.Pipelined(num_split, num_stages=1):
                lse_local_split = glse[bz, hid, k]
                lse_logsum_local += T.exp2(lse_local_split - lse_max_local)
            lse_logsum_local = T.log2(lse_logsum_local) + lse_max_local
            for k in T.serial(num_split):
                for i in T.Parallel(dim):
                    po_local[i] = Output_partial[bz, hid, k, i]
                lse_local_split = glse[bz, hid, k]
                scale_local = T.exp2(lse_local_split - lse_logsum_local)
                for i in T.Parallel(dim):
                    o_accum_local[i] += po_local[i] * scale_local
            for i in T.Parallel(dim):
                Output[bz, hid, i] = o_accum_local[i]

    return main_split


# ---------------------------------------------------------------------------------------------------
# Paged-KV split decode for GQA: the KV cache is a pool of fixed-size pages, each sequence's pages listed
# in a block table and its length in cache_seqlens (the paging of examples/deepseek_mla/
# example_mla_decode_paged.py and examples/blocksparse_attention/example_tilelang_sparse_gqa_decode_paged.py).
# Each split walks its share of the sequence's KV blocks; the combine reduces the splits with `T.alloc_var`
# scalars. The pool and table sizes are `T.dynamic`. The physical page is a plain binding inside the
# pipelined loop, as in both examples: a `T.alloc_var` written there is rejected by 0.1.15's software
# pipeliner, and with warp specialization the producer warps would read it unassigned.
# ---------------------------------------------------------------------------------------------------


def gqa_decode_paged_split(batch, heads, heads_kv, dim, page_block_size, num_split=2, block_N=64, block_H=64,
                           num_stages=2, threads=128):
    scale = (1.0 / dim) ** 0.5 * LOG2E
    dtype = T.float16
    accum_dtype = T.float32
    kv_group_num = heads // heads_kv
    valid_block_H = min(block_H, kv_group_num)
    assert block_N <= page_block_size and page_block_size % block_N == 0
    block_ratio = page_block_size // block_N

    num_pages = T.dynamic("num_pages")
    max_num_blocks_per_seq = T.dynamic("max_num_blocks_per_seq")
    shape_q = [batch, heads, dim]
    shape_kv = [num_pages, page_block_size, heads_kv, dim]
    part_shape = [batch, heads, num_split, dim]

    @T.prim_func
    def main(
        Q: T.Tensor(shape_q, dtype),
        K: T.Tensor(shape_kv, dtype),
        V: T.Tensor(shape_kv, dtype),
        block_table: T.Tensor([batch, max_num_blocks_per_seq], T.int32),
        cache_seqlens: T.Tensor([batch], T.int32),
        glse: T.Tensor([batch, heads, num_split], accum_dtype),
        Output_partial: T.Tensor(part_shape, accum_dtype),
        Output: T.Tensor(shape_q, dtype),
    ):
        # split kv
        with T.Kernel(batch, heads // valid_block_H, num_split, threads=threads) as (bid, hid, sid):
            Q_shared = T.alloc_shared([block_H, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            acc_s = T.alloc_fragment([block_H, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_H, block_N], dtype)
            acc_o = T.alloc_fragment([block_H, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_H], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_H], accum_dtype)
            scores_scale = T.alloc_fragment([block_H], accum_dtype)
            scores_sum = T.alloc_fragment([block_H], accum_dtype)
            logsum = T.alloc_fragment([block_H], accum_dtype)

            cur_kv_head = hid // (kv_group_num // valid_block_H)

            T.copy(Q[bid, hid * valid_block_H : hid * valid_block_H + block_H, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            total_blocks = T.ceildiv(cache_seqlens[bid], block_N)
            blocks_per_split = T.floordiv(total_blocks, num_split)
            remaining_blocks = T.floormod(total_blocks, num_split)
            loop_range = blocks_per_split + T.if_then_else(sid < remaining_blocks, 1, 0)
            start = blocks_per_split * sid + T.min(sid, remaining_blocks)

            for k in T.Pipelined(loop_range, num_stages=num_stages):
                logical_block = start + k
                physical_page = block_table[bid, logical_block // block_ratio]
                page_offset = (logical_block % block_ratio) * block_N
                T.copy(K[physical_page, page_offset : page_offset + block_N, cur_kv_head, :], K_shared)
                T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_H, block_N):
                    acc_s[i, j] = T.if_then_else(
                        logical_block * block_N + j >= cache_seqlens[bid], -T.infinity(accum_dtype), acc_s[i, j]
                    )
                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_H):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_H, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_H):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_H, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.copy(V[physical_page, page_offset : page_offset + block_N, cur_kv_head, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_H, dim):
                acc_o[i, j] /= logsum[i]
            for i in T.Parallel(block_H):
                logsum[i] = T.log2(logsum[i]) + scores_max[i] * scale

            for i in T.Parallel(block_H):
                if i < valid_block_H:
                    glse[bid, hid * valid_block_H + i, sid] = logsum[i]
            for i, j in T.Parallel(block_H, dim):
                if i < valid_block_H:
                    Output_partial[bid, hid * valid_block_H + i, sid, j] = acc_o[i, j]

        # combine
        with T.Kernel(heads, batch, threads=128) as (hid, bid):
            po_local = T.alloc_fragment([dim], accum_dtype)
            o_accum_local = T.alloc_fragment([dim], accum_dtype)
            lse_local_split = T.alloc_var(accum_dtype)
            lse_logsum_local = T.alloc_var(accum_dtype)
            lse_max_local = T.alloc_var(accum_dtype)
            scale_local = T.alloc_var(accum_dtype)

            T.clear(lse_logsum_local)
            T.clear(o_accum_local)
            lse_max_local = -T.infinity(accum_dtype)
            for k in T.serial(num_split):
                lse_max_local = T.max(lse_max_local, glse[bid, hid, k])
            for k in T.serial(num_split):
                lse_local_split = glse[bid, hid, k]
                lse_logsum_local += T.exp2(lse_local_split - lse_max_local)
            lse_logsum_local = T.log2(lse_logsum_local) + lse_max_local
            for k in T.serial(num_split):
                for i in T.Parallel(dim):
                    po_local[i] = Output_partial[bid, hid, k, i]
                lse_local_split = glse[bid, hid, k]
                scale_local = T.exp2(lse_local_split - lse_logsum_local)
                for i in T.Parallel(dim):
                    o_accum_local[i] += po_local[i] * scale_local
            for i in T.Parallel(dim):
                Output[bid, hid, i] = o_accum_local[i]

    return main


# ---------------------------------------------------------------------------------------------------
# Attention with a learned sink per head and a sliding window, bf16
# (examples/attention_sink/example_mha_sink_fwd_bhsd.py).
# ---------------------------------------------------------------------------------------------------


def mha_sink_fwd_bhsd(batch, heads, seq_q, seq_kv, dim, window_size=None, sm_scale=None, block_M=64, block_N=64,
                      num_stages=1, threads=128, dtype=T.bfloat16):
    if window_size is not None:
        assert window_size % block_N == 0, "window_size must be divisible by block_N"
    if sm_scale is None:
        sm_scale = (1.0 / dim) ** 0.5
    scale = sm_scale * LOG2E
    q_shape = [batch, heads, seq_q, dim]
    kv_shape = [batch, heads, seq_kv, dim]
    accum_dtype = T.float32
    past_len = seq_kv - seq_q
    assert past_len >= 0, "seq_kv must be greater than or equal to seq_q"

    @T.prim_func
    def main(
        Q: T.Tensor(q_shape, dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        Output: T.Tensor(q_shape, dtype),
        Sinks: T.Tensor([heads], dtype),
    ):
        with T.Kernel(T.ceildiv(seq_q, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)
            sinks = T.alloc_fragment([block_M], dtype)

            T.copy(Q[bz, by, bx * block_M : (bx + 1) * block_M, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))
            for i in T.Parallel(block_M):
                sinks[i] = Sinks[by]

            end = T.min(T.ceildiv(seq_kv, block_N), T.ceildiv((bx + 1) * block_M + past_len, block_N))
            start = T.max(0, (bx * block_M + past_len - window_size) // block_N) if window_size is not None else 0

            for k in T.Pipelined(start, end, num_stages=num_stages):
                T.copy(K[bz, by, k * block_N : (k + 1) * block_N, :], K_shared)
                for i, j in T.Parallel(block_M, block_N):
                    q_idx = bx * block_M + i + past_len
                    k_idx = k * block_N + j
                    if window_size is not None:
                        acc_s[i, j] = T.if_then_else(q_idx >= k_idx and q_idx < k_idx + window_size, 0,
                                                     -T.infinity(acc_s.dtype))
                    else:
                        acc_s[i, j] = T.if_then_else(q_idx >= k_idx, 0, -T.infinity(acc_s.dtype))
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                # check_inf: a block can be fully outside a row's window
                for i in T.Parallel(block_M):
                    if window_size is not None:
                        scores_max[i] = T.if_then_else(scores_max[i] == -T.infinity(accum_dtype), 0, scores_max[i])
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)

                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]

                T.copy(V[bz, by, k * block_N : (k + 1) * block_N, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            for i in T.Parallel(block_M):
                logsum[i] += T.exp2(sinks[i] * LOG2E - scores_max[i] * scale)  # the sink joins the denominator
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, by, bx * block_M : (bx + 1) * block_M, :])

    return main


# ---------------------------------------------------------------------------------------------------
# Block-sparse attention: a per-(query block, key block) boolean mask skips whole key blocks
# (examples/blocksparse_attention/example_tilelang_block_sparse_attn.py).
# ---------------------------------------------------------------------------------------------------


def blocksparse_fwd_bhsd(batch, heads, seq_len, dim, downsample_len, is_causal, block_M=64, block_N=64,
                         num_stages=1, threads=128):
    scale = (1.0 / dim) ** 0.5 * LOG2E
    shape = [batch, heads, seq_len, dim]
    block_mask_shape = [batch, heads, downsample_len, downsample_len]
    dtype = T.float16
    accum_dtype = T.float32
    block_mask_dtype = T.bool

    @T.prim_func
    def blocksparse_flashattn(
        Q: T.Tensor(shape, dtype),
        K: T.Tensor(shape, dtype),
        V: T.Tensor(shape, dtype),
        BlockSparseMask: T.Tensor(block_mask_shape, block_mask_dtype),
        Output: T.Tensor(shape, dtype),
    ):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)
            block_mask = T.alloc_fragment([downsample_len], block_mask_dtype)

            T.copy(Q[bz, by, bx * block_M : (bx + 1) * block_M, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))
            T.copy(BlockSparseMask[bz, by, bx, :], block_mask)

            loop_range = (
                T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N)) if is_causal
                else T.ceildiv(seq_len, block_N)
            )
            for k in T.Pipelined(loop_range, num_stages=num_stages):
                if block_mask[k] != 0:
                    T.copy(K[bz, by, k * block_N : (k + 1) * block_N, :], K_shared)
                    if is_causal:
                        for i, j in T.Parallel(block_M, block_N):
                            acc_s[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, 0,
                                                         -T.infinity(acc_s.dtype))
                    else:
                        T.clear(acc_s)
                    T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                    T.copy(scores_max, scores_max_prev)
                    T.fill(scores_max, -T.infinity(accum_dtype))
                    T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                    for i in T.Parallel(block_M):
                        scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                    for i in T.Parallel(block_M):
                        scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                    T.reduce_sum(acc_s, scores_sum, dim=1)
                    for i in T.Parallel(block_M):
                        logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                    T.copy(acc_s, acc_s_cast)

                    for i, j in T.Parallel(block_M, dim):
                        acc_o[i, j] *= scores_scale[i]

                    T.copy(V[bz, by, k * block_N : (k + 1) * block_N, :], V_shared)
                    T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, by, bx * block_M : (bx + 1) * block_M, :])

    return blocksparse_flashattn


# ===================================================================================================
# torch references and the checks (run on the GPU machine only; torch is imported lazily)
# ===================================================================================================


_DEVICE = "cuda"  # where the checks make their tensors (a CPU dry run of the references may change it)


def _seed():
    import torch

    torch.manual_seed(0)
    torch.cuda.manual_seed(0)


def _ref_attention_bhsd(q, k, v, is_causal=False, sm_scale=None, mask=None):
    """softmax(q k^T * scale) v in fp32 on [batch, heads, seq, dim] tensors; causal aligned bottom-right
    (query i sees keys up to i + seq_kv - seq_q); `mask` (broadcastable bool, True = keep) is optional.
    K/V with fewer heads than Q are shared by consecutive groups of query heads (GQA)."""
    import torch

    q, k, v = q.float(), k.float(), v.float()
    if k.size(1) != q.size(1):
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
        v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    if sm_scale is None:
        sm_scale = q.size(-1) ** -0.5
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * sm_scale
    seq_q, seq_kv = q.size(2), k.size(2)
    keep = torch.ones(seq_q, seq_kv, dtype=torch.bool, device=q.device)
    if is_causal:
        keep = torch.tril(keep, diagonal=seq_kv - seq_q)
    if mask is not None:
        keep = keep & mask
    scores = scores.masked_fill(~keep, float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", scores.softmax(dim=-1), v)


def _ref_attention_bshd(q, k, v, is_causal=False):
    out = _ref_attention_bhsd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal)
    return out.transpose(1, 2)


def _close(actual, expected, tol):
    import torch

    torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol)


def _randn(*shape, dtype=None):
    import torch

    return torch.randn(*shape, device=_DEVICE, dtype=dtype or torch.float16)


# --- forward checks ---------------------------------------------------------------------------------

FWD_BSHD = dict(batch=1, heads=2, seq_len=256, dim=64)
FWD_BHSD = dict(batch=1, heads=2, seq_q=128, seq_kv=256, dim=64)
FWD_SWIZZLE = dict(batch=1, heads=2, seq_len=256, dim=64)
FWD_WGMMA = dict(batch=1, heads=2, seq_len=512, dim=128)
FWD_DYN = dict(batch=1, heads=2, dim=64)
GQA_FWD = dict(batch=1, heads=4, seq_len=256, dim=64, groups=2)


def _check_fwd_bshd(kernel, cfg, is_causal, dtype_name="float16", tol=1e-2):
    import torch

    _seed()
    dtype = getattr(torch, dtype_name)
    b, h, s, d = cfg["batch"], cfg["heads"], cfg["seq_len"], cfg["dim"]
    q, k, v = (_randn(b, s, h, d, dtype=dtype) for _ in range(3))
    out = kernel(q, k, v)
    _close(out, _ref_attention_bshd(q, k, v, is_causal), tol)


def check_fwd_bshd_macro(kernel):
    _check_fwd_bshd(kernel, FWD_BSHD, is_causal=False)


def check_fwd_bshd_swizzled(kernel):
    _check_fwd_bshd(kernel, FWD_SWIZZLE, is_causal=True)


def check_fwd_bshd_wgmma(kernel):
    _check_fwd_bshd(kernel, FWD_WGMMA, is_causal=False)


def check_fwd_bhsd_causal_bf16(kernel):
    import torch

    _seed()
    c = FWD_BHSD
    q = _randn(c["batch"], c["heads"], c["seq_q"], c["dim"], dtype=torch.bfloat16)
    k = _randn(c["batch"], c["heads"], c["seq_kv"], c["dim"], dtype=torch.bfloat16)
    v = _randn(c["batch"], c["heads"], c["seq_kv"], c["dim"], dtype=torch.bfloat16)
    out = kernel(q, k, v)
    _close(out, _ref_attention_bhsd(q, k, v, is_causal=True), 3e-2)


def check_fwd_dynamic(kernel):
    _seed()
    c = FWD_DYN
    for seq_len in (200, 384):  # one compiled kernel, two lengths, one of them not a multiple of the block
        q, k, v = (_randn(c["batch"], c["heads"], seq_len, c["dim"]) for _ in range(3))
        out = kernel(q, k, v)
        _close(out, _ref_attention_bhsd(q, k, v), 1e-2)


def check_gqa_fwd(kernel):
    _seed()
    c = GQA_FWD
    b, h, s, d, g = c["batch"], c["heads"], c["seq_len"], c["dim"], c["groups"]
    q = _randn(b, s, h, d)
    k = _randn(b, s, h // g, d)
    v = _randn(b, s, h // g, d)
    out = kernel(q, k, v)
    _close(out, _ref_attention_bshd(q, k, v, is_causal=True), 1e-2)


# --- backward checks --------------------------------------------------------------------------------

BWD = dict(batch=1, heads=2, seq_len=256, dim=64)
GQA_BWD = dict(batch=1, heads=4, seq_len=256, dim_qk=64, dim_v=64, groups=2)


def _dq_physical_index(batch, seq_len, heads, dim, device):
    """For each logical dQ element (b, l, h, d), its offset in the buffer laid out by make_dq_layout:
    [b, l // 8, h, d // 8, d % 2, 4 * (l % 8) + (d % 8) // 2], row-major."""
    import torch

    b, l, h, d = torch.meshgrid(
        *(torch.arange(n, device=device) for n in (batch, seq_len, heads, dim)), indexing="ij"
    )
    offset = b * (seq_len // 8) + l // 8
    offset = offset * heads + h
    offset = offset * (dim // 8) + d // 8
    offset = offset * 2 + d % 2
    return offset * 32 + 4 * (l % 8) + (d % 8) // 2


def _dq_to_logical(dq_physical):
    idx = _dq_physical_index(*dq_physical.shape, dq_physical.device)
    return dq_physical.flatten()[idx]


def _dq_to_physical(dq_logical):
    import torch

    idx = _dq_physical_index(*dq_logical.shape, dq_logical.device)
    out = torch.empty_like(dq_logical)
    out.view(-1)[idx.flatten()] = dq_logical.flatten()
    return out


def _bwd_inputs(batch, seq_len, heads, heads_kv, dim, is_causal):
    """fp16 inputs, the fp32 forward (its output and base-2 log-sum-exp [b, h, s]), Delta, and the
    autograd gradients of fp32 copies."""
    import torch

    q = _randn(batch, seq_len, heads, dim)
    k = _randn(batch, seq_len, heads_kv, dim)
    v = _randn(batch, seq_len, heads_kv, dim)
    do = _randn(batch, seq_len, heads, dim)
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    out = _ref_attention_bshd(qf, kf, vf, is_causal)
    out.backward(do.float())
    with torch.no_grad():
        kr = kf.repeat_interleave(heads // heads_kv, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", qf, kr) * dim**-0.5
        if is_causal:
            keep = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device))
            scores = scores.masked_fill(~keep, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1) * LOG2E  # [b, h, s], base 2 as the forward stores it
        delta = (out * do.float()).sum(-1).transpose(1, 2).contiguous()  # [b, h, s]
    return q, k, v, do, out.detach(), lse.contiguous(), delta, (qf.grad, kf.grad, vf.grad)


def check_bwd_preprocess(kernel):
    import torch

    _seed()
    c = BWD
    o = _randn(c["batch"], c["seq_len"], c["heads"], c["dim"])
    do = _randn(c["batch"], c["seq_len"], c["heads"], c["dim"])
    delta = kernel(o, do)
    # The kernel multiplies in fp16 (as examples/flash_attention does) and sums in fp32: the products'
    # fp16 rounding, summed over `dim`, is the tolerance (the H100 run saw 4.4e-3 against fp32 products).
    expected = (o * do).float().sum(-1).transpose(1, 2)
    torch.testing.assert_close(delta, expected, rtol=1e-2, atol=1e-2)


def check_bwd_postprocess(kernel):
    import torch

    _seed()
    c = BWD
    dq = torch.randn(c["batch"], c["seq_len"], c["heads"], c["dim"], device=_DEVICE, dtype=torch.float32)
    out = kernel(_dq_to_physical(dq))
    torch.testing.assert_close(out, dq.half(), rtol=1e-3, atol=1e-3)


def check_bwd_main(kernel):
    import torch

    _seed()
    c = BWD
    b, s, h, d = c["batch"], c["seq_len"], c["heads"], c["dim"]
    q, k, v, do, _, lse, delta, (dq_ref, dk_ref, dv_ref) = _bwd_inputs(b, s, h, h, d, is_causal=True)
    dq = torch.zeros(b, s, h, d, device=_DEVICE, dtype=torch.float32)
    dk = torch.empty(b, s, h, d, device=_DEVICE, dtype=torch.float16)
    dv = torch.empty(b, s, h, d, device=_DEVICE, dtype=torch.float16)
    kernel(q, k, v, do, lse, delta, dq, dk, dv)
    _close(dv, dv_ref, 2e-2)
    _close(dk, dk_ref, 2e-2)
    _close(_dq_to_logical(dq), dq_ref, 2e-2)


def check_gqa_bwd(kernel):
    import torch

    _seed()
    c = GQA_BWD
    b, s, h, d, g = c["batch"], c["seq_len"], c["heads"], c["dim_qk"], c["groups"]
    q, k, v, do, _, lse, delta, (dq_ref, dk_ref, dv_ref) = _bwd_inputs(b, s, h, h // g, d, is_causal=False)
    dq = torch.zeros(b, s, h, d, device=_DEVICE, dtype=torch.float32)
    dk = torch.zeros(b, s, h // g, d, device=_DEVICE, dtype=torch.float32)
    dv = torch.zeros(b, s, h // g, d, device=_DEVICE, dtype=torch.float32)
    kernel(q, k, v, do, lse, delta, dq, dk, dv)
    _close(dv, dv_ref, 2e-2)
    _close(dk, dk_ref, 2e-2)
    _close(_dq_to_logical(dq), dq_ref, 2e-2)


# --- decode checks ----------------------------------------------------------------------------------

DECODE_SPLIT = dict(batch=1, heads=8, groups=2, seqlen_kv=256, dim=64, num_split=2)
MLA = dict(batch=1, heads=64, kv_head_num=1, seqlen_kv=256, dim=256, pe_dim=64, num_split=2)
PAGED = dict(batch=2, heads=8, heads_kv=2, dim=64, page_block_size=128, num_split=2)


def check_gqa_decode_split(kernel):
    import torch

    _seed()
    c = DECODE_SPLIT
    b, h, g, s, d, n = c["batch"], c["heads"], c["groups"], c["seqlen_kv"], c["dim"], c["num_split"]
    q = _randn(b, h, d)
    k = _randn(b, s, g, d)
    v = _randn(b, s, g, d)
    mask = (torch.rand(b, s, g, device=_DEVICE) > 0.2).to(torch.uint8)
    mask[:, :: s // n, :] = 1  # every split keeps at least one key
    glse = torch.empty(b, h, n, device=_DEVICE, dtype=torch.float16)
    partial = torch.empty(b, h, n, d, device=_DEVICE, dtype=torch.float16)
    out = kernel(q, k, v, mask, glse, partial)
    keep = mask.bool().permute(0, 2, 1).repeat_interleave(h // g, dim=1)[:, :, None, :]  # [b, h, 1, s]
    ref = _ref_attention_bhsd(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2), mask=keep)[:, :, 0, :]
    _close(out, ref, 1e-2)


def check_mla_decode(kernel):
    import torch

    _seed()
    c = MLA
    b, h, s, d, p = c["batch"], c["heads"], c["seqlen_kv"], c["dim"], c["pe_dim"]
    q = _randn(b, h, d) * 0.5
    q_pe = _randn(b, h, p) * 0.5
    kv = _randn(b, s, 1, d) * 0.5
    k_pe = _randn(b, s, 1, p) * 0.5
    out = kernel(q, q_pe, kv, k_pe)
    scores = (torch.einsum("bhd,bsd->bhs", q.float(), kv[:, :, 0].float())
              + torch.einsum("bhd,bsd->bhs", q_pe.float(), k_pe[:, :, 0].float())) * (d + p) ** -0.5
    ref = torch.einsum("bhs,bsd->bhd", scores.softmax(-1), kv[:, :, 0].float())
    _close(out, ref, 1e-2)


def check_paged_decode(kernel):
    import torch

    _seed()
    c = PAGED
    b, h, hk, d, page, n = c["batch"], c["heads"], c["heads_kv"], c["dim"], c["page_block_size"], c["num_split"]
    seqlens = torch.tensor([200, 160][:b], device=_DEVICE, dtype=torch.int32)  # every split gets a KV block
    max_pages = 4
    num_pages = b * max_pages + 3
    k_cache = _randn(num_pages, page, hk, d)
    v_cache = _randn(num_pages, page, hk, d)
    block_table = torch.randperm(num_pages, device=_DEVICE)[: b * max_pages].view(b, max_pages).to(torch.int32)
    q = _randn(b, h, d)
    glse = torch.empty(b, h, n, device=_DEVICE, dtype=torch.float32)
    partial = torch.empty(b, h, n, d, device=_DEVICE, dtype=torch.float32)
    out = kernel(q, k_cache, v_cache, block_table, seqlens, glse, partial)
    for i in range(b):
        length = int(seqlens[i])
        keys = k_cache[block_table[i].long()].reshape(-1, hk, d)[:length]  # [length, hk, d]
        vals = v_cache[block_table[i].long()].reshape(-1, hk, d)[:length]
        ref = _ref_attention_bhsd(q[i, None, :, None, :], keys.transpose(0, 1)[None], vals.transpose(0, 1)[None])
        _close(out[i], ref[0, :, 0, :], 1e-2)


# --- sink and block-sparse checks ---------------------------------------------------------------------

SINK = dict(batch=1, heads=2, seq_q=256, seq_kv=256, dim=64, window_size=128)
BLOCKSPARSE = dict(batch=1, heads=2, seq_len=256, dim=64, downsample_len=4)


def check_sink(kernel):
    import torch

    _seed()
    c = SINK
    b, h, sq, skv, d, w = c["batch"], c["heads"], c["seq_q"], c["seq_kv"], c["dim"], c["window_size"]
    q = _randn(b, h, sq, d, dtype=torch.bfloat16)
    k = _randn(b, h, skv, d, dtype=torch.bfloat16)
    v = _randn(b, h, skv, d, dtype=torch.bfloat16)
    sinks = _randn(h, dtype=torch.bfloat16)
    out = kernel(q, k, v, sinks)
    logits = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) * d**-0.5
    pos_q = torch.arange(sq, device=_DEVICE)[:, None] + (skv - sq)
    pos_k = torch.arange(skv, device=_DEVICE)[None, :]
    keep = (pos_k <= pos_q) & (pos_k > pos_q - w)
    logits = logits.masked_fill(~keep, float("-inf"))
    sink = sinks.float().view(1, h, 1, 1).expand(b, h, sq, 1)
    probs = torch.cat([logits, sink], dim=-1).softmax(-1)[..., :-1]  # the sink takes mass, adds no value
    ref = torch.einsum("bhqk,bhkd->bhqd", probs, v.float())
    _close(out, ref, 3e-2)


def check_blocksparse(kernel):
    import torch

    _seed()
    c = BLOCKSPARSE
    b, h, s, d, n = c["batch"], c["heads"], c["seq_len"], c["dim"], c["downsample_len"]
    q, k, v = (_randn(b, h, s, d) for _ in range(3))
    block_mask = torch.rand(b, h, n, n, device=_DEVICE) > 0.5
    block_mask |= torch.eye(n, dtype=torch.bool, device=_DEVICE)  # every query block sees its own block
    block_mask = block_mask.tril()
    out = kernel(q, k, v, block_mask)
    blk = s // n
    token_mask = block_mask.repeat_interleave(blk, dim=2).repeat_interleave(blk, dim=3)
    _close(out, _ref_attention_bhsd(q, k, v, is_causal=True, mask=token_mask), 1e-2)


# ===================================================================================================
# The corpus entries
# ===================================================================================================


def build_fwd_bshd_macro():
    return mha_fwd_bshd(**FWD_BSHD, is_causal=False)


def build_fwd_bhsd_causal_bf16():
    return mha_fwd_bhsd(**FWD_BHSD, is_causal=True, dtype=T.bfloat16)


def build_fwd_bshd_swizzled():
    return mha_fwd_bshd_swizzled(**FWD_SWIZZLE, is_causal=True)


def build_fwd_bshd_wgmma():
    return mha_fwd_bshd_wgmma_pipelined(**FWD_WGMMA, is_causal=False)


def build_fwd_dynamic():
    return mha_fwd_bhsd_dynamic(**FWD_DYN)


def build_gqa_fwd():
    return gqa_fwd_bshd(**GQA_FWD, is_causal=True)


def build_bwd_preprocess():
    return mha_bwd_preprocess(**BWD)


def build_bwd_main():
    return mha_bwd_bshd(**BWD, is_causal=True)


def build_bwd_postprocess():
    return mha_bwd_postprocess(**BWD)


def build_gqa_bwd():
    return gqa_bwd_atomic_add(**GQA_BWD, is_causal=False)


def build_gqa_decode_split():
    return gqa_decode_split(**DECODE_SPLIT)


def build_mla_decode():
    return mla_decode_split(**MLA)


def build_paged_decode():
    return gqa_decode_paged_split(**PAGED)


def build_sink():
    return mha_sink_fwd_bhsd(**SINK)


def build_blocksparse():
    return blocksparse_fwd_bhsd(**BLOCKSPARSE, is_causal=True)


KERNELS: list[CorpusKernel] = [
    CorpusKernel(
        name="attn_fwd_bshd_macro_fp16",
        build=build_fwd_bshd_macro,
        gpu_check=check_fwd_bshd_macro,
        out_idx=[3],
        pass_configs=FAST_MATH,
        features=("flash_fwd", "bshd", "macro", "pipelined", "exp2", "fp16", "fast_math"),
    ),
    CorpusKernel(
        name="attn_fwd_bhsd_causal_bf16",
        build=build_fwd_bhsd_causal_bf16,
        gpu_check=check_fwd_bhsd_causal_bf16,
        out_idx=[3],
        pass_configs=FAST_MATH,
        features=("flash_fwd", "bhsd", "causal", "kv_prefix", "macro", "pipelined", "exp2", "bf16", "fast_math"),
    ),
    CorpusKernel(
        name="attn_fwd_bshd_swizzled_causal",
        build=build_fwd_bshd_swizzled,
        gpu_check=check_fwd_bshd_swizzled,
        out_idx=[3],
        pass_configs=FAST_MATH,
        features=("flash_fwd", "bshd", "causal", "swizzle", "custom_layout", "pipelined", "exp2", "fp16"),
    ),
    CorpusKernel(
        name="attn_fwd_bshd_wgmma_pipelined",
        build=build_fwd_bshd_wgmma,
        gpu_check=check_fwd_bshd_wgmma,
        out_idx=[3],
        pass_configs=FAST_MATH,
        features=("flash_fwd", "bshd", "wgmma", "pipelined", "pipeline_order_stage_group", "exp2", "fp16"),
    ),
    CorpusKernel(
        name="attn_fwd_bhsd_dynamic_seqlen",
        build=build_fwd_dynamic,
        gpu_check=check_fwd_dynamic,
        out_idx=[3],
        pass_configs=FAST_MATH,
        features=("flash_fwd", "bhsd", "dynamic_shape", "boundary_mask", "pipelined", "exp2", "fp16"),
    ),
    CorpusKernel(
        name="attn_fwd_gqa_bshd_causal",
        build=build_gqa_fwd,
        gpu_check=check_gqa_fwd,
        out_idx=[3],
        pass_configs=FAST_MATH,
        features=("flash_fwd", "gqa", "bshd", "causal", "pipelined", "exp2", "fp16"),
    ),
    CorpusKernel(
        name="attn_bwd_preprocess",
        build=build_bwd_preprocess,
        gpu_check=check_bwd_preprocess,
        out_idx=[2],
        pass_configs=FAST_MATH,
        features=("flash_bwd", "bwd_preprocess", "reduce", "fp16"),
    ),
    CorpusKernel(
        name="attn_bwd_bshd_causal_atomic_dq",
        build=build_bwd_main,
        gpu_check=check_bwd_main,
        out_idx=None,
        pass_configs=FAST_MATH,
        features=("flash_bwd", "causal", "atomics", "custom_layout", "global_layout", "pipelined", "exp2", "fp16"),
    ),
    CorpusKernel(
        name="attn_bwd_postprocess_dq",
        build=build_bwd_postprocess,
        gpu_check=check_bwd_postprocess,
        out_idx=[1],
        pass_configs=FAST_MATH,
        features=("flash_bwd", "bwd_postprocess", "custom_layout", "global_layout", "cast"),
    ),
    CorpusKernel(
        name="attn_bwd_gqa_atomic_dkdv",
        build=build_gqa_bwd,
        gpu_check=check_gqa_bwd,
        out_idx=None,
        pass_configs=FAST_MATH,
        features=("flash_bwd", "gqa", "atomics", "tile_atomic_add", "custom_layout", "global_layout", "pipelined"),
    ),
    CorpusKernel(
        name="attn_decode_gqa_split_kv_combine",
        build=build_gqa_decode_split,
        gpu_check=check_gqa_decode_split,
        out_idx=[6],
        pass_configs={tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True},
        features=("decode", "split_kv", "combine", "gqa", "macro", "two_kernels", "fragment", "custom_layout",
                  "mask", "pipelined"),
    ),
    CorpusKernel(
        name="attn_decode_mla_split_swizzled",
        build=build_mla_decode,
        gpu_check=check_mla_decode,
        out_idx=[4],
        pass_configs=FAST_MATH,
        features=("decode", "mla", "split_kv", "combine", "two_kernels", "alloc_global", "alloc_var", "swizzle",
                  "custom_layout", "use_swizzle", "pipelined"),
    ),
    CorpusKernel(
        name="attn_decode_gqa_paged_split",
        build=build_paged_decode,
        gpu_check=check_paged_decode,
        out_idx=[7],
        pass_configs=FAST_MATH,
        features=("decode", "paged", "block_table", "split_kv", "combine", "two_kernels", "alloc_var", "gqa",
                  "dynamic_shape", "pipelined"),
    ),
    CorpusKernel(
        name="attn_fwd_sink_sliding_window_bf16",
        build=build_sink,
        gpu_check=check_sink,
        out_idx=[3],
        pass_configs=FAST_MATH,
        features=("flash_fwd", "attention_sink", "sliding_window", "causal", "bhsd", "check_inf", "bf16"),
    ),
    CorpusKernel(
        name="attn_fwd_blocksparse_causal",
        build=build_blocksparse,
        gpu_check=check_blocksparse,
        out_idx=[4],
        pass_configs=FAST_MATH,
        features=("flash_fwd", "block_sparse", "causal", "bhsd", "bool_mask", "pipelined", "fp16"),
    ),
]
