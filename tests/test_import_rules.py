"""The import rules of docs/architecture.md, and no import cycle anywhere in `jaxchat/`.

The rules are stated once, here (`ALLOWED`, `BLOCKED`); docs/architecture.md's package table summarises them and
names this file as their authority.

Two checks, each of which can fail on its own:
- Statically, every `import` statement in every module (inside functions too) is read with `ast`:
  each package may import only the `jaxchat` packages its row of `ALLOWED` allows, none of
  the libraries it must not load (starlette in `jaxchat.api` and `jaxchat.llm`, jax in the server,
  ...), and the module graph (an edge per imported module; `from pkg import name` is an edge to
  `pkg.name` when that is a module, else to `pkg`) has no cycle.
- At run time, each package is imported in a fresh interpreter whose import system refuses the
  third-party modules it must not load, so an indirect import (through another package) fails too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxchat"
LEAVES = ("jaxchat.assets", "jaxchat.bitmask")  # stdlib-level helpers any layer above chat may use

# The jaxchat modules each part may import directly (docs/architecture.md's table summarises these); a part not
# listed may import anything. The engine's row in docs/architecture.md allows `constrain` for the constraint protocol;
# that protocol is `jaxchat.engine.types.Constraint` (structural typing), since constrain imports chat, which the
# engine may not reach even indirectly.
ALLOWED = {
    "jaxchat.chat": ("jaxchat.chat",),
    "jaxchat.constrain": ("jaxchat.constrain", "jaxchat.chat", *LEAVES),
    "jaxchat.models": ("jaxchat.models", *LEAVES),
    "jaxchat.engine": ("jaxchat.engine", "jaxchat.models", *LEAVES),
    "jaxchat.api": ("jaxchat.api", "jaxchat.chat", "jaxchat.constrain", "jaxchat.engine", *LEAVES),
    "jaxchat.server": ("jaxchat.server", "jaxchat.api"),
    "jaxchat.llm": ("jaxchat.api",),
}

# Third-party (and jaxchat) modules a package must not load, even indirectly, when it is imported.
BLOCKED = {
    "jaxchat.chat": ("jax", "jaxlib", "numpy", "xgrammar", "starlette", "flax", "torch", "transformers"),
    "jaxchat.constrain": ("jax", "jaxlib", "flax", "starlette"),
    "jaxchat.models": ("xgrammar", "starlette", "jaxchat.server", "jaxchat.constrain", "jaxchat.chat"),
    "jaxchat.engine": ("starlette", "xgrammar", "jaxchat.chat", "jaxchat.api", "jaxchat.server"),
    "jaxchat.api": ("starlette", "jax", "jaxlib", "flax", "xgrammar", "jaxchat.server"),
    "jaxchat.server": ("jax", "jaxlib", "flax", "xgrammar", "jaxchat.models"),
    "jaxchat.llm": ("starlette", "jaxchat.server"),
}


# ---- the static import graph ----------------------------------------------------------------------
def module_names(root: Path) -> dict[str, Path]:
    """Every module under `root` (a package directory) by dotted name; a package is its `__init__`."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that `name` (at `path`) imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in modules)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def external_roots(path: Path) -> set[str]:
    """The top-level names of the non-jaxchat modules that `path` imports anywhere in its source."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out - {"jaxchat"}


def forbidden_external_imports(root: Path) -> list[str]:
    out = []
    for module, path in sorted(module_names(root).items()):
        part = next((p for p in BLOCKED if module == p or module.startswith(p + ".")), None)
        if part is None:
            continue
        banned = {b for b in BLOCKED[part] if not b.startswith("jaxchat")}
        out.extend(f"{module} imports {name}" for name in sorted(external_roots(path) & banned))
    return out


def part_of(module: str) -> str | None:
    return next((p for p in ALLOWED if module == p or module.startswith(p + ".")), None)


def forbidden_imports(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        part = part_of(module)
        if part is None:
            continue
        for target in sorted(targets):
            if not any(target == a or target.startswith(a + ".") for a in ALLOWED[part]):
                out.append(f"{module} imports {target}")
    return out


GRAPH = import_graph(PACKAGE)


def test_no_import_cycle_in_jaxchat():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_each_part_imports_only_what_design_allows():
    assert forbidden_imports(GRAPH) == []


def test_no_part_imports_a_forbidden_library_even_lazily():
    assert forbidden_external_imports(PACKAGE) == []


def test_the_checks_catch_what_they_forbid(tmp_path):
    pkg = tmp_path / "jaxchat"
    for name, source in {
        "__init__.py": "",
        "engine/__init__.py": "",
        "engine/step.py": "def f():\n    from jaxchat.chat import parse\n",  # a lazy import still counts
        "chat/__init__.py": "from . import parse\n",
        "chat/parse.py": "from .segments import cut\n",
        "chat/segments.py": "def g():\n    from jaxchat.chat.parse import x\n",
        "server/__init__.py": "import starlette\nfrom jaxchat.engine import step\n",
        "api/__init__.py": "def serve():\n    from starlette.applications import Starlette\n",
    }.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(source)
    graph = import_graph(pkg)
    assert graph["jaxchat.server"] == {"jaxchat.engine.step"} and graph["jaxchat.chat"] == {"jaxchat.chat.parse"}
    assert find_cycle(graph) == ["jaxchat.chat.parse", "jaxchat.chat.segments", "jaxchat.chat.parse"]
    assert forbidden_imports(graph) == ["jaxchat.engine.step imports jaxchat.chat.parse",
                                        "jaxchat.server imports jaxchat.engine.step"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert forbidden_external_imports(pkg) == ["jaxchat.api imports starlette"]


# ---- what each package loads when imported ----------------------------------------------------------
def _import_with_blocked(package: str, blocked: tuple[str, ...]) -> subprocess.CompletedProcess:
    code = textwrap.dedent(
        f"""
        import importlib, pkgutil, sys
        BLOCKED = {blocked!r}

        class Block:
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ImportError(f"{{name}} is forbidden in {package}")
                return None

        sys.meta_path.insert(0, Block())
        pkg = importlib.import_module({package!r})
        for info in pkgutil.walk_packages(getattr(pkg, "__path__", []), {package!r} + "."):
            importlib.import_module(info.name)
        print("ok")
        """
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.parametrize("package", sorted(BLOCKED))
def test_import_rules(package: str):
    result = _import_with_blocked(package, BLOCKED[package])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


def test_runtime_check_fails_on_a_forbidden_import():
    result = _import_with_blocked("jaxchat.server", ("starlette",))
    assert result.returncode != 0 and "starlette is forbidden" in result.stderr


def test_llm_imports_without_starlette():
    code = "import sys; sys.modules['starlette'] = None; import jaxchat; jaxchat.LLM; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
