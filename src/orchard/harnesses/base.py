"""The harness adapter protocol: what a harness needs to be installed, launched, pointed at the proxy and judged."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional, Protocol
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field

TOOLS_MOUNT = "/opt/orchard/tools"
"""Where the tools folder appears, read-only, inside every sandbox (ORCHARD_TOOLS_DIR on the service)."""
RUN_DIR = "/tmp/orchard-harness"
"""Scratch directory inside the sandbox for a harness's config, home and logs (never under the task's workdir)."""
TAIL_CHARS = 4000
PROXY_LIMIT_MARKS = ("session_limit_reached", "limit reached", "is limit_reached")
"""How the proxy's refusal past a session limit shows in a harness's output (its error code and message)."""

Dialect = Literal["openai_chat", "openai_responses", "anthropic_messages"]
Reason = Literal["done", "budget", "error"]


class Endpoint(BaseModel):
    """How a harness inside the sandbox reaches its proxy session: the forwarded loopback port and the session key."""

    model_config = ConfigDict(extra="forbid")

    port: int = Field(ge=1, le=65535, description="The sandbox's model-endpoint port (forwarded to the proxy).")
    key: str = Field(min_length=1, description="The proxy session key; the harness sends it as its API key.")
    model: str = Field("orchard", min_length=1, description="Model name the harness asks for (the proxy maps it upstream).")
    base_urls: dict[str, str] = Field(description="The proxy's base URL per dialect, as POST /sessions returned them.")

    def url(self, dialect: Dialect) -> str:
        """The dialect's base URL as seen from inside the sandbox: same path, host 127.0.0.1:<port>."""
        if dialect not in self.base_urls:
            raise ValueError(f"the proxy session gave no base URL for {dialect} (has: {sorted(self.base_urls)})")
        parts = urlsplit(self.base_urls[dialect])
        return urlunsplit(("http", f"127.0.0.1:{self.port}", parts.path.rstrip("/"), "", ""))

    @classmethod
    def from_session(cls, session: dict, port: int, model: str = "orchard") -> "Endpoint":
        """Build from a proxy ``POST /sessions`` reply (``key`` and ``base_urls``)."""
        return cls(port=port, key=session["key"], model=model, base_urls=session["base_urls"])


class Budget(BaseModel):
    """How far a run may go before it is stopped; the proxy session's own limits apply on top."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(30, gt=0, description="Model calls (agent steps) the harness may make, where it can count them.")
    timeout_s: float = Field(900.0, gt=0, description="Wall-clock seconds for the whole run; past it the run is killed.")


class Launch(BaseModel):
    """One non-interactive run of a harness: files to write first, then a command."""

    model_config = ConfigDict(extra="forbid")

    argv: list[str] = Field(min_length=1, description="The command, run as argv (no shell).")
    env: dict[str, str] = Field(default_factory=dict, description="Environment added to the sandbox's.")
    files: dict[str, str] = Field(default_factory=dict, description="Files (path inside the sandbox → text) written before the run.")
    cwd: str = Field("/workspace", description="Where the harness starts (the task's working tree).")
    report_file: Optional[str] = Field(None, description="A file the harness writes that says how it ended (read after the run).")


class HarnessResult(BaseModel):
    """How a harness run ended."""

    model_config = ConfigDict(extra="forbid")

    harness: str = Field(description="The adapter's name.")
    reason: Reason = Field(description="done: the harness finished on its own; budget: a step, call, token or time limit "
                                       "stopped it; error: it failed (bad config, crash, model or proxy error).")
    exit_code: Optional[int] = Field(description="The harness process's exit code (124: killed at the wall-clock limit).")
    detail: str = Field("", description="One line saying why, for people reading results.")
    stdout_tail: str = Field("", description="The last characters of its standard output.")
    stderr_tail: str = Field("", description="The last characters of its standard error.")
    seconds: float = Field(0.0, description="Wall-clock duration of the run.")


class Harness(Protocol):
    """An adapter: one per harness (codex.py, claude_code.py, opencode.py, mini_swe_agent.py, minimal.py)."""

    name: str
    """Short name used on the command line (`orchard harness run --harness NAME`)."""
    dialect: Dialect
    """The model API the harness speaks."""

    def install(self, tools_dir: Path) -> None:
        """Install into the tools folder (idempotent); afterwards ``<tools_dir>/bin/<command>`` runs it."""

    def installed(self, tools_dir: Path) -> bool:
        """Whether install() has completed for the pinned version."""

    def launch(self, instruction: str, endpoint: Endpoint, budget: Budget, workdir: str) -> Launch:
        """The files and command that run the harness once, non-interactively, on ``instruction``."""

    def outcome(self, exit_code: Optional[int], stdout: str, stderr: str, report: str = "") -> tuple[Reason, str]:
        """Judge a finished run from what it printed and its report file ("" if none): (reason, one-line detail)."""


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    """The last ``limit`` characters of ``text``."""
    return text[-limit:]


def tool(name: str) -> str:
    """Absolute path of a tools-folder command inside the sandbox."""
    return f"{TOOLS_MOUNT}/bin/{name}"


def proxy_limit(*texts: str) -> Optional[str]:
    """The line where a harness reported the proxy's session-limit error (code ``session_limit_reached``), if any."""
    for text in texts:
        for line in text[-20000:].splitlines():
            if any(mark in line for mark in PROXY_LIMIT_MARKS):
                return line.strip()[:300]
    return None


def error_or_budget(detail: str, *texts: str) -> tuple[Reason, str]:
    """A failed run is "budget" when the proxy ended the session at one of its limits, else "error"."""
    limit = proxy_limit(*texts)
    return ("budget", f"the proxy session's limit: {limit}") if limit else ("error", detail)


def exit_outcome(exit_code: Optional[int], stdout: str, stderr: str) -> tuple[Reason, str]:
    """The judgement shared by harnesses that exit 0 when done and non-zero on failure."""
    if exit_code == 124:
        return "budget", "killed at the wall-clock limit"
    if exit_code == 0:
        return "done", "the harness finished"
    last = (stderr.strip() or stdout.strip()).splitlines()[-1:] or [""]
    return error_or_budget(f"exit code {exit_code}: {last[0][:300]}", stdout, stderr)
