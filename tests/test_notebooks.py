"""Every notebook under `notebooks/` runs top to bottom with the default model (nbclient).

Each notebook is executed in a fresh kernel whose Python is the interpreter running pytest (a
kernelspec written to a temporary JUPYTER_PATH, so a `python3` kernel installed elsewhere cannot be
picked up), with `notebooks/` as its working directory. A failing cell fails the test with the
cell's source and traceback. The notebooks must be committed without outputs. With
JAXCHAT_NOTEBOOK_OUT=DIR the executed notebooks (with their outputs) are written there.

JAX's persistent compilation cache is shared by the kernels of one session (and the server that
notebook 03 starts), so later notebooks reuse the programs the first one compiled.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "jaxchat-test-python"
CELL_TIMEOUT = 900

pytestmark = pytest.mark.slow


def test_notebooks_exist_and_are_clean():
    names = [p.stem for p in NOTEBOOKS]
    assert names == ["01_quickstart", "02_tool_calls", "03_structured_output", "04_inside_the_decode_step"], names
    for path in NOTEBOOKS:
        book = json.loads(path.read_text())
        for cell in book["cells"]:
            if cell["cell_type"] == "code":
                assert not cell.get("outputs") and cell.get("execution_count") is None, f"{path.name}: outputs not cleared"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """A kernelspec for this interpreter, and the environment the kernels run in."""
    try:
        from jaxchat.assets import DEFAULT_MODEL, asset_path

        asset_path(DEFAULT_MODEL)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"default model not fetched: {exc}")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    base = tmp_path_factory.mktemp("jupyter")
    spec_dir = base / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "jaxchat test kernel",
        "language": "python",
    }))
    cache = Path(os.environ.get("JAXCHAT_CACHE", Path.home() / ".cache" / "jaxchat")) / "jax-compilation-cache"
    env = {
        "JUPYTER_PATH": str(base),
        "MPLBACKEND": "Agg",
        "JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR", str(cache)),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "TQDM_DISABLE": "1",
        "JAXCHAT_PROGRAMS": "background",  # what users get (the test run's default is "first": tests/conftest.py)
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, kernel_env):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    book = nbformat.read(path, as_version=4)
    client = NotebookClient(book, kernel_name=KERNEL, timeout=CELL_TIMEOUT, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as exc:
        pytest.fail(f"{path.name}: a cell failed\n{exc}", pytrace=False)
    finally:
        if os.environ.get("JAXCHAT_NOTEBOOK_OUT"):  # keep the executed notebook for inspection
            out = Path(os.environ["JAXCHAT_NOTEBOOK_OUT"])
            out.mkdir(parents=True, exist_ok=True)
            nbformat.write(book, out / path.name)
    print(f"{path.name}: {time.perf_counter() - t0:.0f} s")
