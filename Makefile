# bundlefs developer entry points. Every target installs what it needs first.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SYSTEM_PACKAGES := fuse3 libfuse3-dev pkg-config gcc attr
STAMP := $(VENV)/.installed

.PHONY: install system-deps test lint demo bench bench-quick fuzz soak clean

install: $(STAMP)
	@# As root, put this checkout's bundlefs on the PATH that mount.fuse3 uses (mount -t
	@# fuse.bundlefs, fstab). Every time: a link left by another checkout may dangle.
	@if [ "$$(id -u)" = 0 ] && [ "$$(readlink /usr/local/bin/bundlefs)" != "$(CURDIR)/$(BIN)/bundlefs" ]; then \
	  ln -sf "$(CURDIR)/$(BIN)/bundlefs" /usr/local/bin/bundlefs; fi

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml | system-deps
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q tests

lint: install
	$(BIN)/ruff check bundlefs tests bench
	$(BIN)/ruff format --check bundlefs tests bench

demo: install
	$(BIN)/python -m bundlefs.demo

bench: install
	$(BIN)/python -m bench.run

bench-quick: install
	$(BIN)/python -m bench.run --quick

fuzz: install
	BUNDLEFS_FUZZ_EXAMPLES=2000 $(BIN)/python -m pytest -q tests/test_fuzz.py tests/test_hostile_index.py

soak: install
	BUNDLEFS_SOAK_SECONDS=300 $(BIN)/python -m pytest -q tests/test_soak.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis demo
