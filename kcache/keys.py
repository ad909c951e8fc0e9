"""Cache keys: sha256 over a canonical JSON document of everything that shapes the output."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

# Bump when the entry layout or the meaning of any key field changes.
ENTRY_FORMAT = 1
# Where the @tilelang.jit call a request came from (its function's name and arguments) rides to the
# compile worker inside the described key fields; write_entry takes it out into meta.json's "jit". It
# names the entry for `kcache ls`, and is never part of the key.
JIT_CALL_FIELD = "@jit"


def _fallback(value: object) -> object:
    # Enum members (TileLang's PassConfigKey) and similar: their value is stable.
    inner = getattr(value, "value", None)
    if isinstance(inner, (str, int, float, bool)):
        return inner
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    raise TypeError(f"cannot put {type(value).__name__} {value!r} into a cache key")


def canonical_json(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), default=_fallback, ensure_ascii=True)


def derive_key(fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(dict(fields)).encode()).hexdigest()
