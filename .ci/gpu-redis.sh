#!/usr/bin/env bash
# Here, once: copy Debian's redis-server with the libraries it links (but libc's) into .gpu/redis, and
# redis-py's wheel into .whl, so that the GPU machine (no network, no redis) can run the remote-tier
# benchmarks: .ci/gpu-setup.sh puts .gpu/redis/bin first on PATH when the image has no redis-server.
set -euo pipefail
command -v redis-server >/dev/null || apt-get install -y redis-server
mkdir -p .gpu/redis/lib .gpu/redis/bin .whl
cp /usr/bin/redis-server .gpu/redis/redis-server.real
for lib in $(ldd /usr/bin/redis-server | awk '/=>/ {print $3}'); do
  case "$(basename "$lib")" in libc.so*|libm.so*|ld-linux*) ;; *) cp -L "$lib" .gpu/redis/lib/ ;; esac
done
cat > .gpu/redis/bin/redis-server <<'WRAPPER'
#!/bin/sh
here="$(cd "$(dirname "$0")/.." && pwd)"
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/redis-server.real" "$@"
WRAPPER
chmod +x .gpu/redis/bin/redis-server
python3 -m pip download -q --no-deps -d .whl redis
