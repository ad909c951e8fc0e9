"""Isolated compiles: the lanes a compile runs in, and what crosses into each.

A crash, abort or hang in a compiler kills a worker, not the caller. Nothing here knows TileLang:
the TileLang backend hands a job by name (`protocol.CallByName`) and chooses the lane
(`kcache.tilelang.compile_lanes`). The lanes, and their modules:

- in the caller (`KCACHE_COMPILE_ISOLATION=inprocess`, and the fallback for a job that cannot be
  sent exactly): no module here; nothing crosses.
- a fork of the caller (`caller_fork`, bounded machine-wide by `compile_slots`): the job's objects
  in memory, nothing pickled; the caller's callbacks are called back over its pipes.
- the compile service (`service_client` in the caller; `service`, `service_scheduler`,
  `service_inflight`, `service_calls`, `service_address` in the server; `template`,
  `template_process` fork a fresh worker from one warm template for every job): the job pickled
  (a PrimFunc as `kcache.tilelang.transfer`'s checked copy), the client's sys.path and umask; the
  callbacks' calls relayed to the client and back, unopened.
- the process's own pool (`pool`, `KCACHE_COMPILE_ISOLATION=pool` and the fallback when the service
  is unreachable): the job pickled, as to the service.

Shared by the lanes: `jobs` (Job, JobRunner), `protocol` (the wire: messages, calls to the caller),
`caller_calls` (the caller's side of those calls), `worker` (a worker's loop), `worker_process` (a
worker as its parent drives it), `interpreter` (every interpreter kcache starts: nothing imported
from the working directory). docs/design.md, "What crosses a process", has the table.
"""
