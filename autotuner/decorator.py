"""`@autotuner.autotune`: `autotuner.tune` as a decorator over a TileLang-style kernel factory."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from autotuner.identity import factory_source
from autotuner.tune import tune
from kcache.keys import canonical_json


def autotune(configs: Sequence[dict[str, Any]], key: Sequence[str] = (), **tune_options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator for TileLang-style use: `@autotune(configs=[...], key=["M", "N", "K"])` over a kernel
    factory `f(*args, **config)`. Calling the decorated function tunes once per value of the `key`
    arguments (the saved result, if any) and returns the best kernel."""

    def decorate(factory: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(factory)
        tuned: dict[str, Any] = {}

        @functools.wraps(factory)
        def best_kernel(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind_partial(*args, **kwargs)
            chosen = {name: bound.arguments.get(name) for name in key}
            memo = canonical_json(chosen)
            if memo not in tuned:

                def configured(**config: Any) -> Any:
                    return factory(*args, **kwargs, **config)

                configured.__module__ = factory.__module__
                configured.__qualname__ = factory.__qualname__
                result = tune(configured, configs, tune_key={"key": chosen, "source": factory_source(factory)},
                              **tune_options)
                tuned[memo] = result.load_kernel(tune_options.get("cache"))
            return tuned[memo]

        best_kernel.tune_configs = list(configs)  # type: ignore[attr-defined]
        return best_kernel

    return decorate
