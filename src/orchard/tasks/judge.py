"""Judge scoring: show a judge model the agent's work and a rubric, and turn its JSON verdict into a grade.

The judge is any OpenAI-compatible ``/v1/chat/completions`` endpoint. Its URL and model come from the grading
call, else the task's scoring, else ``$ORCHARD_JUDGE_URL`` / ``$ORCHARD_JUDGE_MODEL`` (``$ORCHARD_JUDGE_API_KEY``
is sent as a bearer token when set). A judge that cannot be reached, or whose replies never hold a valid
verdict within ``attempts`` requests, gives status ``error`` (the grader failed), never a model failure.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass
from typing import Any, Generator, Optional

import httpx

from orchard import errors
from orchard.tasks import outcomes as oc
from orchard.tasks.model import AnyTask, JudgeScoring

SYSTEM_PROMPT = (
    "You are a strict grader. You are given a task an agent was asked to do, a rubric, optionally a reference "
    "answer, and evidence of what the agent produced. Judge only the evidence against the rubric. Reply with "
    'exactly one JSON object and nothing else: {"score": <number from 0 to 1>, "reasons": "<one short paragraph>"}.'
)
RETRY_PROMPT = ('That reply is not a valid verdict ({problem}). Reply with only the JSON object '
                '{{"score": <number from 0 to 1>, "reasons": "..."}}.')
DIFF_COMMAND = "git add -A >/dev/null 2>&1; git diff --cached --binary HEAD"


@dataclass(frozen=True)
class Endpoint:
    """Where the judge is asked: base URL (ending in /v1), model name, optional API key."""

    url: str
    model: str
    api_key: Optional[str] = None


@dataclass(frozen=True)
class Verdict:
    score: float
    reasons: str


# ------------------------------------------------------------ no I/O
def scoring_of(task: AnyTask) -> JudgeScoring:
    if not isinstance(task.scoring, JudgeScoring):
        raise errors.TaskError(f"task {task.id}: scored by {task.scoring.kind}, not by a judge")
    return task.scoring


def resolve_endpoint(scoring: JudgeScoring, url: Optional[str] = None, model: Optional[str] = None,
                     api_key: Optional[str] = None) -> Endpoint:
    """Call arguments first, then the scoring config, then the environment; GraderError when one is missing."""
    url = url or scoring.url or os.environ.get("ORCHARD_JUDGE_URL")
    model = model or scoring.model or os.environ.get("ORCHARD_JUDGE_MODEL")
    if not url or not model:
        raise errors.GraderError("no judge configured: give url and model (scoring config, grading arguments, "
                                 "or ORCHARD_JUDGE_URL / ORCHARD_JUDGE_MODEL)")
    return Endpoint(url=url.rstrip("/"), model=model, api_key=api_key or os.environ.get("ORCHARD_JUDGE_API_KEY"))


def file_command(path: str, max_chars: int) -> str:
    """Print a file's last max_chars bytes, or exit 3 when it is not a readable file."""
    q = shlex.quote(path)
    return f"if [ -f {q} ] && [ -r {q} ]; then tail -c {max_chars} -- {q}; else exit 3; fi"


def evidence_commands(scoring: JudgeScoring) -> list[tuple[str, str]]:
    """(title, command) for every file and command the judge should see, in the order shown."""
    items = [(f"File {path}", file_command(path, scoring.max_chars)) for path in scoring.files]
    return items + [(f"Command `{command}`", command) for command in scoring.commands]


def render_evidence(title: str, exit_code: Optional[int], output: str, scoring: JudgeScoring) -> str:
    """One evidence section; a missing file is shown as missing (the agent's failure, not the grader's)."""
    if title.startswith("File ") and exit_code == 3:
        return f"### {title}\n(missing: no such readable file)"
    body = oc.tail(output, scoring.max_chars)
    head = f"### {title} (exit code {exit_code})" if title.startswith("Command") else f"### {title}"
    return f"{head}\n```\n{body}\n```"


def build_messages(task: AnyTask, sections: list[str]) -> list[dict[str, str]]:
    """The system rule and one user message: instruction, rubric, reference answer, evidence."""
    scoring = scoring_of(task)
    parts = [f"## Task given to the agent\n{task.instruction}", f"## Rubric\n{scoring.rubric}"]
    if scoring.reference_answer:
        parts.append(f"## Reference answer\n{scoring.reference_answer}")
    parts.append("## Evidence of the agent's work\n" + ("\n\n".join(sections) or "(none)"))
    parts.append('Reply with only {"score": <0..1>, "reasons": "..."}.')
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]


