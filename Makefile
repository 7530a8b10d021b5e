# bundlefs developer entry points. Every target installs what it needs first.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SYSTEM_PACKAGES := fuse3 libfuse3-dev pkg-config gcc attr patch rsync sqlite3 git
STAMP := $(VENV)/.installed
# An unpatched pyfuse3 beside the venv: the tests run the daemon on it to cover the fallback path.
STOCK_PYFUSE3 := build/stock-pyfuse3
# pip's wheel and download cache stays in the checkout (make clean removes it), not in the home
# directory.
export PIP_CACHE_DIR := $(CURDIR)/build/pip-cache

.PHONY: install system-deps test test-fast lint check demo bench bench-quick bench-scale bench-million fuzz soak clean

install: $(STAMP)

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

# pyfuse3 is built from its pinned sdist with our opt-in patches (third_party/pyfuse3/*.patch) before
# the package's own dependencies, so pip sees it satisfied and never builds the stock one as well.
# (An editable install skips setup.py's bundlefs._fuse3: here the patched build is this pyfuse3.)
# The editable install is path-based (editable_mode=compat: a .pth naming the checkout), which mypy,
# pyright and IDEs follow; setuptools' default (lenient: an import hook for this flat layout) none of
# them can resolve, and strict links only the files present at install time. setuptools calls compat
# transitional: tests/cli/test_scripts_and_ides.py fails the day it stops resolving.
PYFUSE3_INPUTS := $(wildcard third_party/pyfuse3/*.patch) third_party/pyfuse3/install.sh \
  third_party/pyfuse3/prepare.py third_party/pyfuse3/pyfuse3-3.5.0.tar.gz
# The editable install compiles bundlefs/storage/_native.pyx in place (setup.py): an edit of it
# must rebuild, or bundlefs.storage.native would refuse the stale build and serve from Python.
$(STAMP): Makefile pyproject.toml setup.py bundlefs/storage/_native.pyx $(PYFUSE3_INPUTS) | system-deps
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	third_party/pyfuse3/install.sh $(BIN)/pip
	$(BIN)/pip install -q --config-settings editable_mode=compat -e '.[dev]'
	touch $(STAMP)

$(STOCK_PYFUSE3)/.installed: third_party/pyfuse3/stock-requirements.txt | $(STAMP)
	rm -rf $(STOCK_PYFUSE3)
	$(BIN)/pip install -q --no-deps --no-binary pyfuse3 --require-hashes \
	  --target $(STOCK_PYFUSE3) -r third_party/pyfuse3/stock-requirements.txt
	touch $@

# TESTS: what to run (default: the whole suite), e.g. make test TESTS=tests/library/test_verify.py
# or TESTS=tests/unit (the tiers are folders: unit, library, store, adapter, mount, cli).
# MARKERS: a pytest -m expression, e.g. MARKERS="not mount" (what make test-fast runs).
TESTS ?= tests
MARKERS ?=
# Everything the tests write goes under one temporary directory removed at the end: pytest's
# base temporary directory, whatever uses TMPDIR (Dask's scratch space, staging directories), the
# caches and logs under XDG_CACHE_HOME/XDG_STATE_HOME. --one-file-system: a mount a failed test
# left inside is never descended into.
test: install $(STOCK_PYFUSE3)/.installed
	@scratch=$$(mktemp -d -t bundlefs-test.XXXXXX); \
	TMPDIR=$$scratch XDG_CACHE_HOME=$$scratch/cache XDG_STATE_HOME=$$scratch/state \
	  BUNDLEFS_STOCK_PYFUSE3=$(CURDIR)/$(STOCK_PYFUSE3) \
	  $(BIN)/python -m pytest -q --basetemp=$$scratch/pytest $(if $(MARKERS),-m "$(MARKERS)") \
	  $(TESTS); \
	status=$$?; rm -rf --one-file-system "$$scratch"; exit $$status

# Every test that mounts nothing (no FUSE needed): the quick loop while editing.
test-fast:
	$(MAKE) test MARKERS="not mount"

lint: install
	$(BIN)/ruff check bundlefs tests bench setup.py third_party
	$(BIN)/ruff format --check bundlefs tests bench setup.py third_party
	$(BIN)/mypy

# What CI gates (.ci/run): lint and types first (seconds), then the whole suite.
check: lint test

demo: install
	$(BIN)/python -m bundlefs.demo

# The peers' tables, then the sections other modules own (docs/benchmarks.md keeps them).
bench: install
	$(BIN)/python -m bench.run
	$(BIN)/python -m bench.workers
	$(BIN)/python -m bench.codecs
	$(BIN)/python -m bench.torch_epoch
	$(BIN)/python -m bench.streaming
	$(BIN)/python -m bench.object_store
	$(BIN)/python -m bench.delta
	$(BIN)/python -m bench.delta_sources
	$(BIN)/python -m bench.diff
	$(BIN)/python -m bench.dedup
	$(BIN)/python -m bench.writer
	$(BIN)/python -m bench.versions

bench-quick: install
	$(BIN)/python -m bench.run --quick

# Issue 13 (docs/scale.md): bench.scale packs 100,000 and 10,000,000 generated files (~15 min,
# ~3.5 GB of disk); bench.memory (issue 27) the peak memory of pack from a tar stream, verify and
# merge at 100,000 and 1,000,000 files, projected to 10,000,000 and 100,000,000 (~6 min);
# bench.s3_open (issue 27) the first byte of the scale tree's bundle on a local S3 server and the
# bytes fetched before it, at 100,000 and 1,000,000 files (~5 min; --sizes 1e5,1e6,1e7 for the
# issue's row: ~10 min more, ~1 GB of disk).
bench-scale: install
	$(BIN)/python -m bench.scale
	$(BIN)/python -m bench.dask_pack
	$(BIN)/python -m bench.memory
	$(BIN)/python -m bench.s3_open

# Issue 26 on the million tree too: bench.delta packs on a base with 1,000,000 generated files
# of ~20 KiB beside the small dataset, then the issue's table (bench.versions) from this run and
# the newest bench.diff and bench.dedup ones. ~35 min under load (writing the tree ~7, its full
# pack ~7), ~40 GB of disk at the peak; the tree (21 GB) stays in the work directory's data/,
# changed, and is written again by the next run: remove it when done.
bench-million: install
	$(BIN)/python -m bench.delta --million
	$(BIN)/python -m bench.versions

fuzz: install
	BUNDLEFS_FUZZ_EXAMPLES=2000 $(BIN)/python -m pytest -q tests/library/test_fuzz.py tests/library/test_hostile_index.py

soak: install
	BUNDLEFS_SOAK_SECONDS=300 $(BIN)/python -m pytest -q tests/mount/test_soak.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis demo
