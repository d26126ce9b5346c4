"""Judge scoring against the project's scripted model server: verdicts, retries, malformed and unreachable judges,
and a terminal-style task graded by the judge in a real sandbox (sync, async and through the rollout engine)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from pydantic import ValidationError

from orchard import AsyncSandboxClient, errors
from orchard.inference import api, scripted
from orchard.rollout.tasks import SuiteTask
from orchard.tasks import grade_sandbox, prepare_sandbox
from orchard.tasks.judge import agrade_judge, grade_judge, parse_verdict
from orchard.tasks.model import JudgeScoring, Setup, Task
from tests.proxy.conftest import serve_in_thread

SEEN: list[str] = []      # every user prompt the judge received, newest last


def _text(message) -> str:
    content = message.content
    return " ".join(str(p.get("text", "")) for p in content) if isinstance(content, list) else (content or "")


def judge_policy(request):
    """A deterministic judge: the instruction's CASE marker picks the behaviour; 'evidence' reads the evidence."""
    prompt = _text(request.messages[1])
    SEEN.append(prompt)
    retried = len(request.messages) > 2
    if "CASE:pass" in prompt:
        return '{"score": 0.9, "reasons": "meets the rubric"}'
    if "CASE:fail" in prompt:
        return 'Verdict: {"score": 0.2, "reasons": "misses the point"}'
    if "CASE:malformed" in prompt:
        return '{"score": "high", "reasons": "no number"}' if retried else "Looks good to me!"
    if "CASE:retry" in prompt:
        return '```json\n{"score": 1, "reasons": "fixed"}\n```' if retried else "{score: 1}"
    evidence = prompt.split("## Evidence of the agent's work", 1)[-1]
    good = "hello judge" in evidence and "(missing" not in evidence
    return {"content": '{"score": %d, "reasons": "evidence checked"}' % good}


@pytest.fixture(scope="module")
def judge_url():
    from orchard.inference.weights import load_tokenizer

    engine = scripted.ScriptedEngine(load_tokenizer(), policy=judge_policy, max_context=32768)
    server, thread, url = serve_in_thread(api.create_app(engine))
    yield url + "/v1"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def sandbox(env_url):
    from orchard import SandboxClient

    with SandboxClient(base_url=env_url) as c, c.create_sandbox("host") as box:
        box.exec("mkdir -p /workspace && echo 'hello judge' > /workspace/out.txt")
        yield box


def judged(case: str, **scoring) -> Task:
    scoring.setdefault("files", ["out.txt"])
    return Task(id=f"judge-{case}", instruction=f"Write a greeting into out.txt. CASE:{case}",
                scoring=JudgeScoring(rubric="The file greets the judge.", **scoring))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_passing_verdict_is_resolved_with_the_score_as_reward(sandbox, judge_url):
    result = grade_judge(sandbox, judged("pass", reference_answer="hello judge"), url=judge_url, model="judge")
    assert result.status == "resolved" and result.reward == 0.9 and result.kind == "judge"
    assert "meets the rubric" in result.output
    assert "## Reference answer\nhello judge" in SEEN[-1] and "### File out.txt\n```\nhello judge" in SEEN[-1]


def test_failing_verdict_below_threshold_is_unresolved(sandbox, judge_url):
    result = grade_judge(sandbox, judged("fail", threshold=0.3), url=judge_url, model="judge")
    assert result.status == "unresolved" and result.reward == 0.2 and not result.resolved


def test_threshold_decides_resolved(sandbox, judge_url):
    result = grade_judge(sandbox, judged("fail", threshold=0.2), url=judge_url, model="judge")
    assert result.status == "resolved" and result.reward == 0.2


def test_malformed_replies_after_every_attempt_are_a_grader_error(sandbox, judge_url):
    before = len(SEEN)
    result = grade_judge(sandbox, judged("malformed", attempts=3), url=judge_url, model="judge")
    assert result.status == "error" and result.reward is None
    assert "3 attempt(s)" in result.error and "not a number" in result.error
    assert len(SEEN) - before == 3


def test_a_malformed_reply_is_retried_with_the_bad_reply_shown(sandbox, judge_url):
    result = grade_judge(sandbox, judged("retry"), url=judge_url, model="judge")
    assert result.status == "resolved" and result.reward == 1.0 and "attempts 2" in result.output


def test_unreachable_judge_is_a_grader_error(sandbox):
    result = grade_judge(sandbox, judged("pass", attempts=2), url=f"http://127.0.0.1:{free_port()}/v1", model="j")
    assert result.status == "error" and result.reward is None and "cannot reach the judge" in result.error


def test_judge_http_error_is_a_grader_error(sandbox, judge_url):
    result = grade_judge(sandbox, judged("pass", attempts=1), url=judge_url + "/nowhere", model="judge")
    assert result.status == "error" and "HTTP 404" in result.error


