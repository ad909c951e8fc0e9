"""Reading a Redis value that whoever can write to Redis may have planted: its type and size are
checked inside Redis before a byte of it is sent, so a multi-GB string or a hash under one of
kcache's keys costs the reader one small reply, not its memory, and never an error that marks
Redis down (a GET of a hash is a WRONGTYPE error). Entries and leases are read this way.
"""

from __future__ import annotations

from typing import Any

from kcache.tiers.remote_guard import RemoteCorrupt

# false: absent; {type}: not a string; a number: the size of a string over the cap; else the string.
CAPPED_GET = (
    "local kind = redis.call('type', KEYS[1])['ok'] "
    "if kind == 'none' then return false end "
    "if kind ~= 'string' then return {kind} end "
    "local size = redis.call('strlen', KEYS[1]) "
    "if size > tonumber(ARGV[1]) then return size end "
    "return redis.call('get', KEYS[1])")


def register_capped_get(client: Any) -> Any:
    """The capped read as a script of `client` (call it with keys=[name], args=[cap], and optionally
    client=a pipeline under WATCH)."""
    return client.register_script(CAPPED_GET)


def capped_value(reply: Any, over: str) -> bytes | RemoteCorrupt | None:
    """The string the capped read returned; None if absent; RemoteCorrupt (returned, not raised)
    naming what was there instead: a string too big (`over`: "the 4096 of a lease", say), or a value
    of another Redis type."""
    if reply is None:
        return None
    if isinstance(reply, bytes):
        return reply
    if isinstance(reply, int):
        return RemoteCorrupt(f"a value of {reply} bytes, over {over} (not downloaded)")
    if isinstance(reply, list) and len(reply) == 1 and isinstance(reply[0], bytes):
        return RemoteCorrupt(f"a Redis {reply[0].decode(errors='replace')} where a string value belongs")
    return RemoteCorrupt(f"a Redis reply {reply!r:.60} where a string value belongs")
