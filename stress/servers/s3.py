"""A real S3-protocol server process on a free loopback port (moto's S3 service), for the object-storage
tier's tests, benchmark and stress runs.

    python -m stress.servers.s3 [--port N] [--bucket NAME]   # prints "ready PORT", serves until killed

It serves moto's S3 application alone (no host-based dispatch among moto's other services), over
HTTP/1.1 keep-alive with Nagle off, and creates the bucket before it says it is ready. Writes
(PUT, POST, DELETE) are served one at a time: moto checks `If-None-Match: *` and then stores, two
steps, so two threads could both create one object, where S3 lets exactly one create win. Reads
are served concurrently.

No pytest here: a missing moto raises `S3ServerMissing` (tests/s3_server.py makes it a skip).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

INSTALL_HINT = "pip install -e '.[test]' (moto[server])"
BUCKET = "kcache"
WRITES = frozenset({"PUT", "POST", "DELETE"})
# moto signs nothing and checks no credentials unless asked; any values do.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "kcache-test", "AWS_SECRET_ACCESS_KEY": "kcache-test", "AWS_REGION": "us-east-1"}


class S3ServerMissing(RuntimeError):
    """moto (with its server extra) is not installed; the message says what to install."""


@dataclass
class S3Server:
    """A running server: its process, its endpoint, and the environment a client needs."""

    process: subprocess.Popen
    port: int
    bucket: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, prefix: str = "cache") -> str:
        return f"s3://{self.bucket}/{prefix}"


def check_installed() -> None:
    try:
        import flask  # noqa: F401
        import moto.moto_server.werkzeug_app  # noqa: F401
    except ImportError as err:
        raise S3ServerMissing(f"moto's S3 server cannot be imported ({err}); {INSTALL_HINT}") from None


@contextmanager
def s3_server(bucket: str = BUCKET) -> Iterator[S3Server]:
    """Start the server in a process of its own; yield it; kill it afterwards."""
    check_installed()
    process = subprocess.Popen([sys.executable, "-m", "stress.servers.s3", "--port", "0", "--bucket", bucket],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                                   os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),  # the checkout
                                   os.environ.get("PYTHONPATH")]))})
    assert process.stdout is not None
    output = []
    for line in process.stdout:  # a handshake on its output, not a sleep
        if line.startswith("ready "):
            port = int(line.split()[1])
            break
        output.append(line)
    else:
        raise RuntimeError(f"the S3 server exited with status {process.wait()}: {''.join(output)[-2000:]}")
    threading.Thread(target=process.stdout.read, daemon=True).start()  # drain it: a full pipe would block it
    server = S3Server(process, port, bucket)
    server.env = {**CREDENTIALS, "AWS_ENDPOINT_URL": server.endpoint}
    try:
        yield server
    finally:
        process.kill()
        process.wait()


def serve(port: int, bucket: str) -> None:
    from moto.moto_server.werkzeug_app import create_backend_app
    from werkzeug.serving import WSGIRequestHandler, make_server

    app = create_backend_app("s3")
    created = app.test_client().put(f"/{bucket}")
    if created.status_code != 200:
        raise SystemExit(f"could not create the bucket {bucket!r}: {created.status}")
    writes = threading.Lock()

    def one_write_at_a_time(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") in WRITES:
            with writes:
                # The whole body is produced here, under the lock: moto's answer is a list.
                return list(app(environ, start_response))
        return app(environ, start_response)

    class Handler(WSGIRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connections
        disable_nagle_algorithm = True

        def log_request(self, *args: Any, **kwargs: Any) -> None:
            pass

    server = make_server("127.0.0.1", port, one_write_at_a_time, threaded=True, request_handler=Handler)
    print(f"ready {server.server_port}", flush=True)
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m stress.servers.s3", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bucket", default=BUCKET)
    args = parser.parse_args()
    serve(args.port, args.bucket)


if __name__ == "__main__":
    main()
