"""`orchard tasks build-swe`: mutate real packages, keep the mutations tests catch, validate each task in a sandbox.

Stages, per package: unpack the sdist on the host and list mutation candidates; in one sandbox
from the package's task image run the whole test suite once clean and once per candidate; keep a
candidate when some clean-passing tests fail (FAIL_TO_PASS) and it does not hang; turn it into a
SWE task; then validate every task in a fresh sandbox (set up, FAIL_TO_PASS must fail; gold patch
applied, every listed test must pass) and record the evidence in the task's metadata.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import random
import shlex
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from orchard import errors
from orchard.tasks import grading
from orchard.tasks.images import ImageRecipe, build_image, download, recipes
from orchard.tasks.loaders import DATA_DIR, save_tasks
from orchard.tasks.model import Budget, Setup, SWETask, TestsScoring
from orchard.tasks.outcomes import PASSING, REPORT_DIR, REPORT_PLUGIN, PLUGIN_SOURCE, parse_report
from orchard.tasks.swe.mutate import Mutation, mutations
from orchard.tasks.swe.statements import FailingTest, source_of_test, write_statement
from orchard.tasks.validate import validate_task

PYTEST_ARGV = "python -m pytest -p no:cacheprovider -o addopts='' -q"
# No bytecode: a same-size edit within the same second as a cached run would otherwise load the stale .pyc.
PYTEST = f"PYTHONDONTWRITEBYTECODE=1 {PYTEST_ARGV}"
SKIP_PARTS = {"tests", "test", "testing", "docs", "benchmark", "scripts", "bin"}
SKIP_NAMES = {"setup.py", "conftest.py", "__main__.py", "_version.py", "__about__.py", "version.py.in"}
GIT_ENV = ("GIT_AUTHOR_DATE='2024-01-01T00:00:00Z' GIT_COMMITTER_DATE='2024-01-01T00:00:00Z' "
           "GIT_AUTHOR_NAME=orchard GIT_AUTHOR_EMAIL=orchard@localhost "
           "GIT_COMMITTER_NAME=orchard GIT_COMMITTER_EMAIL=orchard@localhost")


@dataclass
class BuildConfig:
    """Knobs of one suite build."""

    url: Optional[str] = None                  # Orchard Env service (default SANDBOX_BASE_URL)
    out: Path = DATA_DIR / "swe.jsonl.gz"      # the task file written
    packages: list[str] = field(default_factory=list)   # package names (default: every image recipe)
    test_packages: tuple[str, ...] = ("inflection", "parse")   # these go to the test split, the rest to train
    per_package: int = 45                      # tasks kept per package (before validation)
    screen_limit: int = 160                    # candidates tried per package at most
    max_fail_to_pass: int = 40                 # mutations breaking more tests than this are too loud
    max_same_tests: int = 2                    # mutations sharing one FAIL_TO_PASS set kept at most
    pass_to_pass_cap: int = 100                # PASS_TO_PASS ids kept per task (sampled)
    concurrency: int = 2                       # packages screened / tasks validated at once
    screen_timeout: float = 20                 # seconds one mutated suite run may take (a hang is discarded)
    seed: int = 0


@dataclass
class Screened:
    """A candidate the tests caught."""

    mutation: Mutation
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    errors: dict[str, str]


# ------------------------------------------------------------ host side: sources and candidates
def unpack(recipe: ImageRecipe, into: Path) -> Path:
    """The package's sdist unpacked on the host; returns the source root."""
    folder = download(recipe)
    sdist = next(p for p in folder.iterdir() if p.name.endswith(".tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="data")
    return next(p for p in into.iterdir() if p.is_dir())


def mutable_files(root: Path, recipe: ImageRecipe) -> list[str]:
    """Library source files (tests, docs, setup and version files excluded), relative to the root."""
    base = root / recipe.import_root
    found = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(root)
        inner = path.relative_to(base).parts
        if len(inner) < 2 or SKIP_PARTS & set(inner) or path.name in SKIP_NAMES or path.name.startswith("test"):
            continue
        found.append(str(rel))
    return found


def candidates(root: Path, files: list[str], seed: int) -> list[Mutation]:
    """All mutations, interleaved by operator so every operator is represented early."""
    by_op: dict[str, list[Mutation]] = {}
    for rel in files:
        for m in mutations(rel, (root / rel).read_text(encoding="utf-8")):
            by_op.setdefault(m.operator, []).append(m)
    rng = random.Random(seed)
    for group in by_op.values():
        rng.shuffle(group)
    ordered: list[Mutation] = []
    while any(by_op.values()):
        for op in sorted(by_op):
            if by_op[op]:
                ordered.append(by_op[op].pop())
    return ordered


def public_names(root: Path, files: list[str]) -> set[str]:
    """Functions, classes and methods a user of the package can call."""
    names: set[str] = set()
    for rel in files:
        try:
            tree = ast.parse((root / rel).read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                names.add(node.name)
    return names


# ------------------------------------------------------------ sandbox side: screening
def run_suite(sandbox: Any, recipe: ImageRecipe, files: str = "", timeout: float = 120) -> tuple[dict, dict, bool]:
    """(outcomes, error messages, finished) of one pytest run with the report plugin."""
    env = (f"export PYTHONDONTWRITEBYTECODE=1 PYTHONPATH={REPORT_DIR} PYTEST_ADDOPTS='-p {REPORT_PLUGIN}' "
           f"ORCHARD_PYTEST_REPORT={REPORT_DIR}/r.json ORCHARD_PYTEST_DETAILS={REPORT_DIR}/d.json; "
           f"rm -f {REPORT_DIR}/r.json {REPORT_DIR}/d.json; ")
    result = sandbox.exec(f"{env} timeout -s KILL {int(timeout)} {PYTEST_ARGV} {files} >/dev/null 2>&1; "
                          f"echo \"rc=$?\"; cat {REPORT_DIR}/r.json; echo; echo '@@@'; cat {REPORT_DIR}/d.json",
                          timeout=timeout + 60, cwd=recipe.repo_dir)
    head, _, details = result.stdout.partition("@@@")
    status, _, report = head.partition("\n")
    finished = status.strip() not in ("rc=137", "rc=124")
    return parse_report(report), parse_report(details), finished


def screen_one(sandbox: Any, recipe: ImageRecipe, m: Mutation, clean: set[str], timeout: float) -> Optional[Screened]:
    target = f"{recipe.repo_dir}/{m.path}"
    sandbox.upload_content(m.mutated, target)
    try:
        outcomes, messages, finished = run_suite(sandbox, recipe, timeout=timeout)
    finally:
        sandbox.upload_content(m.original, target)
    if not finished or not outcomes:
        return None
    f2p = sorted(t for t in clean if outcomes.get(t) not in PASSING)
    if not f2p:
        return None
    test_files = {t.split("::")[0] for t in f2p}
    p2p = sorted(t for t in clean if t.split("::")[0] in test_files and t not in f2p)
    return Screened(m, f2p, p2p, {t: messages.get(t, "") for t in f2p})


def screen_package(client: Any, recipe: ImageRecipe, cands: list[Mutation], cfg: BuildConfig,
                   log: Any = print) -> tuple[list[Screened], int]:
    """Run the suite per candidate in one sandbox until enough are kept; (kept, candidates tried)."""
    kept: list[Screened] = []
    n = 0
    seen_sets: dict[tuple[str, ...], int] = {}
    with grading.create_task_sandbox(client, _probe_task(recipe)) as sandbox:
        sandbox.upload_content(PLUGIN_SOURCE, f"{REPORT_DIR}/{REPORT_PLUGIN}.py")
        base, _, _ = run_suite(sandbox, recipe)
        clean = {t for t, o in base.items() if o == "passed"}
        if not clean:
            raise errors.TaskError(f"{recipe.image}: the unmutated test suite passed no test ({len(base)} outcomes)")
        for n, m in enumerate(cands[: cfg.screen_limit], 1):
            if n % 25 == 0:
                log(f"{recipe.package}: {n} screened, {len(kept)} kept")
            found = screen_one(sandbox, recipe, m, clean, cfg.screen_timeout)
            if found is None or len(found.fail_to_pass) > cfg.max_fail_to_pass:
                continue
            key = tuple(found.fail_to_pass)
            if seen_sets.get(key, 0) >= cfg.max_same_tests:
                continue
            seen_sets[key] = seen_sets.get(key, 0) + 1
            kept.append(found)
            if len(kept) >= cfg.per_package:
                break
    return kept, n


def _probe_task(recipe: ImageRecipe) -> SWETask:
    return SWETask(instance_id=f"{recipe.package}-probe", repo=recipe.package, problem_statement="-",
                   image=recipe.image, suite="swe-mut")


# ------------------------------------------------------------ tasks
def setup_for(recipe: ImageRecipe, bug_patch: str) -> Setup:
    """Apply the bug, then start a fresh one-commit git history (no trace of the original code)."""
    diff = "/tmp/.orchard_setup/bug.diff"
    commands = [
        f"git apply {diff} && rm -rf /tmp/.orchard_setup",
        "rm -rf .git && git init -q && printf '__pycache__/\\n*.pyc\\n.pytest_cache/\\n*.egg-info/\\n' "
        f">> .git/info/exclude && git add -A && {GIT_ENV} git commit -qm {shlex.quote(recipe.package + ' ' + recipe.version)}",
    ]
    return Setup(files={diff: bug_patch}, commands=commands, workdir=recipe.repo_dir, timeout=120)


def make_task(recipe: ImageRecipe, s: Screened, n: int, split: str, root: Path, public: set[str],
              cap: int, seed: int) -> SWETask:
    iid = f"{recipe.package}__{recipe.package}-mut-{n:04d}"
    p2p = s.pass_to_pass if len(s.pass_to_pass) <= cap else sorted(random.Random(seed + n).sample(s.pass_to_pass, cap))
    files = sorted({t.split("::")[0] for t in s.fail_to_pass})
    failing = [FailingTest(t, source_of_test(_read(root, t.split("::")[0]), t), s.errors.get(t, "")) for t in s.fail_to_pass]
    statement = write_statement(recipe.package, recipe.version, failing, public, seed=iid)
    command = f"{PYTEST} " + " ".join(shlex.quote(f) for f in files)
    return SWETask(
        instance_id=iid, id=iid, suite="swe-mut", split=split, repo=f"pypi/{recipe.package}", version=recipe.version,
        image=recipe.image, problem_statement=statement, patch=s.mutation.gold_patch(), test_patch="",
        FAIL_TO_PASS=s.fail_to_pass, PASS_TO_PASS=p2p, test_command=command,
        setup=setup_for(recipe, s.mutation.bug_patch()), budget=Budget(max_turns=50, max_seconds=1800),
        scoring=TestsScoring(command=command, parser="pytest-json", fail_to_pass=s.fail_to_pass, pass_to_pass=p2p,
                             timeout=300),
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        metadata={"package": recipe.package, "operator": s.mutation.operator, "file": s.mutation.path,
                  "line": s.mutation.line})


def _read(root: Path, rel: str) -> str:
    path = root / rel
    return path.read_text(encoding="utf-8") if path.exists() else ""


# ------------------------------------------------------------ validation
def _validated(client: Any, task: SWETask) -> Optional[SWETask]:
    """The task with its validation evidence in metadata, or None when it is not sound."""
    result = validate_task(client, task)
    if not result.ok:
        return None
    task.metadata["validation"] = result.model_dump(exclude={"task_id", "ok", "reason"})
    return task


# ------------------------------------------------------------ the whole build
def build_package(client: Any, recipe: ImageRecipe, cfg: BuildConfig,
                  log: Any = print) -> tuple[list[SWETask], dict[str, Any]]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = unpack(recipe, Path(tmp))
        files = mutable_files(root, recipe)
        cands = candidates(root, files, cfg.seed)
        screened, tried = screen_package(client, recipe, cands, cfg, log)
        split = "test" if recipe.package in cfg.test_packages else "train"
        public = public_names(root, files)
        tasks = [make_task(recipe, s, n, split, root, public, cfg.pass_to_pass_cap, cfg.seed)
                 for n, s in enumerate(screened)]
    stats = {"candidates": len(cands), "screened": tried, "kept": len(tasks),
             "screen_seconds": round(time.monotonic() - started, 1), "split": split}
    log(f"{recipe.package}: {stats}")
    return tasks, stats


def build(client: Any, cfg: BuildConfig, log: Any = print) -> dict[str, Any]:
    """Build, validate and write the suite; returns the manifest (also written next to the task file)."""
    chosen = [r for r in recipes().values() if not cfg.packages or r.package in cfg.packages]
    for r in chosen:
        build_image(client, r.image)
    with ThreadPoolExecutor(cfg.concurrency) as pool:
        built = list(pool.map(lambda r: build_package(client, r, cfg, log), chosen))
    stats = {r.package: s for r, (_, s) in zip(chosen, built)}
    tasks = [t for ts, _ in built for t in ts]
    log(f"screened: {sum(len(ts) for ts, _ in built)} candidate tasks; validating")
    started = time.monotonic()
    with ThreadPoolExecutor(cfg.concurrency) as pool:
        valid = [t for t in pool.map(lambda t: _validated(client, t), tasks) if t is not None]
    manifest = _manifest(chosen, stats, valid, len(tasks), time.monotonic() - started, cfg)
    save_tasks(valid, cfg.out)
    cfg.out.with_name("swe-manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _manifest(chosen: list[ImageRecipe], stats: dict, valid: list[SWETask], tried: int, seconds: float,
              cfg: BuildConfig) -> dict[str, Any]:
    for r in chosen:
        stats[r.package]["validated"] = sum(t.metadata["package"] == r.package for t in valid)
        stats[r.package]["image"] = r.image
    return {"built_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "tasks": len(valid),
            "validation": {"tried": tried, "passed": len(valid), "seconds": round(seconds, 1)},
            "splits": {s: sum(t.split == s for t in valid) for s in ("train", "test")},
            "packages": stats, "seed": cfg.seed, "per_package": cfg.per_package}
