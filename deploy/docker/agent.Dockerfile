# syntax=docker/dockerfile:1
# The agent image: the init container of every sandbox pod copies /opt/orchard-agent (a self-contained Python and
# the agent package) into the pod's shared volume, so the agent runs in any image, even one with no Python or glibc.
# Build from the repository root:  docker build -f deploy/docker/agent.Dockerfile -t orchard/agent:0.1.0 .

FROM python:3.11-slim-bookworm AS bundle
RUN apt-get update && apt-get install -y --no-install-recommends patchelf binutils && rm -rf /var/lib/apt/lists/*
COPY deploy/docker/bundle-python.sh /usr/local/bin/bundle-python
# The interpreter, its standard library and every shared library it loads (glibc and the loader included).
RUN sh /usr/local/bin/bundle-python /usr/local/bin/python3.11 /opt/orchard-agent/python
# The agent (standard library only) as the package orchard_agent on /opt/orchard-agent/lib.
COPY src/orchard/env/agent/ /opt/orchard-agent/lib/orchard_agent/
# Bytecode now: the sandbox mounts the copy read-only, so nothing could be cached there later.
RUN /opt/orchard-agent/python/bin/python3 -I -m compileall -q /opt/orchard-agent/lib /opt/orchard-agent/python/lib
# Prove it needs nothing from this image: every shared object it maps, after the imports the agent makes, is its own.
RUN /opt/orchard-agent/python/bin/python3 -I -c "import ssl, json, ctypes, hashlib, socket, subprocess, pty, select; \
maps = {line.split()[-1] for line in open('/proc/self/maps') if '.so' in line}; \
outside = sorted(m for m in maps if not m.startswith('/opt/orchard-agent/')); \
assert not outside, outside; print(len(maps), 'shared objects, all from the bundle')"

# Nothing but the bundle: no shell, no package manager. It runs as root only to write the copy; the pod drops
# every capability and forbids privilege escalation.
FROM scratch
COPY --from=bundle /opt/orchard-agent /opt/orchard-agent
ENTRYPOINT ["/opt/orchard-agent/python/bin/python3", "-I", "-c", "import sys; sys.path.insert(0, '/opt/orchard-agent/lib'); from orchard_agent.install import main; main()"]
