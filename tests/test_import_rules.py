"""DESIGN.md's import rules: each package imports only what its row of the table allows.

Each check runs in a fresh interpreter whose import system refuses the forbidden top-level modules,
so an import anywhere below the package (even a lazy one at module level) fails the test.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

RULES = {
    "jaxchat.chat": ("jax", "jaxlib", "numpy", "xgrammar", "starlette", "flax", "torch", "transformers"),
    "jaxchat.constrain": ("jax", "jaxlib", "flax", "starlette"),
    "jaxchat.models": ("xgrammar", "starlette", "jaxchat.server", "jaxchat.constrain"),
    "jaxchat.server": ("jax", "jaxlib", "flax", "xgrammar", "jaxchat.models"),
}


def _import_with_blocked(package: str, blocked: tuple[str, ...]) -> subprocess.CompletedProcess:
    code = textwrap.dedent(
        f"""
        import importlib, importlib.util, pkgutil, sys
        BLOCKED = {blocked!r}

        class Block:
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ImportError(f"{{name}} is forbidden in {package}")
                return None

        sys.meta_path.insert(0, Block())
        pkg = importlib.import_module({package!r})
        for info in pkgutil.walk_packages(pkg.__path__, {package!r} + "."):
            importlib.import_module(info.name)
        print("ok")
        """
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("package", sorted(RULES))
def test_import_rules(package: str):
    if importlib_missing(package):
        pytest.skip(f"{package} does not exist yet")
    result = _import_with_blocked(package, RULES[package])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


def importlib_missing(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is None
