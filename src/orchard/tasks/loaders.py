"""Read and write task files: JSONL (optionally gzipped), Parquet and Hugging Face `datasets` folders."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Union

from orchard import errors
from orchard.tasks.model import AnyTask, task_from_dict

DATA_DIR = Path(__file__).parent / "data"
SUITES = {"swe-mut": DATA_DIR / "swe.jsonl.gz", "terminal": DATA_DIR / "terminal.jsonl"}
NESTED = ("setup", "budget", "scoring", "metadata")


def load_suite(name_or_path: Union[str, Path], split: Optional[str] = None) -> list[AnyTask]:
    """A shipped suite by name ('swe-mut', 'terminal') or any task file / folder; optionally one split."""
    path = SUITES.get(str(name_or_path), Path(name_or_path))
    tasks = load_tasks(path)
    return [t for t in tasks if split is None or t.split == split]


def load_tasks(path: Union[str, Path]) -> list[AnyTask]:
    """Every task in a .jsonl/.jsonl.gz/.json file, a .parquet file or a `datasets` folder."""
    path = Path(path)
    if not path.exists():
        raise errors.TaskError(f"No task file or folder at {path} (shipped suites: {', '.join(SUITES)})")
    rows = list(_rows(path))
    tasks = []
    for i, row in enumerate(rows):
        try:
            tasks.append(task_from_dict(row))
        except ValueError as e:
            raise errors.TaskError(f"{path}: row {i} is not a valid task: {e}") from e
    return tasks


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    if path.is_dir():
        yield from _folder_rows(path)
    elif path.name.endswith((".jsonl", ".jsonl.gz", ".json")):
        yield from _jsonl_rows(path)
    elif path.suffix == ".parquet":
        yield from _parquet_rows(path)
    else:
        raise errors.TaskError(f"{path}: unknown task file type (use .jsonl, .jsonl.gz, .json, .parquet or a folder)")


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        if path.suffix == ".json":
            data = json.load(f)
            yield from (data if isinstance(data, list) else [data])
            return
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise errors.TaskError(f"{path}:{n}: not JSON: {e}") from e


def _parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    yield from pq.read_table(path).to_pylist()


def _folder_rows(path: Path) -> Iterator[dict[str, Any]]:
    """A `save_to_disk` folder (dataset_info.json / dataset_dict.json) or a folder of data files."""
    if (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists():
        import datasets

        loaded = datasets.load_from_disk(str(path))
        parts = loaded.values() if isinstance(loaded, datasets.DatasetDict) else [loaded]
        for part in parts:
            yield from part
        return
    files = sorted(p for p in path.rglob("*") if p.name.endswith((".jsonl", ".jsonl.gz", ".parquet")))
    if not files:
        raise errors.TaskError(f"{path}: no dataset_info.json, .jsonl or .parquet files inside")
    for f in files:
        yield from _rows(f)


def task_rows(tasks: Iterable[AnyTask], flat: bool = False) -> list[dict[str, Any]]:
    """Tasks as plain rows; flat=True stores nested fields as JSON text (what Parquet columns hold)."""
    rows = [t.model_dump(mode="json", exclude_none=True) for t in tasks]
    if flat:
        for row in rows:
            for key in NESTED:
                if key in row:
                    row[key] = json.dumps(row[key], sort_keys=True)
    return rows


def save_tasks(tasks: Iterable[AnyTask], path: Union[str, Path]) -> Path:
    """Write tasks as .jsonl, .jsonl.gz or .parquet (by suffix)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = task_rows(tasks, flat=True)
        columns = list(dict.fromkeys(k for row in rows for k in row))   # every row's fields, not the first's
        pq.write_table(pa.Table.from_pydict({k: [row.get(k) for row in rows] for k in columns}), path)
        return path
    if not path.name.endswith((".jsonl", ".jsonl.gz")):
        raise errors.TaskError(f"{path}: write .jsonl, .jsonl.gz or .parquet")
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for row in task_rows(tasks):
            f.write(json.dumps(row, sort_keys=True) + "\n")
    return path
