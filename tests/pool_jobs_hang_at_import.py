"""Preloaded by a test: importing it never finishes, so a worker that preloads it never gets ready."""

from __future__ import annotations

import threading

threading.Event().wait()
