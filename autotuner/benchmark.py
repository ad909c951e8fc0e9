"""Measuring a compiled config on the GPU: inputs, the reference check, CUDA-event timing, failures."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from autotuner import trials as t

Profiler = Callable[[Any, Sequence[Any]], float]


def cuda_event_profiler(warmup: int = 25, rep: int = 100) -> Profiler:
    """Median of `rep` runs timed with CUDA events, after `warmup` runs (ms).

    Each timed run follows a write of 256 MiB, as in Triton's do_bench: it evicts the L2 cache, so
    every run starts cold, and it keeps the GPU busy while the host enqueues the run, so the events
    time the kernel and not the host's launch latency (a synchronize per run would time the latter:
    12 us kernels read as 28 us on an H100, and the ranking was noise).
    """

    def measure(kernel: Any, args: Sequence[Any]) -> float:
        import torch

        flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
        for _ in range(warmup):
            kernel(*args)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
        for start, end in zip(starts, ends):
            flush.zero_()
            start.record()
            kernel(*args)
            end.record()
        torch.cuda.synchronize()
        return float(statistics.median(start.elapsed_time(end) for start, end in zip(starts, ends)))

    return measure


def inputs_for(kernel: Any, inputs: Sequence[Any] | None, supply_prog: Callable[..., Any] | None) -> list[Any]:
    if inputs is not None:
        return list(inputs)
    outputs = set(getattr(getattr(kernel, "adapter", None), "result_idx", None) or [])
    params = [p for i, p in enumerate(kernel.params) if i not in outputs]
    if supply_prog is not None:
        return list(supply_prog(params))
    from tilelang.utils.tensor import TensorSupplyType, get_tensor_supply

    supply = get_tensor_supply(TensorSupplyType.Auto)
    return [supply(p) for p in params]


def benchmark(trial: t.Trial, inputs: Any, supply_prog: Any, ref_prog: Any, measure: Profiler,
               rtol: float, atol: float, negative: t.NegativeEntries) -> float | None:
    """The config's latency (ms), or None with the trial's status and message set."""
    for attempt in (1, 2):
        try:
            args = inputs_for(trial.kernel, inputs, supply_prog)
            if ref_prog is not None:
                mismatch = _compare(trial.kernel(*args), ref_prog(*args), rtol, atol)
                if mismatch:
                    trial.status, trial.message = t.WRONG_RESULT, mismatch
                    return None
            return measure(trial.kernel, args)
        except Exception as err:  # a launch can fail in many ways; all of them skip this config
            message = t.launch_failure_message(f"{type(err).__name__}: {err}", _shared_memory_limit())
            trial.status = t.OUT_OF_RESOURCES if t.looks_out_of_resources(message) else t.LAUNCH_ERROR
            trial.message = message
            if trial.status == t.OUT_OF_RESOURCES:
                negative.remember(trial.config, trial.status, message)
                return None
            if attempt == 1:
                _clear_cuda_error()
    return None


def _compare(actual: Any, expected: Any, rtol: float, atol: float) -> str:
    import torch

    actual = actual if isinstance(actual, (list, tuple)) else [actual]
    expected = expected if isinstance(expected, (list, tuple)) else [expected]
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, the reference has {len(expected)}"
    for index, (got, want) in enumerate(zip(actual, expected)):
        try:
            torch.testing.assert_close(got, want.to(got.dtype) if hasattr(want, "to") else want, rtol=rtol, atol=atol)
        except AssertionError as err:
            return f"output {index} differs from ref_prog: {str(err).splitlines()[0]}"
    return ""


def _clear_cuda_error() -> None:
    try:
        import torch

        torch.cuda.synchronize()
    except RuntimeError:
        pass  # a sticky error: the retry reports it


def _shared_memory_limit() -> int | None:
    """The most shared memory a block of the current device may opt in to (bytes)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).shared_memory_per_block_optin)
    except (ImportError, RuntimeError, AttributeError):
        return None