def parse_verdict(text: Optional[str]) -> Verdict:
    """The first JSON object holding a numeric score in [0, 1]; ValueError saying what is wrong otherwise."""
    if not text or not text.strip():
        raise ValueError("empty reply")
    decoder = json.JSONDecoder()
    start = text.find("{")
    problem = "no JSON object"
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            try:
                return _checked(value)
            except ValueError as e:
                problem = str(e)
        start = text.find("{", start + 1)
    raise ValueError(problem)


def _checked(value: dict[str, Any]) -> Verdict:
    score = value.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise ValueError("score missing or not a number")
    if not 0 <= score <= 1:
        raise ValueError(f"score {score} outside 0..1")
    reasons = value.get("reasons", "")
    return Verdict(score=float(score), reasons=reasons if isinstance(reasons, str) else json.dumps(reasons))


def request_body(endpoint: Endpoint, messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": endpoint.model, "messages": messages, "temperature": 0, "max_tokens": 1024}


def headers(endpoint: Endpoint) -> dict[str, str]:
    return {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}


def reply_text(response: httpx.Response) -> str:
    """The first choice's content; GraderError for an HTTP error or a body that is not a chat completion."""
    if response.status_code >= 400:
        raise errors.GraderError(f"judge answered HTTP {response.status_code}: {oc.tail(response.text, 300)}")
    try:
        return response.json()["choices"][0]["message"].get("content") or ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise errors.GraderError(f"judge reply is not a chat completion: {oc.tail(response.text, 300)}") from e


def next_messages(messages: list[dict[str, str]], reply: str, problem: str) -> list[dict[str, str]]:
    """The conversation for the next attempt: the bad reply and a request for just the verdict."""
    return messages + [{"role": "assistant", "content": reply},
                       {"role": "user", "content": RETRY_PROMPT.format(problem=problem)}]


def result(task: AnyTask, verdict: Verdict, attempts: int, started: float,
           patch_applied: Optional[bool] = None) -> oc.GradeResult:
    scoring = scoring_of(task)
    status = "resolved" if verdict.score >= scoring.threshold else "unresolved"
    return oc.GradeResult(task_id=task.id, status=status, reward=verdict.score, kind="judge",
                          patch_applied=patch_applied, output=f"judge score {verdict.score} "
                          f"(threshold {scoring.threshold}, attempts {attempts}): {oc.tail(verdict.reasons, 3000)}",
                          seconds=round(time.monotonic() - started, 3))


def error_result(task: AnyTask, error: BaseException, started: float) -> oc.GradeResult:
    return oc.GradeResult(task_id=task.id, status="error", reward=None, kind="judge",
                          error=f"{type(error).__name__}: {error}", seconds=round(time.monotonic() - started, 3))


def _failure(attempts: int, problem: str) -> errors.GraderError:
    return errors.GraderError(f"judge gave no valid verdict in {attempts} attempt(s); last problem: {problem}")


# ------------------------------------------------------------ sync
def collect_evidence(sandbox: Any, task: AnyTask, patch: Optional[str] = None) -> list[str]:
    """The evidence sections the scoring asks for, read from the sandbox (the diff: `patch` when given)."""
    scoring = scoring_of(task)
    sections = []
    if scoring.diff:
        if patch is None:
            patch = _diff(task, sandbox.exec(DIFF_COMMAND, timeout=scoring.timeout, cwd=task.setup.workdir))
        sections.append(f"### Diff of the workdir\n```diff\n{oc.tail(patch, scoring.max_chars) or '(no changes)'}\n```")
    for title, command in evidence_commands(scoring):
        run = sandbox.exec(command, timeout=scoring.timeout, cwd=task.setup.workdir)
        sections.append(render_evidence(title, run.exit_code, run.stdout + run.stderr, scoring))
    return sections


def _diff(task: AnyTask, run: Any) -> str:
    if run.exit_code != 0:
        raise errors.TaskError(f"task {task.id}: git diff failed in {task.setup.workdir}: {oc.tail(run.stderr, 500)}")
    return run.stdout


def _ask_flow(endpoint: Endpoint, messages: list[dict[str, str]], attempts: int) -> Generator[dict, Any, tuple[Verdict, int]]:
    """The asking, free of I/O: yields each request body, is sent the reply (or the transport error) back."""
    problem = "no attempt made"
    for attempt in range(1, attempts + 1):
        outcome = yield request_body(endpoint, messages)
        try:
            if isinstance(outcome, Exception):
                raise outcome
            reply = reply_text(outcome)
        except httpx.HTTPError as e:
            problem = f"cannot reach the judge at {endpoint.url}: {type(e).__name__}: {e}"
            continue
        except errors.GraderError as e:
            problem = str(e)
            continue
        try:
            return parse_verdict(reply), attempt
        except ValueError as e:
            problem = f"{e}; reply: {oc.tail(reply, 200)!r}"
            messages = next_messages(messages, reply, str(e))
    raise _failure(attempts, problem)


def ask_judge(endpoint: Endpoint, messages: list[dict[str, str]], attempts: int, timeout: float) -> tuple[Verdict, int]:
    """The verdict and the attempt it came on; GraderError when the judge is unreachable or never valid."""
    flow = _ask_flow(endpoint, messages, attempts)
    with httpx.Client(timeout=timeout) as http:
        body = next(flow)
        while True:
            try:
                outcome: Any = http.post(f"{endpoint.url}/chat/completions", json=body, headers=headers(endpoint))
            except httpx.HTTPError as e:
                outcome = e
            try:
                body = flow.send(outcome)
            except StopIteration as stop:
                return stop.value


def grade_judge(sandbox: Any, task: AnyTask, *, patch: Optional[str] = None, url: Optional[str] = None,
                model: Optional[str] = None, api_key: Optional[str] = None,
                patch_applied: Optional[bool] = None) -> oc.GradeResult:
    """Grade the sandbox's state by asking the judge; status error when the sandbox or the judge fails."""
    started = time.monotonic()
    scoring = scoring_of(task)
    try:
        endpoint = resolve_endpoint(scoring, url, model, api_key)
        messages = build_messages(task, collect_evidence(sandbox, task, patch))
        verdict, attempts = ask_judge(endpoint, messages, scoring.attempts, scoring.timeout)
    except errors.OrchardError as e:
        return error_result(task, e, started)
    return result(task, verdict, attempts, started, patch_applied)


# ------------------------------------------------------------ async twins
async def acollect_evidence(sandbox: Any, task: AnyTask, patch: Optional[str] = None) -> list[str]:
    """Async twin of collect_evidence."""
    scoring = scoring_of(task)
    sections = []
    if scoring.diff:
        if patch is None:
            patch = _diff(task, await sandbox.exec(DIFF_COMMAND, timeout=scoring.timeout, cwd=task.setup.workdir))
        sections.append(f"### Diff of the workdir\n```diff\n{oc.tail(patch, scoring.max_chars) or '(no changes)'}\n```")
    for title, command in evidence_commands(scoring):
        run = await sandbox.exec(command, timeout=scoring.timeout, cwd=task.setup.workdir)
        sections.append(render_evidence(title, run.exit_code, run.stdout + run.stderr, scoring))
    return sections


async def aask_judge(endpoint: Endpoint, messages: list[dict[str, str]], attempts: int,
                     timeout: float) -> tuple[Verdict, int]:
    """Async twin of ask_judge."""
    flow = _ask_flow(endpoint, messages, attempts)
    async with httpx.AsyncClient(timeout=timeout) as http:
        body = next(flow)
        while True:
            try:
                outcome: Any = await http.post(f"{endpoint.url}/chat/completions", json=body, headers=headers(endpoint))
            except httpx.HTTPError as e:
                outcome = e
            try:
                body = flow.send(outcome)
            except StopIteration as stop:
                return stop.value


async def agrade_judge(sandbox: Any, task: AnyTask, *, patch: Optional[str] = None, url: Optional[str] = None,
                       model: Optional[str] = None, api_key: Optional[str] = None,
                       patch_applied: Optional[bool] = None) -> oc.GradeResult:
    """Async twin of grade_judge."""
    started = time.monotonic()
    scoring = scoring_of(task)
    try:
        endpoint = resolve_endpoint(scoring, url, model, api_key)
        messages = build_messages(task, await acollect_evidence(sandbox, task, patch))
        verdict, attempts = await aask_judge(endpoint, messages, scoring.attempts, scoring.timeout)
    except errors.OrchardError as e:
        return error_result(task, e, started)
    return result(task, verdict, attempts, started, patch_applied)
