"""The task model and its loaders: real SWE-bench rows load unchanged from JSONL, Parquet and datasets folders."""

import json

import pytest

from orchard import errors
from orchard.tasks import SWETask, Task, load_tasks, save_tasks
from orchard.tasks.model import CheckerScoring, TestsScoring, task_from_dict

# The SWE-bench layout: FAIL_TO_PASS / PASS_TO_PASS are JSON *strings*, no Orchard fields at all.
SWEBENCH_ROW = {
    "repo": "astropy/astropy", "instance_id": "astropy__astropy-12907",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607", "patch": "diff --git a/x b/x\n",
    "test_patch": "diff --git a/t b/t\n", "problem_statement": "Modeling's separability_matrix is wrong\n",
    "hints_text": "", "created_at": "2022-03-03T15:14:54Z", "version": "4.3",
    "FAIL_TO_PASS": json.dumps(["astropy/modeling/tests/test_separable.py::test_separable[compound_model6]"]),
    "PASS_TO_PASS": json.dumps(["astropy/modeling/tests/test_separable.py::test_coord_matrix"]),
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
}


def check_swebench(task):
    assert isinstance(task, SWETask) and task.id == "astropy__astropy-12907"
    assert task.FAIL_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6]"]
    assert task.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert task.setup.workdir == "/testbed" and task.instruction == task.problem_statement
    assert isinstance(task.scoring, TestsScoring) and task.scoring.parser == "pytest-ra"
    assert task.scoring.command.endswith("; pytest -rA astropy/modeling/tests/test_separable.py")
    assert "conda" not in task.scoring.command or "activate testbed" in task.scoring.command
    assert task.reference == task.patch


def test_swebench_row_becomes_a_swe_task():
    check_swebench(task_from_dict(dict(SWEBENCH_ROW)))


def test_swebench_jsonl_parquet_and_datasets_folder_load_unchanged(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.jsonl").write_text(json.dumps(SWEBENCH_ROW) + "\n\n")
    pq.write_table(pa.Table.from_pylist([SWEBENCH_ROW]), tmp_path / "b.parquet")
    datasets.Dataset.from_list([SWEBENCH_ROW]).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"test": datasets.Dataset.from_list([SWEBENCH_ROW])}).save_to_disk(str(tmp_path / "dd"))
    for path in ("a.jsonl", "b.parquet", "ds", "dd"):
        (task,) = load_tasks(tmp_path / path)
        check_swebench(task)


def terminal_task():
    return Task(id="t1", instruction="do it", scoring=CheckerScoring(script="true"), reference="echo hi",
                metadata={"category": "files", "n": 1})


@pytest.mark.parametrize("name", ["tasks.jsonl", "tasks.jsonl.gz", "tasks.parquet"])
def test_orchard_tasks_round_trip(tmp_path, name):
    swe = task_from_dict(dict(SWEBENCH_ROW))
    path = save_tasks([terminal_task(), swe], tmp_path / name)
    loaded = load_tasks(path)
    assert [t.model_dump() for t in loaded] == [terminal_task().model_dump(), swe.model_dump()]


def test_a_folder_of_jsonl_files_loads(tmp_path):
    save_tasks([terminal_task()], tmp_path / "part" / "x.jsonl")
    assert [t.id for t in load_tasks(tmp_path)] == ["t1"]


def test_bad_input_gives_clear_errors(tmp_path):
    with pytest.raises(errors.TaskError, match="No task file"):
        load_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(errors.TaskError, match="bad.jsonl:1: not JSON"):
        load_tasks(tmp_path / "bad.jsonl")
    (tmp_path / "bad2.jsonl").write_text(json.dumps({"id": "x"}) + "\n")
    with pytest.raises(errors.TaskError, match="row 0 is not a valid task"):
        load_tasks(tmp_path / "bad2.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(errors.TaskError, match="unknown task file type"):
        load_tasks(tmp_path / "x.csv")
    with pytest.raises(ValueError):
        Task(id="t", instruction="x", scoring={"kind": "tests", "command": "pytest"}, unknown_field=1)
