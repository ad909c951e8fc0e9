"""kcache.triton.shared_fronts: a tune's configs share a front half only where every option it read is
equal (tests/test_triton_fidelity.py compiles real kernels that way, byte for byte against Triton)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from kcache.triton import shared_fronts
from kcache.triton.shared_fronts import ir_text, sharing


@dataclass(frozen=True)
class Options:  # as Triton's CUDAOptions: a frozen dataclass
    num_warps: int = 4
    num_stages: int = 3
    debug: bool = False


class Source:
    def __init__(self, key: str) -> None:
        self.key = key

    def hash(self) -> str:
        return self.key


class Maker:
    """A front half that reads `reads` of its options, counting its calls."""

    def __init__(self, *reads: str, fails: bool = False, whole: bool = False) -> None:
        self.reads, self.fails, self.whole, self.calls = reads, fails, whole, 0

    def __call__(self, options: Options) -> str:
        self.calls += 1
        if self.fails:
            raise ValueError("the kernel's code raised")
        if self.whole:
            return f"ir {sorted(vars(options).items())}"
        return "ir " + " ".join(f"{name}={getattr(options, name)}" for name in self.reads)


def text(maker: Maker, options: Options, source: str = "kernel", env: dict[str, str] | None = None) -> str:
    return ir_text(Source(source), "cuda:90", options, env or {}, maker)


def test_configs_differing_only_in_options_never_read_share_one_front_half() -> None:
    maker = Maker("debug")
    with sharing():
        texts = {text(maker, Options(warps, stages)) for warps in (1, 2, 4, 8) for stages in (3, 4)}
        assert maker.calls == 1 and texts == {"ir debug=False"}
        assert text(maker, Options(debug=True)) == "ir debug=True" and maker.calls == 2  # a read option differs
        assert text(maker, Options(), source="other") and maker.calls == 3  # another kernel or constexprs
        assert text(maker, Options(), env={"TRITON_DEBUG": "1"}) and maker.calls == 4  # another environment


def test_a_front_half_that_reads_an_option_is_made_for_each_value_of_it() -> None:
    maker = Maker("num_warps")  # tl.extra.cuda.num_warps()
    with sharing():
        assert [text(maker, Options(warps)) for warps in (4, 8, 4)] == ["ir num_warps=4", "ir num_warps=8",
                                                                         "ir num_warps=4"]
    assert maker.calls == 2


def test_options_read_whole_are_shared_only_when_equal() -> None:
    maker = Maker(whole=True)
    with sharing():
        text(maker, Options(4))
        text(maker, Options(8))
        text(maker, Options(8))
    assert maker.calls == 2


def test_outside_a_tunes_compile_ahead_every_front_half_is_made_with_the_options_themselves() -> None:
    seen: list[Options] = []
    options = Options()
    for _ in range(2):
        ir_text(Source("kernel"), "cuda:90", options, {}, lambda given: seen.append(given) or "ir")
    assert seen == [options, options] and all(type(given) is Options for given in seen)
    with sharing():
        text(Maker("debug"), options)
        assert shared_fronts._fronts  # held while the sharing lasts
        unkeyed = [ir_text(object(), "cuda:90", options, {}, lambda given: seen.append(given) or "ir")
                   for _ in range(2)]
        assert unkeyed == ["ir", "ir"] and seen[-2:] == [options, options]  # no hash() to key it: made each time
    assert not shared_fronts._fronts  # forgotten when the last sharing ends


def test_a_failed_front_half_raises_in_its_own_compile_and_serves_no_other() -> None:
    failing, working = Maker("debug", fails=True), Maker("debug")
    with sharing():
        with pytest.raises(ValueError, match="raised"):
            text(failing, Options(4))
        assert text(working, Options(8)) == "ir debug=False" and working.calls == 1


def test_threads_making_the_same_front_half_at_once_make_it_once() -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow(options: Options) -> str:
        calls.append(type(options).__name__)
        started.set()
        assert release.wait(30)
        return f"ir debug={options.debug}"

    results: list[str] = []
    with sharing():
        first = threading.Thread(target=lambda: results.append(ir_text(Source("k"), "t", Options(4), {}, slow)))
        first.start()
        assert started.wait(30)
        second = threading.Thread(target=lambda: results.append(ir_text(Source("k"), "t", Options(8), {}, slow)))
        second.start()
        release.set()
        first.join(30)
        second.join(30)
    assert results == ["ir debug=False"] * 2 and calls == ["Options"]  # a recording copy, of the same type's name


def test_a_front_half_waited_for_past_its_bound_is_made_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_fronts, "WAIT_S", 0.05)
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def stuck(options: Options) -> str:  # the first caller's, held until the second has made its own
        calls.append(options.num_warps)
        started.set()
        assert release.wait(30)
        return "ir"

    results: list[str] = []
    with sharing():
        first = threading.Thread(target=lambda: results.append(ir_text(Source("k"), "t", Options(4), {}, stuck)))
        first.start()
        assert started.wait(30)
        own = ir_text(Source("k"), "t", Options(8), {}, lambda options: calls.append(options.num_warps) or "own")
        assert own == "own"
        release.set()
        first.join(30)
    assert calls == [4, 8] and results == ["ir"]
