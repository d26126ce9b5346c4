"""The in-pod agent's wire constants, shared with the Kubernetes backend (standard library only).

The agent runs inside every Kubernetes sandbox as the container's main process, on an interpreter
the init container brought along, so this package imports nothing outside the standard library and
nothing from the rest of Orchard: the backend imports these names from here, never the reverse.
"""

HOME = "/opt/orchard-agent"                  # read-only volume in the sandbox: interpreter + this package
PYTHON = HOME + "/python/bin/python3"        # the self-contained interpreter inside HOME
LIB = HOME + "/lib"                          # sys.path entry holding this package as ``orchard_agent``
PACKAGE = "orchard_agent"                    # the name this package is installed under in LIB
TOKEN_DIR = "/run/orchard-agent"             # in-memory volume holding the token file until the agent reads it
TOKEN_FILE = TOKEN_DIR + "/token"
TOKEN_ENV = "ORCHARD_AGENT_TOKEN"            # the init container's env (from the sandbox's Secret)
PORT_ENV = "ORCHARD_AGENT_PORT"
TOKEN_FILE_ENV = "ORCHARD_AGENT_TOKEN_FILE"
RELAY_ENV = "ORCHARD_AGENT_RELAY"            # the model-endpoint relay, PORT=ADDR:PORT[,...] (relay.py); optional
DEFAULT_PORT = 7070
TOKEN_HEADER = "X-Orchard-Agent-Token"
PRIVATE_ENV = (TOKEN_ENV, PORT_ENV, TOKEN_FILE_ENV, RELAY_ENV)   # never passed on to commands

HEALTH = "/healthz"       # GET, no token: 200 once the agent listens (the readiness probe)
INFO = "/v1/info"         # GET -> json {workdir, has_bash, pid}
EXEC = "/v1/exec"         # POST json {argv, cwd, env, timeout, output_limit} -> json outcome
FILE = "/v1/file"         # GET ?path=&limit= -> bytes; PUT ?path=&mode= body -> 204
LIST = "/v1/list"         # GET ?path= -> json [{name, type, size, modified}]
PTY = "/v1/pty"           # POST json {argv, cwd, env, rows, cols} -> 200 then the raw terminal stream
PTY_CONTROL = "/v1/pty/"  # POST /v1/pty/<id>/{resize,signal,kill}; GET /v1/pty/<id>/wait?timeout=

# error kinds of a JSON error reply {"error": kind, "message": ...}
NOT_FOUND, BAD_REQUEST, TOO_LARGE, UNAUTHORIZED, FORBIDDEN = "not_found", "bad_request", "too_large", \
    "unauthorized", "forbidden"


def boot_code(entry: str) -> str:
    """The ``python -I -c`` program that runs ``orchard_agent.<entry>.main()`` from LIB."""
    return f"import sys; sys.path.insert(0, {LIB!r}); from {PACKAGE}.{entry} import main; main()"
