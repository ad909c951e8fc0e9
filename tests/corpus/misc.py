"""Miscellaneous operator kernels for the differential corpus: reductions, softmax, norms, quantization,
top-k / argmax, atomics, scalar register variables, dynamic shapes, macros, hand-written layouts, the
two `@tilelang.jit` styles and an autotuned GEMM.

Written the way TileLang's own examples and tests write them (examples/norm, examples/cast,
examples/topk, examples/online_softmax, examples/elementwise, examples/dynamic_shape,
testing/python/language); nothing here knows about kcache. Importing this module compiles nothing:
each `build` does its work when called. Sizes are small so that compiles stay short.
"""

import tilelang
import tilelang.language as T

from tests.corpus import CorpusKernel

LOG2E = 1.44269504  # log2(e): exp(x) == exp2(x * LOG2E)


def _torch():
    import torch

    return torch


# --------------------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------------------


def row_sum_max(M, N, blk_m, dtype="float32"):
    """Row sum and row max of a (M, N) matrix; the tile's fragment layout is written by hand (one warp a
    row, `N // 32` elements a thread)."""
    threads = blk_m * 32

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), RowSum: T.Tensor((M,), dtype), RowMax: T.Tensor((M,), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=threads) as bx:
            A_shared = T.alloc_shared((blk_m, N), dtype)
            A_local = T.alloc_fragment((blk_m, N), dtype)
            sums = T.alloc_fragment((blk_m,), dtype)
            maxs = T.alloc_fragment((blk_m,), dtype)

            T.annotate_layout({
                A_local: T.Fragment(A_local.shape, forward_fn=lambda i, j: (i * 32 + j % 32, j // 32)),
            })

            T.copy(A[bx * blk_m, 0], A_shared)
            T.copy(A_shared, A_local)
            T.reduce_sum(A_local, sums, dim=1)
            T.reduce_max(A_local, maxs, dim=1)
            T.copy(sums, RowSum[bx * blk_m])
            T.copy(maxs, RowMax[bx * blk_m])

    return main


def _check_row_sum_max(kernel):
    torch = _torch()
    torch.manual_seed(0)
    a = torch.randn(256, 128, device="cuda", dtype=torch.float32)
    s, m = kernel(a)
    torch.testing.assert_close(s, a.sum(dim=1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(m, a.amax(dim=1), rtol=0, atol=0)


def col_sum_max(M, N, block_M, block_N, num_stages=2, dtype="float16"):
    """Column sum and column max of a half-precision matrix, fp32 accumulation, row tiles streamed
    through shared memory by a software pipeline."""
    accum_dtype = "float32"

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), ColSum: T.Tensor((N,), accum_dtype), ColMax: T.Tensor((N,), accum_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), threads=128) as bx:
            A_shared = T.alloc_shared((block_M, block_N), dtype)
            A_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            part_sum = T.alloc_fragment((block_N,), accum_dtype)
            part_max = T.alloc_fragment((block_N,), accum_dtype)
            acc_sum = T.alloc_fragment((block_N,), accum_dtype)
            acc_max = T.alloc_fragment((block_N,), accum_dtype)

            T.fill(acc_sum, 0)
            T.fill(acc_max, -T.infinity(accum_dtype))
            for k in T.Pipelined(T.ceildiv(M, block_M), num_stages=num_stages):
                T.copy(A[k * block_M, bx * block_N], A_shared)
                for i, j in T.Parallel(block_M, block_N):
                    A_local[i, j] = T.Cast(accum_dtype, A_shared[i, j])
                T.reduce_sum(A_local, part_sum, dim=0)
                T.reduce_max(A_local, part_max, dim=0)
                for j in T.Parallel(block_N):
                    acc_sum[j] += part_sum[j]
                    acc_max[j] = T.max(acc_max[j], part_max[j])
            T.copy(acc_sum, ColSum[bx * block_N])
            T.copy(acc_max, ColMax[bx * block_N])

    return main


def _check_col_sum_max(kernel):
    torch = _torch()
    torch.manual_seed(0)
    a = torch.randn(512, 256, device="cuda", dtype=torch.float16)
    s, m = kernel(a)
    torch.testing.assert_close(s, a.float().sum(dim=0), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(m, a.float().amax(dim=0), rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------
# Softmax and norms
# --------------------------------------------------------------------------------------------------


def online_softmax(M, N, BN, dtype="float16"):
    """Row softmax in two passes over column blocks (online log-sum-exp, base-2 exponentials), as in
    examples/online_softmax."""
    NN = tilelang.cdiv(N, BN)
    accum_dtype = "float32"
    scale = LOG2E

    @T.prim_func
    def main(X: T.Tensor([M, N], dtype), Y: T.Tensor([M, N], dtype)):
        with T.Kernel(M, threads=128) as i_m:
            x = T.alloc_fragment([BN], dtype)
            y = T.alloc_fragment([BN], dtype)
            lse = T.alloc_fragment([1], accum_dtype)
            max_x = T.alloc_fragment([1], dtype)
            exp_x = T.alloc_fragment([BN], accum_dtype)
            sum_exp_x = T.alloc_fragment([1], accum_dtype)
            T.fill(lse, -T.infinity(accum_dtype))

            for i_n in T.Pipelined(0, NN):
                T.copy(X[i_m, i_n * BN:(i_n + 1) * BN], x)
                T.reduce_max(x, max_x, dim=0, clear=True)
                for j in T.Parallel(BN):
                    exp_x[j] = T.if_then_else(j + i_n * BN < N, T.exp2(x[j] * scale - max_x[0] * scale), 0)
                T.reduce_sum(exp_x, sum_exp_x, dim=0, clear=True)
                lse[0] = max_x[0] * scale + T.log2(T.exp2(lse[0] - max_x[0] * scale) + sum_exp_x[0])

            for i_n in T.Pipelined(0, NN):
                T.copy(X[i_m, i_n * BN:(i_n + 1) * BN], x)
                for j in T.Parallel(BN):
                    if j + i_n * BN < N:
                        y[j] = T.exp2(x[j] * scale - lse[0])
                T.copy(y, Y[i_m, i_n * BN:(i_n + 1) * BN])

    return main


def _check_online_softmax(kernel):
    torch = _torch()
    torch.manual_seed(0)
    x = torch.randn(64, 1024, device="cuda", dtype=torch.float16)
    y = kernel(x)
    torch.testing.assert_close(y, x.float().softmax(dim=1).half(), rtol=1e-2, atol=1e-2)


def fused_add_rms_norm(M, N, blk_m, eps=1e-6, dtype="bfloat16"):
    """Residual add then RMSNorm with a weight (bf16 in and out, fp32 math); the two stages are
    `T.macro` helpers expanded into the kernel."""
    accum_dtype = "float32"

    @T.macro
    def add_residual(x_shared, r_shared, h_local):
        for i, j in T.Parallel(blk_m, N):
            h_local[i, j] = T.Cast(accum_dtype, x_shared[i, j]) + T.Cast(accum_dtype, r_shared[i, j])

    @T.macro
    def inv_rms(h_local, sq_local, rstd):
        for i, j in T.Parallel(blk_m, N):
            sq_local[i, j] = h_local[i, j] * h_local[i, j]
        T.reduce_sum(sq_local, rstd, dim=1)
        for i in T.Parallel(blk_m):
            rstd[i] = T.rsqrt(rstd[i] / N + eps)

    @T.prim_func
    def main(
        X: T.Tensor((M, N), dtype),
        Residual: T.Tensor((M, N), dtype),
        W: T.Tensor((N,), dtype),
        Y: T.Tensor((M, N), dtype),
        ResidualOut: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            x_shared = T.alloc_shared((blk_m, N), dtype)
            r_shared = T.alloc_shared((blk_m, N), dtype)
            w_shared = T.alloc_shared((N,), dtype)
            h_local = T.alloc_fragment((blk_m, N), accum_dtype)
            sq_local = T.alloc_fragment((blk_m, N), accum_dtype)
            rstd = T.alloc_fragment((blk_m,), accum_dtype)

            T.copy(X[bx * blk_m, 0], x_shared)
            T.copy(Residual[bx * blk_m, 0], r_shared)
            T.copy(W, w_shared)
            add_residual(x_shared, r_shared, h_local)
            inv_rms(h_local, sq_local, rstd)
            for i, j in T.Parallel(blk_m, N):
                r_shared[i, j] = T.Cast(dtype, h_local[i, j])
                x_shared[i, j] = T.Cast(dtype, h_local[i, j] * rstd[i] * T.Cast(accum_dtype, w_shared[j]))
            T.copy(x_shared, Y[bx * blk_m, 0])
            T.copy(r_shared, ResidualOut[bx * blk_m, 0])

    return main


def _ref_fused_add_rms_norm(x, r, w, eps=1e-6):
    torch = _torch()
    h = x.float() + r.float()
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    return y.to(x.dtype), h.to(x.dtype)


def _check_fused_add_rms_norm(kernel):
    torch = _torch()
    torch.manual_seed(0)
    x = torch.randn(128, 512, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(128, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    y, r_out = kernel(x, r, w)
    y_ref, r_ref = _ref_fused_add_rms_norm(x, r, w)
    torch.testing.assert_close(r_out, r_ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(y, y_ref, rtol=2e-2, atol=2e-2)


def layernorm_fwd(N, D, eps=1e-5, blk_m=4, threads=128, in_dtype="float16", out_dtype="float16"):
    """LayerNorm forward with gamma and beta, saving mean and rstd (examples/norm/layernorm.py)."""
    accum_dtype = "float32"

    @T.prim_func
    def main(
        X: T.Tensor((N, D), in_dtype),
        gamma: T.Tensor((D,), in_dtype),
        beta: T.Tensor((D,), in_dtype),
        Y: T.Tensor((N, D), out_dtype),
        Mean: T.Tensor((N,), accum_dtype),
        Rstd: T.Tensor((N,), accum_dtype),
    ):
        with T.Kernel(T.ceildiv(N, blk_m), threads=threads) as bx:
            X_smem = T.alloc_shared((blk_m, D), in_dtype)
            G_smem = T.alloc_shared((D,), in_dtype)
            B_smem = T.alloc_shared((D,), in_dtype)
            X_local = T.alloc_fragment((blk_m, D), accum_dtype)
            X_sq_local = T.alloc_fragment((blk_m, D), accum_dtype)
            sum_row = T.alloc_fragment((blk_m,), accum_dtype)
            sumsq_row = T.alloc_fragment((blk_m,), accum_dtype)
            mean_row = T.alloc_fragment((blk_m,), accum_dtype)
            rstd_row = T.alloc_fragment((blk_m,), accum_dtype)

            T.copy(X[bx * blk_m, 0], X_smem)
            T.copy(gamma, G_smem)
            T.copy(beta, B_smem)
            for i, j in T.Parallel(blk_m, D):
                X_local[i, j] = T.Cast(accum_dtype, X_smem[i, j])
            for i, j in T.Parallel(blk_m, D):
                X_sq_local[i, j] = X_local[i, j] * X_local[i, j]
            T.reduce_sum(X_local, sum_row, dim=1)
            T.reduce_sum(X_sq_local, sumsq_row, dim=1)

            inv_D = T.float32(1.0) / T.Cast(accum_dtype, D)
            for i in T.Parallel(blk_m):
                mean_row[i] = sum_row[i] * inv_D
                rstd_row[i] = T.rsqrt(sumsq_row[i] * inv_D - mean_row[i] * mean_row[i] + T.Cast(accum_dtype, eps))
                Mean[bx * blk_m + i] = mean_row[i]
                Rstd[bx * blk_m + i] = rstd_row[i]
            for i, j in T.Parallel(blk_m, D):
                norm = (X_local[i, j] - mean_row[i]) * rstd_row[i]
                X_smem[i, j] = T.Cast(out_dtype, norm * T.Cast(accum_dtype, G_smem[j]) + T.Cast(accum_dtype, B_smem[j]))
            T.copy(X_smem, Y[bx * blk_m, 0])

    return main


def _check_layernorm_fwd(kernel):
    torch = _torch()
    torch.manual_seed(0)
    x = torch.randn(256, 512, device="cuda", dtype=torch.float16)
    g = torch.randn(512, device="cuda", dtype=torch.float16)
    b = torch.randn(512, device="cuda", dtype=torch.float16)
    y, mean, rstd = kernel(x, g, b)
    xf = x.float()
    torch.testing.assert_close(mean, xf.mean(dim=1), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(rstd, torch.rsqrt(xf.var(dim=1, unbiased=False) + 1e-5), rtol=1e-3, atol=1e-3)
    y_ref = torch.nn.functional.layer_norm(xf, (512,), g.float(), b.float(), eps=1e-5).half()
    torch.testing.assert_close(y, y_ref, rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------------------------------
# Quantization
# --------------------------------------------------------------------------------------------------


def per_token_cast_to_fp8(M, N, blk_m, group_size=128):
    """Per-token, per-128-group cast to fp8 e4m3 with one fp32 scale per group (examples/cast); the
    input tile's fragment layout is annotated by hand."""
    dtype = "float32"
    fp8_min = -448.0
    fp8_max = 448.0

    @T.prim_func
    def per_token_cast(
        X: T.Tensor((M, N), dtype),
        X_fp8: T.Tensor((M, N), "float8_e4m3"),
        X_amax: T.Tensor((M, T.ceildiv(N, group_size)), dtype),
    ):
        with T.Kernel(T.ceildiv(M, blk_m), T.ceildiv(N, group_size), threads=128) as (bx, by):
            row = bx
            row_g_id = by
            y_local = T.alloc_fragment((blk_m, group_size), dtype)
            y_amax_local = T.alloc_fragment((blk_m,), dtype)
            y_s_local = T.alloc_fragment((blk_m,), dtype)
            y_q_local = T.alloc_fragment((blk_m, group_size), dtype)
            y_q_local_fp8 = T.alloc_fragment((blk_m, group_size), "float8_e4m3")

            T.annotate_layout({
                y_local: T.Fragment(y_local.shape, forward_thread_fn=lambda i, j: (i // (blk_m // 4)) * 32 + j % 32),
            })

            T.copy(X[row * blk_m:(row + 1) * blk_m, row_g_id * group_size:(row_g_id + 1) * group_size], y_local)
            T.reduce_absmax(y_local, y_amax_local, dim=1)
            for i in T.Parallel(blk_m):
                y_amax_local[i] = T.max(y_amax_local[i], 1e-4)
                y_s_local[i] = y_amax_local[i] / fp8_max
            for i, j in T.Parallel(blk_m, group_size):
                y_q_local[i, j] = T.clamp(y_local[i, j] / y_s_local[i], fp8_min, fp8_max)
            T.copy(y_q_local, y_q_local_fp8)
            for i in T.Parallel(blk_m):
                X_amax[row * blk_m + i, row_g_id] = y_s_local[i]
            T.copy(
                y_q_local_fp8,
                X_fp8[row * blk_m:(row + 1) * blk_m, row_g_id * group_size:(row_g_id + 1) * group_size],
            )

    return per_token_cast


def _ref_per_token_cast_to_fp8(x):
    torch = _torch()
    m, n = x.shape
    x_view = x.view(m, -1, 128)
    x_amax = x_view.abs().float().amax(dim=2).view(m, -1).clamp(1e-4)
    x_fp8 = (x_view * (448.0 / x_amax.unsqueeze(2))).to(torch.float8_e4m3fn)
    return x_fp8.view(m, n), (x_amax / 448.0).view(m, -1)


def _check_per_token_cast_to_fp8(kernel):
    torch = _torch()
    torch.manual_seed(0)
    x = torch.randn(128, 512, device="cuda", dtype=torch.float32)
    x_fp8, x_scale = kernel(x)
    fp8_ref, scale_ref = _ref_per_token_cast_to_fp8(x)
    torch.testing.assert_close(x_scale, scale_ref, rtol=1e-5, atol=1e-6)
    # Dividing by the scale and multiplying by its reciprocal may round across an fp8 step.
    torch.testing.assert_close(x_fp8.float(), fp8_ref.float(), rtol=0.13, atol=0.02)


def per_token_quant_int8(M, N, blk_m, dtype="float16"):
    """Symmetric per-token int8 quantization: one fp32 scale per row, q = round(x / scale)."""
    accum_dtype = "float32"

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), XQ: T.Tensor((M, N), "int8"), Scale: T.Tensor((M,), accum_dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            x_local = T.alloc_fragment((blk_m, N), accum_dtype)
            scale = T.alloc_fragment((blk_m,), accum_dtype)
            q_local = T.alloc_fragment((blk_m, N), "int8")

            T.copy(X[bx * blk_m, 0], x_local)
            T.reduce_absmax(x_local, scale, dim=1)
            for i in T.Parallel(blk_m):
                scale[i] = T.max(scale[i], 1e-8) / 127.0
            for i, j in T.Parallel(blk_m, N):
                q_local[i, j] = T.Cast("int8", T.min(T.max(T.round(x_local[i, j] / scale[i]), -127.0), 127.0))
            T.copy(q_local, XQ[bx * blk_m, 0])
            T.copy(scale, Scale[bx * blk_m])

    return main


def _check_per_token_quant_int8(kernel):
    torch = _torch()
    torch.manual_seed(0)
    x = torch.randn(256, 512, device="cuda", dtype=torch.float16)
    q, s = kernel(x)
    s_ref = x.float().abs().amax(dim=1).clamp(min=1e-8) / 127.0
    torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-7)
    q_ref = torch.round(x.float() / s_ref[:, None]).clamp(-127, 127)
    # Ties may round either way: allow one step.
    torch.testing.assert_close(q.float(), q_ref, rtol=0, atol=1.0)


def dequant_int8_vectorized(M, N, vec=8, threads=128, out_dtype="float16"):
    """Per-token int8 dequantization, one thread per `vec` contiguous elements, staged through
    per-thread registers with vectorized loads and stores."""
    elems_per_block = threads * vec

    @T.prim_func
    def main(XQ: T.Tensor((M, N), "int8"), Scale: T.Tensor((M,), "float32"), Y: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(M * N, elems_per_block), threads=threads) as bx:
            tx = T.get_thread_binding()
            q_local = T.alloc_local((vec,), "int8")
            y_local = T.alloc_local((vec,), out_dtype)
            base = (bx * threads + tx) * vec
            row = base // N
            col = base % N
            for v in T.vectorized(vec):
                q_local[v] = XQ[row, col + v]
            for v in T.unroll(vec):
                y_local[v] = T.Cast(out_dtype, T.Cast("float32", q_local[v]) * Scale[row])
            for v in T.vectorized(vec):
                Y[row, col + v] = y_local[v]

    return main


def _check_dequant_int8_vectorized(kernel):
    torch = _torch()
    torch.manual_seed(0)
    q = torch.randint(-127, 128, (256, 512), device="cuda", dtype=torch.int8)
    s = torch.rand(256, device="cuda", dtype=torch.float32) * 0.05
    y = kernel(q, s)
    torch.testing.assert_close(y, (q.float() * s[:, None]).half(), rtol=1e-3, atol=1e-3)


# --------------------------------------------------------------------------------------------------
# Top-k and argmax
# --------------------------------------------------------------------------------------------------


def topk_gating(M, N, topk, blk_m, threads=128):
    """Top-k of each row by repeated arg-max over a fragment (examples/topk, MoE gating)."""
    dtype = "float32"

    @T.prim_func
    def topk_kernel(
        logits: T.Tensor([M, N], dtype),
        topk_gates: T.Tensor([M, topk], dtype),
        topk_indices: T.Tensor([M, topk], "int32"),
    ):
        with T.Kernel(T.ceildiv(M, blk_m), threads=threads) as bx:
            logits_frag = T.alloc_fragment([blk_m, N], dtype=dtype)
            max_val = T.alloc_fragment([blk_m], dtype=dtype)
            expand_max_idx = T.alloc_fragment([blk_m, N], "int32")
            max_idx = T.alloc_fragment([blk_m], "int32")

            T.copy(logits[bx * blk_m, 0], logits_frag)
            for k in T.serial(topk):
                T.fill(expand_max_idx, -1)
                T.reduce_max(logits_frag, max_val, dim=1, clear=True)
                for i, j in T.Parallel(blk_m, N):
                    expand_max_idx[i, j] = T.if_then_else(max_val[i] == logits_frag[i, j], j, expand_max_idx[i, j])
                T.reduce_max(expand_max_idx, max_idx, dim=1, clear=True)
                for i, j in T.Parallel(blk_m, N):
                    logits_frag[i, j] = T.if_then_else(max_val[i] == logits_frag[i, j], -10000.0, logits_frag[i, j])
                for i in T.Parallel(blk_m):
                    topk_gates[bx * blk_m + i, k] = max_val[i]
                    topk_indices[bx * blk_m + i, k] = max_idx[i]

    return topk_kernel


def _check_topk_gating(kernel):
    torch = _torch()
    torch.manual_seed(0)
    logits = torch.rand(320, 128, device="cuda", dtype=torch.float32)
    gates, indices = kernel(logits)
    ref_gates, ref_indices = logits.topk(6, dim=1)
    torch.testing.assert_close(gates, ref_gates)
    torch.testing.assert_close(indices, ref_indices.to(torch.int32))


def argmax_count_rows(M, N, block_M=128, dtype="float32"):
    """One thread a row: a serial scan keeping the running maximum, its index and a count of positive
    entries in scalar register variables (`T.alloc_var`)."""

    @T.prim_func
    def main(
        X: T.Tensor((M, N), dtype),
        ArgMax: T.Tensor((M,), "int32"),
        MaxVal: T.Tensor((M,), dtype),
        NumPos: T.Tensor((M,), "int32"),
    ):
        with T.Kernel(T.ceildiv(M, block_M), threads=block_M) as bx:
            tx = T.get_thread_binding()
            best = T.alloc_var(dtype, -T.infinity(dtype))
            best_idx = T.alloc_var("int32", 0)
            count = T.alloc_var("int32", 0)
            row = bx * block_M + tx
            if row < M:
                for j in T.serial(N):
                    v = X[row, j]
                    if v > best:
                        best = v
                        best_idx = j
                    if v > 0:
                        count += 1
                ArgMax[row] = best_idx
                MaxVal[row] = best
                NumPos[row] = count

    return main


def _check_argmax_count_rows(kernel):
    torch = _torch()
    torch.manual_seed(0)
    x = torch.randn(300, 96, device="cuda", dtype=torch.float32)
    idx, val, npos = kernel(x)
    torch.testing.assert_close(idx, x.argmax(dim=1).to(torch.int32))
    torch.testing.assert_close(val, x.amax(dim=1))
    torch.testing.assert_close(npos, (x > 0).sum(dim=1).to(torch.int32))


# --------------------------------------------------------------------------------------------------
# Atomics
# --------------------------------------------------------------------------------------------------


def histogram(N, num_bins, block=256):
    """Histogram of bin ids: privatized in shared memory with `T.atomic_add`, then added into the global
    histogram (which the caller zeroes) with `T.atomic_add`."""

    @T.prim_func
    def main(X: T.Tensor((N,), "int32"), Hist: T.Tensor((num_bins,), "int32")):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            hist_s = T.alloc_shared((num_bins,), "int32")
            T.clear(hist_s)
            for i in T.Parallel(block):
                if bx * block + i < N:
                    T.atomic_add(hist_s[X[bx * block + i]], 1)
            for b in T.Parallel(num_bins):
                T.atomic_add(Hist[b], hist_s[b])

    return main


def _check_histogram(kernel):
    torch = _torch()
    torch.manual_seed(0)
    x = torch.randint(0, 64, (10000,), device="cuda", dtype=torch.int32)
    hist = torch.zeros(64, device="cuda", dtype=torch.int32)
    kernel(x, hist)
    torch.testing.assert_close(hist, torch.bincount(x, minlength=64).to(torch.int32))


def moe_combine(num_pairs, num_tokens, H, block_H=128, dtype="bfloat16"):
    """MoE combine: each (token, expert) pair's expert output, weighted by its gate, is scatter-added
    into its token's fp32 row with `T.atomic_add` (the caller zeroes `Out`)."""

    @T.prim_func
    def main(
        ExpertOut: T.Tensor((num_pairs, H), dtype),
        Weight: T.Tensor((num_pairs,), "float32"),
        TokenIdx: T.Tensor((num_pairs,), "int32"),
        Out: T.Tensor((num_tokens, H), "float32"),
    ):
        with T.Kernel(num_pairs, T.ceildiv(H, block_H), threads=128) as (p, bh):
            eo_shared = T.alloc_shared((block_H,), dtype)
            tok = TokenIdx[p]
            w = Weight[p]
            T.copy(ExpertOut[p, bh * block_H], eo_shared)
            for j in T.Parallel(block_H):
                T.atomic_add(Out[tok, bh * block_H + j], w * T.Cast("float32", eo_shared[j]))

    return main


def _check_moe_combine(kernel):
    torch = _torch()
    torch.manual_seed(0)
    num_tokens, topk, H = 64, 4, 512
    expert_out = torch.randn(num_tokens * topk, H, device="cuda", dtype=torch.bfloat16)
    weight = torch.rand(num_tokens * topk, device="cuda", dtype=torch.float32)
    token_idx = torch.arange(num_tokens, device="cuda", dtype=torch.int32).repeat_interleave(topk)
    token_idx = token_idx[torch.randperm(num_tokens * topk, device="cuda")]
    out = torch.zeros(num_tokens, H, device="cuda", dtype=torch.float32)
    kernel(expert_out, weight, token_idx, out)
    ref = torch.zeros_like(out).index_add_(0, token_idx.long(), weight[:, None] * expert_out.float())
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def global_absmax(M, N, blk_m):
    """Tensor-wide absolute maximum (a per-tensor quantization scale's input): a row reduction in each
    block, then `T.atomic_max` into one fp32 (the caller zeroes it)."""
    dtype = "float32"

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), AbsMax: T.Tensor((1,), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            x_local = T.alloc_fragment((blk_m, N), dtype)
            row_amax = T.alloc_fragment((blk_m,), dtype)
            T.copy(X[bx * blk_m, 0], x_local)
            T.reduce_absmax(x_local, row_amax, dim=1)
            for i in T.Parallel(blk_m):
                T.atomic_max(AbsMax[0], row_amax[i])

    return main


def _check_global_absmax(kernel):
    torch = _torch()
    torch.manual_seed(0)
    x = torch.randn(512, 256, device="cuda", dtype=torch.float32)
    amax = torch.zeros(1, device="cuda", dtype=torch.float32)
    kernel(x, amax)
    torch.testing.assert_close(amax, x.abs().amax().reshape(1), rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------
# Dynamic shapes and hand-written shared-memory layouts
# --------------------------------------------------------------------------------------------------


def silu_and_mul_dynamic(N, block_M=16, dtype="float16"):
    """SwiGLU activation `silu(x[:, :N]) * x[:, N:]` over a dynamic number of tokens: compiled once,
    launched for any `m`."""
    M = T.dynamic("m")
    accum_dtype = "float32"

    @T.prim_func
    def main(X: T.Tensor((M, 2 * N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            gate = T.alloc_shared((block_M, N), dtype)
            up = T.alloc_shared((block_M, N), dtype)
            out = T.alloc_fragment((block_M, N), dtype)
            T.copy(X[bx * block_M, 0], gate)
            T.copy(X[bx * block_M, N], up)
            for i, j in T.Parallel(block_M, N):
                g = T.Cast(accum_dtype, gate[i, j])
                out[i, j] = T.Cast(dtype, g / (1.0 + T.exp2(-g * LOG2E)) * T.Cast(accum_dtype, up[i, j]))
            T.copy(out, Y[bx * block_M, 0])

    return main


def _check_silu_and_mul_dynamic(kernel):
    torch = _torch()
    torch.manual_seed(0)
    for m in (37, 300):  # one kernel, two sizes (neither a multiple of block_M)
        x = torch.randn(m, 2 * 256, device="cuda", dtype=torch.float16)
        y = kernel(x)
        gate, up = x.float().chunk(2, dim=1)
        torch.testing.assert_close(y, (torch.nn.functional.silu(gate) * up).half(), rtol=1e-2, atol=1e-2)


def transpose_skewed_smem(M, N, block=32, dtype="float16"):
    """Tiled transpose whose shared tile uses a hand-written skewed layout (row i rotated by i), so that
    the column-wise reads of the transpose fall on different banks."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((N, M), dtype)):
        with T.Kernel(T.ceildiv(N, block), T.ceildiv(M, block), threads=128) as (bx, by):
            tile = T.alloc_shared((block, block), dtype)
            T.annotate_layout({tile: T.Layout((block, block), lambda i, j: (i, (j + i) % block))})
            T.copy(X[by * block, bx * block], tile)
            for i, j in T.Parallel(block, block):
                Y[bx * block + i, by * block + j] = tile[j, i]

    return main


def _check_transpose_skewed_smem(kernel):
    torch = _torch()
    torch.manual_seed(0)
    x = torch.randn(256, 192, device="cuda", dtype=torch.float16)
    y = kernel(x)
    torch.testing.assert_close(y, x.t().contiguous(), rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------
# @tilelang.jit: a lazy factory and an eager kernel
# --------------------------------------------------------------------------------------------------


@tilelang.jit(out_idx=[-1], pass_configs={"tl.disable_tma_lower": True})
def rms_norm_jit(M, N, blk_m, eps=1e-6):
    """Lazy `@tilelang.jit`: the call takes sizes and returns the compiled kernel (examples/norm)."""
    dtype = "float"

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            A_shared = T.alloc_shared((blk_m, N), dtype)
            A_pow_local = T.alloc_fragment((blk_m, N), dtype)
            A_local = T.alloc_fragment((blk_m, N), dtype)
            A_powsum = T.alloc_fragment((blk_m,), dtype)

            T.copy(A[bx * blk_m:(bx + 1) * blk_m, :], A_shared)
            T.copy(A_shared, A_local)
            for i, j in T.Parallel(blk_m, N):
                A_pow_local[i, j] = A_local[i, j] * A_local[i, j]
            T.reduce_sum(A_pow_local, A_powsum, dim=1)
            for i in T.Parallel(blk_m):
                A_powsum[i] = T.rsqrt(A_powsum[i] / N + eps)
            for i, j in T.Parallel(blk_m, N):
                A_local[i, j] *= A_powsum[i]
            T.copy(A_local, B[bx * blk_m:(bx + 1) * blk_m, :])

    return main


def _build_rms_norm_jit():
    return rms_norm_jit(256, 1024, 2)


def _check_rms_norm_jit(kernel):
    torch = _torch()
    torch.manual_seed(0)
    x = torch.randn(256, 1024, device="cuda", dtype=torch.float32)
    y = kernel(x)
    torch.testing.assert_close(y, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), rtol=1e-4, atol=1e-4)


@tilelang.jit
def bias_gelu_eager(X, Bias, block_M: int = 32, block_N: int = 128):
    """Eager `@tilelang.jit`: shapes come from the tensors' annotations; the output is declared with
    `T.empty` and returned. tanh-approximated GELU after a bias add, fp16 in and out."""
    M, N = T.const("M N")
    X: T.Tensor[[M, N], T.float16]
    Bias: T.Tensor[[N], T.float16]
    Y = T.empty((M, N), T.float16)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
        x_shared = T.alloc_shared((block_M, block_N), T.float16)
        b_shared = T.alloc_shared((block_N,), T.float16)
        y_local = T.alloc_fragment((block_M, block_N), T.float16)
        T.copy(X[by * block_M, bx * block_N], x_shared)
        T.copy(Bias[bx * block_N], b_shared)
        for i, j in T.Parallel(block_M, block_N):
            h = T.Cast(T.float32, x_shared[i, j]) + T.Cast(T.float32, b_shared[j])
            y_local[i, j] = T.Cast(T.float16, 0.5 * h * (1.0 + T.tanh(0.7978845608 * (h + 0.044715 * h * h * h))))
        T.copy(y_local, Y[by * block_M, bx * block_N])
    return Y


def _build_bias_gelu_eager():
    torch = _torch()
    # What a call with these tensors builds (a call on CUDA tensors would also launch it).
    x = torch.empty(128, 512, dtype=torch.float16)
    bias = torch.empty(512, dtype=torch.float16)
    return bias_gelu_eager.compile(x, bias)


def _check_bias_gelu_eager(kernel):
    torch = _torch()
    torch.manual_seed(0)
    x = torch.randn(128, 512, device="cuda", dtype=torch.float16)
    bias = torch.randn(512, device="cuda", dtype=torch.float16)
    y = kernel(x, bias)
    y_ref = torch.nn.functional.gelu(x.float() + bias.float(), approximate="tanh").half()
    torch.testing.assert_close(y, y_ref, rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------------------------------
# Autotuned GEMM (benchmarking needs a GPU); each config also as its own prim_func entry
# --------------------------------------------------------------------------------------------------

GEMM_CONFIGS = [
    {"block_M": 64, "block_N": 64, "block_K": 32, "num_stages": 2},
    {"block_M": 128, "block_N": 64, "block_K": 64, "num_stages": 3},
]
GEMM_SIZE = 256


def matmul(M, N, K, block_M=128, block_N=128, block_K=32, num_stages=2, dtype="float16", accum_dtype="float"):
    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return gemm


# The same factory under `@tilelang.autotune` + `@tilelang.jit(out_idx=...)`.
matmul_autotuned = tilelang.autotune(configs=GEMM_CONFIGS, warmup=3, rep=10)(tilelang.jit(out_idx=[-1])(matmul))


def _build_matmul_autotuned():
    return matmul_autotuned(GEMM_SIZE, GEMM_SIZE, GEMM_SIZE)


def _check_matmul(kernel):
    torch = _torch()
    torch.manual_seed(0)
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.float16)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.float16)
    c = kernel(a, b)
    torch.testing.assert_close(c, (a.float() @ b.float()).half(), rtol=1e-2, atol=1e-2)


def _gemm_config_entry(i, config):
    return CorpusKernel(
        name=f"gemm_tune_config{i}",
        build=lambda: matmul(GEMM_SIZE, GEMM_SIZE, GEMM_SIZE, **config),
        gpu_check=_check_matmul,
        out_idx=[-1],
        features=("gemm", "pipelined", "autotune_config"),
    )


# --------------------------------------------------------------------------------------------------

# Each compiles in about 1.5 to 4.5 s for sm_90a (nvcc included) on a 2-core machine.
KERNELS: list[CorpusKernel] = [
    CorpusKernel(
        name="row_sum_max",
        build=lambda: row_sum_max(256, 128, 4),
        gpu_check=_check_row_sum_max,
        out_idx=[1, 2],
        features=("reduce", "reduce_row", "custom_layout", "fragment"),
    ),
    CorpusKernel(
        name="col_sum_max_pipelined",
        build=lambda: col_sum_max(512, 256, 64, 64),
        gpu_check=_check_col_sum_max,
        out_idx=[1, 2],
        features=("reduce", "reduce_col", "pipelined", "fp16"),
    ),
    CorpusKernel(
        name="online_softmax",
        build=lambda: online_softmax(64, 1024, 256),
        gpu_check=_check_online_softmax,
        out_idx=[1],
        features=("softmax", "reduce", "pipelined", "exp2", "if_then_else", "fp16"),
    ),
    CorpusKernel(
        name="fused_add_rms_norm_bf16",
        build=lambda: fused_add_rms_norm(128, 512, 2),
        gpu_check=_check_fused_add_rms_norm,
        out_idx=[-2, -1],
        features=("rmsnorm", "reduce", "macro", "rsqrt", "bf16"),
    ),
    CorpusKernel(
        name="layernorm_fwd_fp16",
        build=lambda: layernorm_fwd(256, 512),
        gpu_check=_check_layernorm_fwd,
        out_idx=[-3, -2, -1],
        features=("layernorm", "reduce", "rsqrt", "fp16"),
    ),
    CorpusKernel(
        name="per_token_cast_to_fp8",
        build=lambda: per_token_cast_to_fp8(128, 512, 8),
        gpu_check=_check_per_token_cast_to_fp8,
        out_idx=[1, 2],
        features=("quant", "fp8", "reduce", "custom_layout", "fragment", "clamp"),
    ),
    CorpusKernel(
        name="per_token_quant_int8",
        build=lambda: per_token_quant_int8(256, 512, 4),
        gpu_check=_check_per_token_quant_int8,
        out_idx=[1, 2],
        features=("quant", "int8", "reduce", "min_max"),
    ),
    CorpusKernel(
        name="dequant_int8_vectorized",
        build=lambda: dequant_int8_vectorized(256, 512),
        gpu_check=_check_dequant_int8_vectorized,
        out_idx=[2],
        features=("quant", "int8", "alloc_local", "vectorized", "unroll"),
    ),
    CorpusKernel(
        name="topk_gating",
        build=lambda: topk_gating(320, 128, 6, 64),
        gpu_check=_check_topk_gating,
        out_idx=[1, 2],
        features=("topk", "reduce", "serial", "if_then_else"),
    ),
    CorpusKernel(
        name="argmax_count_rows",
        build=lambda: argmax_count_rows(300, 96),
        gpu_check=_check_argmax_count_rows,
        out_idx=[1, 2, 3],
        features=("argmax", "alloc_var", "serial"),
    ),
    CorpusKernel(
        name="histogram_atomic_add",
        build=lambda: histogram(10000, 64),
        gpu_check=_check_histogram,
        out_idx=None,
        features=("atomics", "atomic_add", "shared"),
    ),
    CorpusKernel(
        name="moe_combine_scatter_add",
        build=lambda: moe_combine(256, 64, 512),
        gpu_check=_check_moe_combine,
        out_idx=None,
        features=("atomics", "atomic_add", "scatter", "bf16"),
    ),
    CorpusKernel(
        name="global_absmax_atomic_max",
        build=lambda: global_absmax(512, 256, 8),
        gpu_check=_check_global_absmax,
        out_idx=None,
        features=("atomics", "atomic_max", "reduce"),
    ),
    CorpusKernel(
        name="silu_and_mul_dynamic_m",
        build=lambda: silu_and_mul_dynamic(256),
        gpu_check=_check_silu_and_mul_dynamic,
        out_idx=[1],
        features=("dynamic_shape", "elementwise", "exp2", "fp16"),
    ),
    CorpusKernel(
        name="transpose_skewed_smem",
        build=lambda: transpose_skewed_smem(256, 192),
        gpu_check=_check_transpose_skewed_smem,
        out_idx=[1],
        features=("custom_layout", "shared_layout", "transpose"),
    ),
    CorpusKernel(
        name="rms_norm_jit_lazy",
        build=_build_rms_norm_jit,
        gpu_check=_check_rms_norm_jit,
        style="jit",
        features=("jit_lazy", "rmsnorm", "reduce", "rsqrt"),
    ),
    CorpusKernel(
        name="bias_gelu_jit_eager",
        build=_build_bias_gelu_eager,
        gpu_check=_check_bias_gelu_eager,
        style="jit",
        features=("jit_eager", "elementwise", "t_empty", "fp16"),
    ),
    CorpusKernel(
        name="gemm_autotuned",
        build=_build_matmul_autotuned,
        gpu_check=_check_matmul,
        style="autotune",
        features=("autotune", "jit_lazy", "gemm", "pipelined"),
    ),
    *[_gemm_config_entry(i, config) for i, config in enumerate(GEMM_CONFIGS)],
]
