"""What makes two tunes the same tune: the identity a saved result is stored and found under."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kcache.keys import canonical_json


def tune_identity(kernel_factory: Callable[..., Any], configs: Sequence[dict[str, Any]], target: Any,
                  out_idx: Any, tune_key: Any, device: Mapping[str, Any]) -> str:
    """What makes two tunes the same: the factory (name and source), the configs, target, out_idx,
    key, and the identity of the device they are measured on (not its index)."""
    try:
        target_text = canonical_json(target)
    except TypeError:
        target_text = str(target)
    fields = {
        "factory": f"{getattr(kernel_factory, '__module__', '?')}.{getattr(kernel_factory, '__qualname__', '?')}",
        "source": factory_source(kernel_factory),
        "configs": [canonical_json(c) for c in configs],
        "target": target_text,
        "out_idx": repr(out_idx),
        "key": canonical_json(tune_key) if tune_key is not None else None,
        "device": canonical_json(dict(device)),
    }
    return hashlib.sha256(canonical_json(fields).encode()).hexdigest()


def factory_source(function: Callable[..., Any]) -> str:
    """The source of a kernel factory: an edit to it is another tune."""
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):  # built in a REPL or by exec: its name stands for it
        return ""
