"""The notebooks run top to bottom, and are committed without outputs.

`notebooks/theorem_4_2.ipynb` checks Sec. 4.3 / App. A by simulation with `assert`s in its cells, so a failed
tolerance fails the execution test; `notebooks/quickstart.ipynb` goes from logs to a routed episode. Committed
notebooks carry no outputs and no execution counts, so a stale output can never disagree with the code.

The kernel is this interpreter (the test's own virtual environment): a `python3` kernel spec naming
`sys.executable` is written to a temporary JUPYTER_PATH entry, which takes precedence over any installed spec and
registers nothing outside the test's temporary directory.
"""

import json
import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ("theorem_4_2.ipynb", "quickstart.ipynb")
CELL_TIMEOUT_S = 600


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_has_no_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code_cells
    for i, cell in enumerate(code_cells):
        assert cell.get("outputs") == [], f"{name}: code cell {i} has stored outputs; strip them"
        assert cell.get("execution_count") is None, f"{name}: code cell {i} has an execution count; strip it"


def test_every_notebook_opens_with_the_same_set_up_cell():
    """One set-up cell, copied into each notebook: a clone is used as it is; elsewhere (Colab) the project is
    fetched (an uploaded sdist or RIVET_REPO_URL) and pip-installed."""
    first = {next(cell.source for cell in nbformat.read(NOTEBOOKS / name, as_version=4).cells
                  if cell.cell_type == "code") for name in NAMES}
    assert len(first) == 1
    (source,) = first
    assert "RIVET_REPO_URL" in source and "rivet_jax-*.tar.gz" in source and '"pip", "install"' in source


@pytest.fixture
def venv_kernel(tmp_path, monkeypatch):
    """A `python3` kernel spec for this interpreter, visible only to this test."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (test interpreter)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    from jupyter_client.kernelspec import KernelSpecManager

    assert KernelSpecManager().get_kernel_spec("python3").argv[0] == sys.executable
    return "python3"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom(name, venv_kernel, tmp_path, monkeypatch):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("TMPDIR", str(tmp_path))   # the kernel's tempfile dirs (the quickstart's workdirs) go here
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=venv_kernel,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute()
    except CellExecutionError as error:  # a failed assert in a cell: show the cell and its traceback
        pytest.fail(f"{name} failed:\n{str(error)[-6000:]}")
    errors = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
              if out.output_type == "error"]
    assert not errors
    assert all(cell.execution_count is not None for cell in nb.cells if cell.cell_type == "code")
