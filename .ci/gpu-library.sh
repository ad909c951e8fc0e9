#!/usr/bin/env bash
# Here, once: the real Triton library of `python -m stress.bench --only triton-library` (issue 67), for the
# GPU machine, which has no network. fla-core (flash-linear-attention's Triton kernels, heavy
# @triton.autotune use) is pure Python and needs only einops, torch and triton, which the GPU image has:
# its wheel goes into .whl (.ci/gpu-setup.sh installs .whl/*.whl). Its tests are not in the wheel: the test
# modules and their conftest come from the repository at the same version's tag, into .gpu/library/fla (the
# bench copies the folder into each of its runs): test_hgrn.py, the bench's default (its configs only split
# independent channels, so every pick computes the same numbers: verdicts cannot differ by the pick), and
# test_delta.py, whose tl.dot kernels take several times longer to compile (--tests tests/ops/test_delta.py). fla-core 0.5.2's wheel is the tag v0.5.2's fla/ byte for
# byte, so the tests are the ones written for that code. Both folders are ignored by git; carry them:
#   device run, carry [".gpu", ".whl"]:  STEPS="triton-library" bash .ci/gpu-check
set -euo pipefail
VERSION="${FLA_VERSION:-0.5.2}"
MODULES="${FLA_TESTS:-tests/ops/test_hgrn.py tests/ops/test_delta.py}"
mkdir -p .whl .gpu/library/fla
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "fla-core==$VERSION"
for path in tests/conftest.py $MODULES; do
  mkdir -p ".gpu/library/fla/$(dirname "$path")"
  curl -fsSL "https://raw.githubusercontent.com/fla-org/flash-linear-attention/v$VERSION/$path" \
    -o ".gpu/library/fla/$path"
done
ls -la .whl/fla_core-*.whl; find .gpu/library/fla -type f