def test_endpoint_comes_from_the_environment_and_missing_config_is_an_error(sandbox, judge_url, monkeypatch):
    monkeypatch.delenv("ORCHARD_JUDGE_URL", raising=False)
    monkeypatch.delenv("ORCHARD_JUDGE_MODEL", raising=False)
    missing = grade_judge(sandbox, judged("pass"))
    assert missing.status == "error" and "ORCHARD_JUDGE_URL" in missing.error
    monkeypatch.setenv("ORCHARD_JUDGE_URL", judge_url)
    monkeypatch.setenv("ORCHARD_JUDGE_MODEL", "judge")
    assert grade_sandbox(sandbox, judged("pass")).reward == 0.9


def test_missing_file_is_shown_as_missing_and_judged(sandbox, judge_url):
    result = grade_judge(sandbox, judged("evidence", files=["/workspace/nope.txt"]), url=judge_url, model="judge")
    assert result.status == "unresolved" and result.reward == 0.0
    assert "### File /workspace/nope.txt\n(missing" in SEEN[-1]


@pytest.mark.parametrize("text, score", [('{"score": 0.5}', 0.5), ('x {"a": 1} {"score": 1, "reasons": "y"}', 1.0),
                                         ('```json\n{"score": 0, "reasons": "n"}\n```', 0.0)])
def test_parse_verdict_finds_the_verdict_object(text, score):
    assert parse_verdict(text).score == score


@pytest.mark.parametrize("text", ["", "no json", '{"score": 1.5}', '{"score": true}', '{"reasons": "x"}', "{bad"])
def test_parse_verdict_rejects_what_is_not_a_verdict(text):
    with pytest.raises(ValueError):
        parse_verdict(text)


def test_judge_scoring_needs_evidence():
    with pytest.raises(ValidationError, match="needs evidence"):
        JudgeScoring(rubric="r")


def terminal_task() -> Task:
    """A terminal-style task in a git workdir: the judge sees the diff, the file and a command's output."""
    setup = Setup(commands=[
        "git init -q . && git config user.email t@t && git config user.name t",
        "echo draft > notes.txt && git add -A && git commit -qm init"])
    scoring = JudgeScoring(rubric="greeting.txt says hello judge.", diff=True, files=["greeting.txt"],
                           commands=["wc -l greeting.txt"], threshold=1.0)
    return Task(id="judge-e2e", instruction="Create greeting.txt saying hello judge.", setup=setup,
                scoring=scoring, reference="echo 'hello judge' > greeting.txt")


def test_terminal_task_judged_end_to_end_in_a_real_sandbox(client, judge_url):
    task = terminal_task()
    with prepare_sandbox(client, task) as box:
        assert grade_sandbox(box, task, url=judge_url, model="judge").status == "unresolved"   # nothing done yet
        assert "(missing" in SEEN[-1] and "(no changes)" in SEEN[-1]
        box.exec(task.reference, cwd=task.setup.workdir)
        result = grade_sandbox(box, task, url=judge_url, model="judge")
    assert result.status == "resolved" and result.reward == 1.0
    assert "+hello judge" in SEEN[-1] and "### Command `wc -l greeting.txt` (exit code 0)" in SEEN[-1]


def test_async_twin_and_engine_path_grade_the_same_task(env_url, judge_url, monkeypatch):
    monkeypatch.setenv("ORCHARD_JUDGE_URL", judge_url)
    monkeypatch.setenv("ORCHARD_JUDGE_MODEL", "judge")

    async def run():
        suite = SuiteTask(terminal_task())
        async with AsyncSandboxClient(base_url=env_url) as c:
            box = await suite.create(c)
            try:
                await suite.setup(box)
                await box.exec(suite.task.reference, cwd=suite.workdir)
                direct = await agrade_judge(box, suite.task)
                grade = await suite.grade(c, box, "")
            finally:
                await box.delete()
        return direct, grade

    direct, grade = asyncio.run(run())
    assert direct.status == "resolved" and grade.reward == 1.0 and grade.resolved


def test_engine_raises_grader_error_when_the_judge_is_unreachable(env_url, monkeypatch):
    monkeypatch.setenv("ORCHARD_JUDGE_URL", f"http://127.0.0.1:{free_port()}/v1")
    monkeypatch.setenv("ORCHARD_JUDGE_MODEL", "judge")
    task = terminal_task()
    task.scoring.attempts = 1

    async def run():
        suite = SuiteTask(task)
        async with AsyncSandboxClient(base_url=env_url) as c:
            box = await suite.create(c)
            try:
                await suite.setup(box)
                await suite.grade(c, box, "")
            finally:
                await box.delete()

    with pytest.raises(errors.GraderError, match="cannot reach the judge"):
        asyncio.run(run())
