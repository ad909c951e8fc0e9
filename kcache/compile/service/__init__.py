"""The compile-service lane: one service per user and environment, one fresh fork of its warm
template for every job.

In the caller: `client`. In the server: `server` (the socket and the clients), `scheduler` (fair
among clients), `inflight` (one compile for identical jobs of one root), `calls` (a worker's calls
to its client, relayed unopened). Both: `address` (which service, and where it listens).
"""
