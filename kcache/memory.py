"""The in-process tier: compiled kernels by PrimFunc identity, then by structure.

TileLang re-prints the whole TIR script on every lookup (about a
millisecond). Here a call with the same PrimFunc object is one dict lookup,
and a structurally equal PrimFunc costs one structural hash plus one
structural comparison, both in C++.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any


class MemoryTier:
    """`structural_hash` and `structural_equal` are TVM's (injected: TVM loads with TileLang)."""

    def __init__(self, structural_hash: Callable[[Any], int], structural_equal: Callable[[Any, Any], bool]) -> None:
        self._hash = structural_hash
        self._equal = structural_equal
        self._by_object: dict[tuple[Any, Hashable], Any] = {}
        self._by_structure: dict[tuple[int, Hashable], list[tuple[Any, Any]]] = {}
        self._lock = threading.Lock()

    def get(self, func: Any, options: Hashable) -> Any | None:
        kernel = self._by_object.get((func, options))
        if kernel is not None:
            return kernel
        bucket = self._by_structure.get((self._hash(func), options))
        if not bucket:
            return None
        for known, kernel in list(bucket):
            if self._equal(known, func):
                with self._lock:
                    self._by_object[(func, options)] = kernel
                return kernel
        return None

    def put(self, func: Any, options: Hashable, kernel: Any) -> Any:
        """Remember `kernel`; if another thread got there first, return theirs."""
        bucket_key = (self._hash(func), options)
        with self._lock:
            existing = self._by_object.get((func, options))
            if existing is not None:
                return existing
            self._by_object[(func, options)] = kernel
            self._by_structure.setdefault(bucket_key, []).append((func, kernel))
            return kernel

    def clear(self) -> None:
        with self._lock:
            self._by_object.clear()
            self._by_structure.clear()

    def __len__(self) -> int:
        return len(self._by_object)
