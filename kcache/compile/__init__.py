"""Isolated compiles: the lanes a compile runs in, and what crosses into each.

A crash, abort or hang in a compiler kills a worker, not the caller. Nothing here knows TileLang:
the TileLang backend hands a job by name (`protocol.CallByName`) and chooses the lane
(`kcache.tilelang.compile_lanes`). The lanes, one folder each:

- in the caller (`KCACHE_COMPILE_ISOLATION=inprocess`, and the fallback for a job that cannot be
  sent exactly): no module here; nothing crosses.
- `fork/`, a fork of the caller (bounded machine-wide by `compile_slots`): the job's objects in
  memory, nothing pickled; the caller's callbacks are called back over its pipes.
- `service/`, the compile service (`client`, `service_connection`, `connection` and `shared_pools`
  in the caller; `server_process`, `server`, `scheduler`, `inflight`, `calls` in the server;
  `address` for both): the job pickled (a PrimFunc as
  `kcache.tilelang.transfer`'s checked copy), the client's sys.path and umask; a fresh fork of one
  warm template for every job; the callbacks' calls relayed to the client and back, unopened.
- `pool/`, the process's own pool (`KCACHE_COMPILE_ISOLATION=pool`, the fallback when the service
  is unreachable, and the service's own workers): the job pickled, as to the service.

Shared by the lanes: `workers/` (a worker's loop, a worker as its parent drives it, the warm
template that forks workers), `jobs` (Job, JobRunner), `protocol` (the wire: messages, calls to the
caller), `caller_calls` (the caller's side of those calls), `interpreter` (every interpreter kcache
starts: nothing imported from the working directory), `compile_slots` (compiles machine-wide) and
`runtime_dir` (the user's private directory for sockets and slots). docs/design/compile.md, "What
crosses a process", has the table. Imports go one way: a lane imports the shared modules, `service` imports
`fork` and `pool` (its fallbacks and its workers), and nothing shared imports a lane.
"""
