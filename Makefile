# The two commands a newcomer needs: `make run` and `make test`. Both bootstrap what they need.
PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.bootstrapped
# Extra flags for `make run`, e.g. make run ARGS="--source file:clip.h264"
ARGS   ?=

.PHONY: run test lint bench image system-deps clean
.DEFAULT_GOAL := run

$(STAMP): pyproject.toml requirements.lock scripts/bootstrap-venv
	PYTHON=$(PYTHON) scripts/bootstrap-venv $(VENV)
	@touch $@

## run: start the appliance (synthetic test camera when no Pi camera is present)
run: $(STAMP)
	$(VENV)/bin/ruseon serve --state-dir .state $(ARGS)

## test: system packages (as root), lint, then the whole suite in a private network namespace
test: system-deps $(STAMP)
	scripts/test

## lint: ruff and mypy
lint: $(STAMP)
	$(VENV)/bin/ruff check ruseon_appliance tests bench hil
	$(VENV)/bin/mypy

## bench: the benchmarks in bench/, side by side with naive aiortc
bench: $(STAMP)
	scripts/bench

## image: the flashable image (IMAGE_TARGET=rpi, or debian for the CI-runnable rootfs)
IMAGE_TARGET ?= rpi
image: $(STAMP)
	image/build $(IMAGE_TARGET)

## system-deps: apt packages the tests need (installs as root, prints the command otherwise)
system-deps:
	scripts/install-system-deps

clean:
	rm -rf $(VENV) .state .mypy_cache .ruff_cache .pytest_cache artifacts
