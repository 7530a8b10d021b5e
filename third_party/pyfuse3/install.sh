#!/usr/bin/env bash
# Build pyfuse3 from the vendored, hash-pinned 3.5.0 sdist with every *.patch here applied in name
# order (prepare.py), and install it into the virtual environment whose pip is given as $1, as
# version 3.5.0+bundlefs.ID (ID names the patch set, so a new or changed patch rebuilds it).
# Idempotent: does nothing when that exact build is installed already. `make install` uses it for
# the top-level `pyfuse3` of the developer venv; `pip install 'bundlefs[mount]'` builds the same
# sources as bundlefs._fuse3 instead (setup.py). See README.md beside this file.
set -euo pipefail

PIP=${1:?usage: install.sh PATH/TO/VENV/bin/pip}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=$(dirname "$PIP")/python
LOCAL_VERSION=$("$PY" "$HERE/prepare.py" --local-version)  # shows in `pip list`: the patched build

installed=$("$PIP" show pyfuse3 2>/dev/null || true)  # (a pipe into grep -q would break pip's)
if grep -qx "Version: $LOCAL_VERSION" <<<"$installed"; then
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source=$("$PY" "$HERE/prepare.py" "$work")
echo "building pyfuse3 $LOCAL_VERSION (pyfuse3 3.5.0 + $(cd "$HERE" && echo *.patch))"
SETUPTOOLS_SCM_PRETEND_VERSION="$LOCAL_VERSION" "$PIP" install -q "$source"
