"""`orchard tasks ...` through the real command parser."""

from orchard.cli import main


def test_list_prints_tasks_and_counts(capsys):
    assert main(["tasks", "list", "terminal", "--split", "test"]) == 0
    out, err = capsys.readouterr()
    assert "terminal/files-tar-archive" in out and "checker" in out
    assert "tasks (test:" in err


def test_validate_checks_tasks_in_sandboxes_and_records_evidence(env_url, capsys, tmp_path):
    record = tmp_path / "checked.jsonl"
    code = main(["tasks", "validate", "terminal", "--ids", "terminal/git-merge,terminal/text-csv-average",
                 "--url", env_url, "--record", str(record)])
    out, _ = capsys.readouterr()
    assert code == 0 and "2/2 valid" in out
    from orchard.tasks import load_tasks

    checked = load_tasks(record)
    assert [t.id for t in checked] == ["terminal/text-csv-average", "terminal/git-merge"]
    assert all(t.metadata["validation"]["passing_after"] == 1 for t in checked)
