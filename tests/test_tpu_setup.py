"""tpu_setup.sh: syntax, shellcheck, argument handling and the smoke check's non-TPU paths.

Nothing here installs anything: the smoke check runs in the environment the tests run in (its venv is
`sys.prefix`), with `JAX_PLATFORMS=cpu` so that the results are the same on every machine, TPU VMs
included.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tpu_setup.sh"
VENV = Path(sys.prefix)


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], check=False, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def needs_venv() -> None:
    if not (VENV / "bin" / "python").exists():
        pytest.skip(f"the tests do not run in a virtual environment ({VENV}/bin/python is missing)")


def test_bash_syntax():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], check=False, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck)")
    result = subprocess.run(["shellcheck", str(SCRIPT)], check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_exits_0_with_usage(flag):
    result = run(flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: bash tpu_setup.sh")
    for option in ("--venv DIR", "--skip-install", "--skip-assets", "--check-only", "--expect-platform"):
        assert option in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-such-option"], "unknown option: --no-such-option"),
        (["--check-only", "extra"], "unknown option: extra"),
        (["--expect-platform", "fpga"], "--expect-platform must be tpu, gpu or cpu, not 'fpga'"),
        (["--expect-platform"], "option --expect-platform needs one of: tpu, gpu, cpu"),
        (["--venv"], "option --venv needs a directory"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args, message):
    result = run(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "--help" in result.stderr
    assert "==>" not in result.stdout  # nothing was done


def test_check_only_without_an_environment_says_so(tmp_path):
    result = run("--check-only", "--venv", str(tmp_path / "missing"))
    assert result.returncode == 1
    assert f"no virtual environment at {tmp_path / 'missing'}" in result.stderr


def test_smoke_check_fails_clearly_without_tpu():
    needs_venv()
    result = run("--check-only", "--venv", str(VENV))
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "jax.devices(): [CpuDevice(id=0)" in result.stdout
    assert "no TPU devices found: jax.devices() returned [CpuDevice(id=0)" in result.stderr
    assert "JAX_PLATFORMS=cpu is set" in result.stderr  # the hint names the likely cause
    assert "docs/tpu.md" in result.stderr
    assert "==> ready" not in result.stdout


def test_smoke_check_passes_on_the_expected_platform():
    needs_venv()
    result = run("--check-only", "--expect-platform", "cpu", "--venv", str(VENV), timeout=300)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "jax.devices(): [CpuDevice(id=0)" in result.stdout
    assert "jaxchat mesh (the engine's default): axis 'tp' over" in result.stdout
    assert "sharded computation over all" in result.stdout
    # the engine warm-up (jaxchat/engine/smoke.py): the jnp path on CPU
    assert re.search(r"^engine warm-up on 1 cpu device\(s\), 2-layer random model, attention xla: 3 programs ready in "
                     r"[\d.]+ s, greedy tokens \[\d+(, \d+){7}\]: ok$", result.stdout, re.M), result.stdout


def test_skip_install_and_assets_runs_the_check_and_prints_how_to_serve():
    needs_venv()
    result = run("--skip-install", "--skip-assets", "--expect-platform=cpu", f"--venv={VENV}", timeout=300)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "installing packages" not in result.stdout and "fetching the offline assets" not in result.stdout
    assert "jaxchat serve --model /path/to/hf_dir --dtype bfloat16 --max-batch 32" in result.stdout
    assert "--worker=all --command 'cd /path/to/jaxchat && .venv/bin/jaxchat serve --model" in result.stdout
    assert "--coordinator HOST0:PORT --num-processes N --process-id I" in result.stdout


def test_the_tpu_extra_pins_the_jax_the_tests_run_with():
    """pyproject's `tpu` extra (what tpu_setup.sh installs) names the exact jax of this environment; jax's own
    `tpu` extra then pins the matching jaxlib and libtpu."""
    import importlib.metadata
    import tomllib

    import jax

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tpu"]
    assert extra == [f"jax[tpu]=={jax.__version__}"], extra
    assert any(r.startswith("libtpu==") and 'extra == "tpu"' in r for r in importlib.metadata.requires("jax"))
    assert 'pip_install -e "${ROOT}[tpu]"' in SCRIPT.read_text()
