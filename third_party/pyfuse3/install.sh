#!/usr/bin/env bash
# Build pyfuse3 from its pinned PyPI sdist with every *.patch beside this script applied (in name
# order), and install it into the
# virtual environment whose pip is given as $1. Idempotent: does nothing when that exact build is
# installed already. See README.md beside this file for what the patch changes and why.
set -euo pipefail

PIP=${1:?usage: install.sh PATH/TO/VENV/bin/pip}
VERSION=3.5.0
SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
LOCAL_VERSION="$VERSION+bundlefs.2"  # shows in `pip list` that this is the patched build
HERE=$(cd "$(dirname "$0")" && pwd)

installed=$("$PIP" show pyfuse3 2>/dev/null || true)  # (a pipe into grep -q would break pip's)
if grep -qx "Version: $LOCAL_VERSION" <<<"$installed"; then
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PIP" download -q --no-deps --no-binary :all: -d "$work" "pyfuse3==$VERSION"
sdist="$work/pyfuse3-$VERSION.tar.gz"
echo "$SHA256  $sdist" | sha256sum -c --quiet - || {
  echo "pyfuse3 $VERSION sdist does not match its pinned SHA-256: refusing to build it" >&2
  exit 1
}
tar -xzf "$sdist" -C "$work"
for p in "$HERE"/*.patch; do
  patch -s -p1 -d "$work/pyfuse3-$VERSION" < "$p"
done
echo "building pyfuse3 $LOCAL_VERSION (pyfuse3 $VERSION + third_party/pyfuse3/*.patch)"
SETUPTOOLS_SCM_PRETEND_VERSION="$LOCAL_VERSION" "$PIP" install -q "$work/pyfuse3-$VERSION"
