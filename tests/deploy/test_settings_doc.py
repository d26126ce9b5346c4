"""`orchard env settings`: every Settings field is listed, and docs/deploy.md carries the current table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchard.env import settings_doc
from orchard.env.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def test_every_field_is_a_row_with_its_variable_default_and_description():
    rows = {row["name"]: row for row in settings_doc.rows()}
    assert list(rows) == list(Settings.model_fields)
    assert rows["port"] == {"name": "port", "env": "ORCHARD_PORT", "type": "int", "default": "8080",
                            "description": "Port to listen on."}
    assert rows["store"]["type"] == "sqlite | redis"
    assert rows["api_keys"]["type"] == "comma-separated list" and rows["api_keys"]["default"] == "(empty)"
    assert rows["redis_url"]["default"] == "(unset)" and rows["no_auth"]["default"] == "false"
    assert rows["replica_id"]["default"] == "<hostname>-<pid>"
    assert all(row["description"] for row in rows.values()), "every setting needs a description"


def test_the_markdown_table_has_one_line_per_setting_and_escapes_pipes():
    table = settings_doc.markdown().splitlines()
    assert len(table) == 2 + len(Settings.model_fields)
    assert "| `store` | `ORCHARD_STORE` | sqlite \\| redis | `sqlite` |" in settings_doc.markdown()
    assert all(len(re.split(r"(?<!\\)\|", line)) == 7 for line in table), "five cells, no stray pipe"


def test_the_deployment_guide_carries_the_current_table():
    current = settings_doc.section(DOC.read_text())
    assert current == settings_doc.markdown(), "docs/deploy.md is out of date: run `make deploy-docs`"


def test_replace_section_rewrites_only_between_the_markers():
    text = f"intro\n{settings_doc.BEGIN}\nold table\n{settings_doc.END}\noutro\n"
    new = settings_doc.replace_section(text, "| new |\n")
    assert new == f"intro\n{settings_doc.BEGIN}\n| new |\n{settings_doc.END}\noutro\n"
    with pytest.raises(ValueError, match="no settings table markers"):
        settings_doc.replace_section("no markers here", "x")


def test_the_command_prints_and_writes(tmp_path):
    cli = [sys.executable, "-m", "orchard.cli", "env", "settings"]
    plain = subprocess.run(cli, capture_output=True, text=True, check=True).stdout
    assert "ORCHARD_KUBE_AGENT_PORT" in plain and "default 7070" in plain
    markdown = subprocess.run(cli + ["--markdown"], capture_output=True, text=True, check=True).stdout
    assert markdown == settings_doc.markdown()
    doc = tmp_path / "doc.md"
    doc.write_text(f"# x\n{settings_doc.BEGIN}\n{settings_doc.END}\n")
    subprocess.run(cli + ["--write", str(doc)], capture_output=True, check=True)
    assert settings_doc.section(doc.read_text()) == settings_doc.markdown()
