"""How `jaxchat/` modules may reach each other beyond imports (those are `test_import_rules.py`'s).

- No module uses another module's underscore-prefixed name: no `x._name` where `x` is not `self`, `cls` or
  `super()` and `_name` is not defined in the same module (as a function, class, method, attribute or
  variable), and no `from jaxchat... import _name`. What is shared is public. The few underscore names that
  are public APIs of the standard library (a namedtuple's `_replace`, `_asdict`, `_fields`, `_make`;
  `os._exit`) are allowed.
- `jaxchat/api` and `jaxchat/server` never probe an object with `hasattr` / `getattr`: what a service or an
  engine offers is a Protocol (`jaxchat.server.ServingBackend`, `jaxchat.api.ServingEngine`) checked with
  `isinstance`, and optional parts are capability flags. A module-level `__getattr__` (lazy import) is a
  definition, not a probe, and is fine.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxchat"
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_exit"}

MAX_CLASS_LINES, MAX_FUNCTION_LINES = 250, 80

# The engine's probes of objects that are not the project's: (module, the probed object as written) -> what it is
FOREIGN_PROBES = {
    ("chips.py", "device"): "a jax.Device (CPU devices have no TPU kind)",
    ("chips.py", "tpu_info.ChipVersion"): "JAX's Mosaic chip-version enum, looked up by name",
    ("compile_level.py", "x"): "a params leaf: a jax.Array, or a ShapeDtypeStruct, or a Python scalar",
    ("executables.py", "x.sharding"): "a jax Sharding (only NamedSharding has a mesh)",
    ("executables.py", "mesh"): "a jax Mesh (an AbstractMesh has no device ids)",
    ("pallas_interpret.py", "owner"): "a module of JAX's Pallas interpreter, patched by version",
    ("pallas_interpret.py", "ipc.get"): "a function of JAX's Pallas interpreter (already wrapped or not)",
    ("pool_plan.py", "dev"): "a jax.Device (memory_stats exists on TPU and GPU)",
    ("replicas.py", "device"): "a jax.Device (memory_stats exists on TPU and GPU)",
    ("step.py", "x"): "a params leaf: a jax.Array (sharded) or a host array",
}


def _modules(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def _defined_names(tree: ast.AST) -> set[str]:
    """Every name a module defines: functions, classes, arguments, assigned variables and attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _label(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _is_own(value: ast.expr) -> bool:
    """`self`, `cls` or `super()`: the object's own members."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def foreign_private_uses(path: Path) -> list[str]:
    """`file:line: expr` for each use of another module's underscore-prefixed name in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    own = _defined_names(tree)
    where = _label(path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxchat"):
            out += [f"{where}:{node.lineno}: from {node.module} import {a.name}"
                    for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
        elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
              and node.attr not in PUBLIC_UNDERSCORE and node.attr not in own and not _is_own(node.value)):
            out.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return out


def attribute_probes(path: Path) -> list[str]:
    """`file:line: call` for each `hasattr(...)` / `getattr(...)` call in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    return [f"{_label(path)}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")]


def test_no_module_uses_another_modules_private_names():
    found = [use for path in _modules(PACKAGE) for use in foreign_private_uses(path)]
    assert not found, "underscore names used outside their module (make them public):\n" + "\n".join(found)


def test_api_and_server_do_not_probe_attributes():
    found = [p for pkg in ("api", "server") for path in _modules(PACKAGE / pkg) for p in attribute_probes(path)]
    assert not found, "hasattr/getattr probes (use a Protocol and isinstance, or a capability flag):\n" + "\n".join(found)


def test_the_engine_probes_only_foreign_objects():
    found = []
    for path in _modules(PACKAGE / "engine"):
        for probe in attribute_probes(path):
            call = ast.parse(probe.split(": ", 1)[1]).body[0].value
            if (path.name, ast.unparse(call.args[0])) not in FOREIGN_PROBES:
                found.append(probe)
    assert not found, ("hasattr/getattr on the project's own objects in jaxchat/engine (declare the capability, or "
                       "list a foreign object in FOREIGN_PROBES):\n" + "\n".join(found))


def oversized(path: Path) -> list[str]:
    """`file:line: name (n lines)` for each class over `MAX_CLASS_LINES` and function over `MAX_FUNCTION_LINES`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        limit = (MAX_CLASS_LINES if isinstance(node, ast.ClassDef)
                 else MAX_FUNCTION_LINES if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
        if limit is not None and node.end_lineno - node.lineno + 1 > limit:
            out.append(f"{_label(path)}:{node.lineno}: {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    return out


def test_no_class_or_function_is_oversized():
    found = [o for path in _modules(PACKAGE) for o in oversized(path)]
    assert not found, (f"over {MAX_CLASS_LINES} lines a class, {MAX_FUNCTION_LINES} a function (split its jobs):\n"
                       + "\n".join(found))


def test_the_checks_find_what_they_look_for(tmp_path):
    """Each check flags a planted offence and passes the allowed forms."""
    src = tmp_path / "mod.py"
    src.write_text(
        "import os\n"
        "from jaxchat.api.pipeline import _hidden\n"
        "class A:\n"
        "    def __init__(self, other):\n"
        "        self._mine = 1\n"
        "        other._mine\n"  # defined here: allowed
        "        other._theirs()\n"  # flagged
        "        super()._x\n"
        "        os._exit\n"
        "def f(service):\n"
        "    return hasattr(service, 'x') or getattr(service, 'y', None)\n"
        "def __getattr__(name):\n"
        "    return name\n"
    )
    uses = [u.split(": ", 1)[1] for u in foreign_private_uses(src)]
    assert sorted(uses) == ["from jaxchat.api.pipeline import _hidden", "other._theirs"]
    assert [p.split(": ", 1)[1] for p in attribute_probes(src)] == [
        "hasattr(service, 'x')", "getattr(service, 'y', None)"]
    big = tmp_path / "big.py"
    big.write_text("class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES + "def long():\n" + "    y = 1\n" * MAX_FUNCTION_LINES)
    assert [o.split(": ", 1)[1] for o in oversized(big)] == [f"Big ({MAX_CLASS_LINES + 1} lines)",
                                                            f"long ({MAX_FUNCTION_LINES + 1} lines)"]
