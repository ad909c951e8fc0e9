#!/usr/bin/env bash
# Here, once: the S3 tier's client (obstore) and moto's S3 server with what it imports, for Python 3.12,
# pruned to S3 (botocore's models of other services, moto's other services), into .gpu/s3-bundle.tar.xz,
# so that the GPU machine (no network) can run the S3 benchmarks and stress runs (jinja2, markupsafe and
# typing_extensions come with torch there): .ci/gpu-setup.sh
# unpacks it into its site directory when it is there.
set -euo pipefail
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$work/wheels" --no-deps \
  obstore==0.12.1 moto==5.2.5 boto3 botocore s3transfer jmespath python-dateutil six urllib3 requests certifi \
  idna charset-normalizer responses xmltodict werkzeug flask flask-cors itsdangerous click \
  blinker cryptography cffi pycparser pyyaml
mkdir -p "$work/site"
for wheel in "$work"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$work/site"; done
# botocore: the models moto's S3, STS, IAM, CloudWatch and Events import, and the shared data files.
find "$work/site/botocore/data" -mindepth 1 -maxdepth 1 -type d \
  ! -name s3 ! -name sts ! -name iam ! -name cloudwatch ! -name events ! -name s3control -exec rm -rf {} +
# moto: the packages its S3 server imports (python -c 'import moto.s3.responses' lists them).
keep=" core s3 s3bucket_path sts iam cloudwatch events moto_api moto_server utilities "
for dir in "$work"/site/moto/*/; do
  name="$(basename "$dir")"; case "$keep" in *" $name "*) ;; *) rm -rf "$dir" ;; esac
done
rm -rf "$work"/site/*.dist-info/RECORD
mkdir -p .gpu
tar cJf .gpu/s3-bundle.tar.xz -C "$work/site" .
ls -la .gpu/s3-bundle.tar.xz
