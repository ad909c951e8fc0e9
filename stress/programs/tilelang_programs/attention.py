"""A flash-attention forward (Q, K, V laid out batch, seq, heads, dim) in the style of TileLang's
examples/flash_attention/example_mha_fwd_bshd.py: one block of queries per program, the keys and values
streamed through shared memory in blocks, an online softmax in exp2; nothing here knows about kcache."""

import tilelang
import tilelang.language as T
from report import finish

LOG2_E = 1.44269504


@tilelang.jit(out_idx=[3], pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True})
def flashattn(batch, heads, seq_len, dim, is_causal, block_M=64, block_N=64, num_stages=1, threads=128):
    scale = (1.0 / dim) ** 0.5 * LOG2_E  # softmax in base 2: exp(x / sqrt(d)) = exp2(x * scale)
    shape = [batch, seq_len, heads, dim]
    dtype = "float16"
    accum_dtype = "float"

    @T.macro
    def scores_of_block(K: T.Tensor(shape, dtype), Q_shared: T.SharedBuffer([block_M, dim], dtype),
                        K_shared: T.SharedBuffer([block_N, dim], dtype),
                        acc_s: T.FragmentBuffer([block_M, block_N], accum_dtype),
                        k: T.int32, bx: T.int32, by: T.int32, bz: T.int32):
        T.copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_shared)
        if is_causal:
            for i, j in T.Parallel(block_M, block_N):
                acc_s[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, 0, -T.infinity(acc_s.dtype))
        else:
            T.clear(acc_s)
        T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def online_softmax(acc_s: T.FragmentBuffer([block_M, block_N], accum_dtype),
                       acc_s_cast: T.FragmentBuffer([block_M, block_N], dtype),
                       scores_max: T.FragmentBuffer([block_M], accum_dtype),
                       scores_max_prev: T.FragmentBuffer([block_M], accum_dtype),
                       scores_scale: T.FragmentBuffer([block_M], accum_dtype),
                       scores_sum: T.FragmentBuffer([block_M], accum_dtype),
                       logsum: T.FragmentBuffer([block_M], accum_dtype)):
        T.copy(scores_max, scores_max_prev)
        T.fill(scores_max, -T.infinity(accum_dtype))
        T.reduce_max(acc_s, scores_max, dim=1, clear=False)
        for i in T.Parallel(block_M):
            scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
        for i, j in T.Parallel(block_M, block_N):
            acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)  # one ffma, not fadd and fmul
        T.reduce_sum(acc_s, scores_sum, dim=1)
        for i in T.Parallel(block_M):
            logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
        T.copy(acc_s, acc_s_cast)

    @T.macro
    def accumulate_values(V: T.Tensor(shape, dtype), V_shared: T.SharedBuffer([block_N, dim], dtype),
                          acc_s_cast: T.FragmentBuffer([block_M, block_N], dtype),
                          acc_o: T.FragmentBuffer([block_M, dim], accum_dtype),
                          scores_scale: T.FragmentBuffer([block_M], accum_dtype),
                          k: T.int32, by: T.int32, bz: T.int32):
        for i, j in T.Parallel(block_M, dim):
            acc_o[i, j] *= scores_scale[i]  # what was summed so far, rescaled to the new row maxima
        T.copy(V[bz, k * block_N:(k + 1) * block_N, by, :], V_shared)
        T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

    @T.prim_func
    def main(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
             Output: T.Tensor(shape, dtype)):
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

            T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))
            blocks = (T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N)) if is_causal
                      else T.ceildiv(seq_len, block_N))
            for k in T.Pipelined(blocks, num_stages=num_stages):
                scores_of_block(K, Q_shared, K_shared, acc_s, k, bx, by, bz)
                online_softmax(acc_s, acc_s_cast, scores_max, scores_max_prev, scores_scale, scores_sum, logsum)
                accumulate_values(V, V_shared, acc_s_cast, acc_o, scores_scale, k, by, bz)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, bx * block_M:(bx + 1) * block_M, by, :])

    return main


def reference(q, k, v, is_causal):
    import torch

    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / q.size(-1) ** 0.5
    if is_causal:
        seq_len = q.size(1)
        keep = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device))
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v.float()).to(q.dtype)


def main(batch=1, heads=8, seq_len=1024, dim=64, is_causal=False):
    kernel = flashattn(batch, heads, seq_len, dim, is_causal)

    def check():
        import torch

        torch.manual_seed(0)
        q, k, v = (torch.randn(batch, seq_len, heads, dim, device="cuda", dtype=torch.float16) for _ in range(3))
        out = kernel(q, k, v)
        torch.testing.assert_close(out, reference(q, k, v, is_causal), rtol=1e-2, atol=1e-2)
        return {"attention": out}

    finish("attention", {"attention": kernel}, check)


if __name__ == "__main__":
    main()
