"""The corpus's instrument for plain TileLang's machine code (tests/machine_code.py): an autotuned
kernel's binary is the one nvcc made from its own source, not the last config compiled. On the GPU
the tuner's pick varies with the timings; pairing the pick's source with the last config's binary
made a plain TileLang output that no compile gives (the corpus failed on an H100, 2026-11-27 18:37)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.machine_code import binary_of


def _kernel(source: str) -> SimpleNamespace:
    return SimpleNamespace(get_kernel_source=lambda: source)


def test_the_binary_is_the_one_made_from_the_kernel_s_source() -> None:
    captured = [("config A", b"binary A"), ("config B", b"binary B"), ("config C", b"binary C")]
    assert binary_of(captured, _kernel("config B")) == b"binary B"  # the pick, compiled second
    assert binary_of(captured, _kernel("config C")) == b"binary C"


def test_the_latest_binary_of_a_source_compiled_twice_and_the_last_where_none_matches() -> None:
    captured = [("same", b"first"), ("other", b"x"), ("same", b"second")]
    assert binary_of(captured, _kernel("same")) == b"second"
    assert binary_of(captured, _kernel("edited by a callback")) == b"second"  # as before: the last
    assert binary_of([], _kernel("anything")) is None
