"""Network faults as separate processes, for the remote tier's tests (never in-process stubs):

    python tests/faulty_endpoints.py trickle HOST PORT DELAY   # a proxy to a real Redis: replies one byte per DELAY s
    python tests/faulty_endpoints.py ok                        # answers "+OK" to everything (not a Redis)

Each prints the port it listens on (127.0.0.1), then serves until killed."""

from __future__ import annotations

import socket
import sys
import threading
import time


def pump(source: socket.socket, target: socket.socket, delay: float) -> None:
    try:
        while data := source.recv(65536):
            if delay:
                for index in range(len(data)):
                    target.sendall(data[index:index + 1])
                    time.sleep(delay)  # the fault itself: a slow link, not synchronization
            else:
                target.sendall(data)
    except OSError:
        pass
    finally:
        for side in (source, target):
            try:
                side.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def trickle(client: socket.socket, host: str, port: int, delay: float) -> None:
    upstream = socket.create_connection((host, port))
    threading.Thread(target=pump, args=(client, upstream, 0.0), daemon=True).start()
    pump(upstream, client, delay)


def always_ok(client: socket.socket) -> None:
    try:
        while client.recv(65536):
            client.sendall(b"+OK\r\n")
    except OSError:
        pass


def main() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    print(listener.getsockname()[1], flush=True)
    while True:
        client, _ = listener.accept()
        if sys.argv[1] == "trickle":
            args = (client, sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
            threading.Thread(target=trickle, args=args, daemon=True).start()
        else:
            threading.Thread(target=always_ok, args=(client,), daemon=True).start()


if __name__ == "__main__":
    main()
