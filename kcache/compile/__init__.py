"""Isolated compiles: a pool of long-lived worker processes, their wire protocol and the worker itself.

A crash, abort or hang in a compiler kills a worker, not the caller. Nothing here knows TileLang:
the TileLang backend hands the pool a job by name (`kcache.compile.protocol.CallByName`).
"""
