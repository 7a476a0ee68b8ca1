"""The notebooks run top to bottom (nbclient), shortened through environment variables, and are stored clean."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from helpers import REPO
from nbclient import NotebookClient

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_notebooks_exist_and_have_no_outputs() -> None:
    assert {p.name for p in NOTEBOOKS} == {"rotary_position_embedding.ipynb", "rope_vs_bert.ipynb"}
    for path in NOTEBOOKS:
        notebook = nbformat.read(path, as_version=4)
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        clean = all(not cell.get("outputs") and cell.get("execution_count") is None for cell in code)
        assert clean, f"{path.name} is stored with outputs"


LONG_NOTEBOOKS = {"rope_vs_bert.ipynb"}  # minutes of training: CI skips it (the slow marker)


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if p.name in LONG_NOTEBOOKS else p for p in NOTEBOOKS],
    ids=lambda p: p.name,
)
def test_notebook_executes(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROFORMER_NOTEBOOK_MAX_STEPS", "30")
    monkeypatch.setenv("ROFORMER_EXPERIMENT_DIR", str(tmp_path / "experiment"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    images = [o for cell in notebook.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the notebook should draw"
