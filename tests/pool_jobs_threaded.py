"""Preloaded by a test: importing it starts a thread, as some libraries do, so a worker template that
imported it must not fork."""

from __future__ import annotations

import threading

_forever = threading.Event()
threading.Thread(target=_forever.wait, name="a library's thread", daemon=True).start()
