# Sourced by the GPU scripts: unpack the TileLang bundle, add the wheels the GPU image lacks.
OUT="${OUT:-/tmp/kcache-gpu-out}"; mkdir -p "$OUT"
mkdir -p /tmp/site
# A warm machine keeps /tmp between calls: unpack and compile once per bundle.
# Without the TileLang bundle (a call that runs only the Helion or Triton steps), the wheels alone.
BUNDLE_MARK="/tmp/site/.kcache-bundle-$(cat .gpu/*.tar.xz .whl/*.whl 2>/dev/null | cksum | cut -d' ' -f1)"
if [ ! -e "$BUNDLE_MARK" ]; then
# The S3 tier's client and moto's S3 server (.ci/gpu-s3.sh made it), first: TileLang's bundle wins
# where both hold a package.
if [ -f .gpu/s3-bundle.tar.xz ]; then tar xJf .gpu/s3-bundle.tar.xz -C /tmp/site || exit 1; fi
if [ -f .gpu/tilelang-bundle.tar.xz ]; then tar xJf .gpu/tilelang-bundle.tar.xz -C /tmp/site || exit 1
else echo "gpu-setup: no .gpu/tilelang-bundle.tar.xz (bash ../shared/gpu/make-bundle.sh): no TileLang here"; fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
# The bundle is unpacked without bytecode and the GPU image sets PYTHONDONTWRITEBYTECODE=1, so every
# fresh interpreter (each compile worker) would compile TileLang from source: about 3 s of a 7-8 s
# import there. Compile it once, as `pip install` does.
python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1 || true
touch "$BUNDLE_MARK"
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# redis-server for the remote-tier benchmarks, where the image has none (.ci/gpu-redis.sh made it).
if ! command -v redis-server >/dev/null && [ -x .gpu/redis/bin/redis-server ]; then export PATH="$PWD/.gpu/redis/bin:$PATH"; fi
nvidia-smi -L | tee "$OUT/device.txt"
python3 -c "
import importlib.metadata as m, torch
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return 'none'
print('tilelang', v('tilelang'), 'helion', v('helion'), 'torch', torch.__version__, torch.cuda.get_device_name())" 2>&1 \
  | grep -v INFO | tee -a "$OUT/device.txt"
date -u | tee -a "$OUT/device.txt"
