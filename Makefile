# gptrm — two commands: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# .venv serves `make run` (coordinator + agent) and `make test` (every extra, the test tools and PyTorch's CPU build
# for the training jobs the integration tests run).
VENV_EXTRAS ?= all,dev,train

.PHONY: run test test-faults proto proto-check lint typecheck bench soak clean venv install uninstall system-test-deps

# Debian packages the tests use (real programs, never mocks), installed by `make test` when missing. One per line,
# with what needs it.
SYSTEM_TEST_PACKAGES ?= \
	prometheus \
	crun \
	skopeo \
	umoci \
	docker-registry \
	chromium \
	chromium-driver
# prometheus: promtool checks the example alert rules (tests/unit/test_alert_rules.py)
# crun, skopeo, umoci: tasks with an image (tests/integration/test_containers.py, test_pytorch_jobs.py's job in an
# image, tests/bench/bench_submit.py --image); docker-registry: the registry those start on loopback
# chromium, chromium-driver: the web console's browser tests drive the system's headless Chromium through Selenium
#   (tests/integration/test_web.py); no browser is ever downloaded

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(VENV_EXTRAS)]'
	touch $(STAMP)

## run: embedded etcd + coordinator + one local agent (simulated GPUs unless NVML works), in the foreground;
## ARGS="..." passes coordinator flags through, e.g. make run ARGS="--price-kwh 0.2 --usage-interval 10"
ARGS ?=
run: export GPTRM_DEV_COORDINATOR_ARGS = $(ARGS)
run: $(STAMP)
	$(PY) -m coordinator.devcluster

## test: install into .venv, check the generated code and the types, run the whole test suite on TEST_WORKERS
## workers (4 on 2 cores: the suite mostly waits on real processes; TEST_WORKERS=0 runs it in this one process)
TEST_WORKERS ?= 4
test: $(STAMP) system-test-deps proto-check typecheck
	$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist worksteal)

## system-test-deps: install the Debian packages of SYSTEM_TEST_PACKAGES that are missing (needs root or sudo)
system-test-deps:
	@missing=$$(for p in $(SYSTEM_TEST_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages for the tests: $$missing"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

## test-faults: every fault scenario (3-member etcd, 3 coordinators, agents; several minutes), and the slow
## fault variants of integration tests (marked `faults`)
test-faults: $(STAMP)
	GPTRM_FAULTS=1 $(PY) -m pytest tests/faults
	GPTRM_FAULTS=1 $(PY) -m pytest -m faults tests/integration

proto: $(STAMP)
	$(PY) proto/generate.py

proto-check: $(STAMP)
	$(PY) proto/generate.py --check

lint: $(STAMP) typecheck
	$(VENV)/bin/ruff check agent coordinator common tests proto

## typecheck: mypy over agent, coordinator and common (settings in pyproject.toml)
typecheck: $(STAMP)
	$(VENV)/bin/mypy

## bench: speed and memory benchmarks (not part of `make test`)
bench: $(STAMP)
	@set -e; for f in tests/bench/bench_*.py; do echo "== $$f"; $(PY) $$f; done

## soak: 500 simulated agents, 5 submits/s, leader kills, 10 minutes (not part of `make bench`)
soak: $(STAMP)
	$(PY) tests/bench/soak.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

## install: (root) the package in its own venv under $(PREFIX), units, example configs (never
## overwritten), system users. DESTDIR=... stages the tree without root and creates no users.
## EXTRAS= (empty) installs the agent only (a GPU host); the default adds gptrm-coordinator and gptrmctl.
## A GPU host that runs tasks with an image (--image) also needs: apt-get install crun skopeo umoci
## (docs/containers.md; nvidia-container-toolkit for GPU driver libraries inside images).
DESTDIR   ?=
PREFIX    ?= /opt/gptrm
UNITDIR   ?= /etc/systemd/system
CONFDIR   ?= /etc/gptrm
SYSUSERSDIR ?= /usr/lib/sysusers.d
PIP_ARGS  ?=
EXTRAS    ?= coordinator,ctl
install:
	$(PYTHON) -m venv $(DESTDIR)$(PREFIX)/venv
	$(DESTDIR)$(PREFIX)/venv/bin/python -m pip install --quiet $(PIP_ARGS) '.$(if $(EXTRAS),[$(EXTRAS)])'
	install -D -m 0644 README.md $(DESTDIR)$(PREFIX)/README.md
	install -D -m 0644 systemd/gptrm-coordinator.service $(DESTDIR)$(UNITDIR)/gptrm-coordinator.service
	install -D -m 0644 systemd/gptrm-agent.service $(DESTDIR)$(UNITDIR)/gptrm-agent.service
	install -D -m 0644 systemd/gptrm.sysusers $(DESTDIR)$(SYSUSERSDIR)/gptrm.conf
	install -d -m 0755 $(DESTDIR)$(CONFDIR) $(DESTDIR)$(CONFDIR)/pki
	@for f in agent.toml coordinator.toml; do \
	  if [ -e $(DESTDIR)$(CONFDIR)/$$f ]; then echo "kept existing $(DESTDIR)$(CONFDIR)/$$f"; \
	  else install -m 0644 systemd/$$f $(DESTDIR)$(CONFDIR)/$$f; fi; done
	@if [ -z "$(DESTDIR)" ]; then \
	  if command -v systemd-sysusers >/dev/null; then systemd-sysusers $(SYSUSERSDIR)/gptrm.conf; \
	  else getent passwd gptrm >/dev/null || useradd --system --home-dir /var/lib/gptrm --shell /usr/sbin/nologin gptrm; \
	       getent passwd gptrm-task >/dev/null || useradd --system --home-dir /var/lib/gptrm/agent/tasks --shell /usr/sbin/nologin gptrm-task; fi; \
	  systemctl daemon-reload 2>/dev/null || true; fi

## uninstall: remove the package, units and sysusers file; keep /etc/gptrm, state and users' files.
uninstall:
	-@if [ -z "$(DESTDIR)" ]; then systemctl disable --now gptrm-agent.service gptrm-coordinator.service 2>/dev/null; fi
	rm -f $(DESTDIR)$(UNITDIR)/gptrm-coordinator.service $(DESTDIR)$(UNITDIR)/gptrm-agent.service
	rm -f $(DESTDIR)$(SYSUSERSDIR)/gptrm.conf
	rm -rf $(DESTDIR)$(PREFIX)
	-@if [ -z "$(DESTDIR)" ]; then systemctl daemon-reload 2>/dev/null; fi
	@echo "kept $(DESTDIR)$(CONFDIR) and /var/lib/gptrm (configs, certificates, state)"
