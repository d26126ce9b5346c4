# syntax=docker/dockerfile:1
# The Orchard Env service image (ORCHARD_BACKEND=kubernetes, ORCHARD_STORE=redis in the Helm chart), as a non-root user.
# Build from the repository root:  docker build -f deploy/docker/service.Dockerfile -t orchard/service:0.1.0 .

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src/ src/
RUN python3.11 -m venv /opt/orchard && /opt/orchard/bin/pip install --no-cache-dir ".[server,k8s]"

FROM python:3.11-slim-bookworm
ENV PATH=/opt/orchard/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /opt/orchard /opt/orchard
RUN groupadd --gid 10001 orchard && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin orchard \
    && mkdir -p /var/lib/orchard && chown 10001:10001 /var/lib/orchard
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["orchard", "env", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8080"]
