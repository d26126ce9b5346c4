# Orchard: `make install` sets everything up, `make demo` shows the main job, `make test` is what CI runs.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
APT_PKGS := bubblewrap gcc libc6-dev git iproute2 util-linux podman runc busybox-static redis-server

.PHONY: install apt venv demo test test-slow bench stress report doctor clean

install: apt venv

apt:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(BIN)/orchard

$(BIN)/orchard: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: install
	$(BIN)/orchard env demo

test: install
	$(BIN)/python -m pytest -q

test-slow: install
	$(BIN)/python -m pytest -q -m slow

bench: install
	$(BIN)/orchard env bench --sandboxes 1000 --execs-per-sandbox 4

stress: install
	$(BIN)/orchard env stress --mode all

report: install
	$(BIN)/orchard env report --output docs/env-report.md

doctor: install
	$(BIN)/orchard env doctor

clean:
	rm -rf $(VENV) build dist src/*.egg-info
