"""The compile-service lane: one service per user and environment, one fresh fork of its warm
template for every job.

In the caller: `client` (the CompilePool interface), `service_connection` (its connection and its
loss), `connection` (reaching or starting the service), `shared_pools` (the process's shared
client). In the server: `server_process` (its start and end), `server` (the clients), `scheduler` (fair
among clients), `inflight` (one compile for identical jobs of one root), `calls` (a worker's calls
to its client, relayed unopened). Both: `address` (which service, and where it listens).
"""
