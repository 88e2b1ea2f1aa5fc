"""The layout's promises, checked on the source: `app -> core <- workers`, one writer of a job's
status, dispatch through the method registry, and a torch-free service side (docs/architecture.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.methods import METHOD_NAMES, STORED_METHOD_NAMES
from core.tables import JobStatus
from tests.conftest import REPO_ROOT

PACKAGES = ("core", "app", "workers")
FORBIDDEN = {"core": ("app", "workers"), "app": ("workers",), "workers": ("app",)}
BY_NAME_HOME = REPO_ROOT / "core" / "entrypoints.py"
STATUS_WRITER = REPO_ROOT / "core" / "lifecycle.py"
METHOD_REGISTRY = REPO_ROOT / "core" / "methods.py"
STATES = {status.value for status in JobStatus}


def sources(package: str) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def imported_modules(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):  # function-level imports count as much as top-level ones
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


@pytest.mark.parametrize("package", PACKAGES)
def test_each_side_imports_only_what_the_arrows_allow(package: str) -> None:
    crossings = [
        f"{path.relative_to(REPO_ROOT)}:{line} imports {module}"
        for path, tree in sources(package)
        for line, module in imported_modules(tree)
        if module.split(".")[0] in FORBIDDEN[package]
    ]
    assert crossings == []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in it (functions and TYPE_CHECKING blocks
    included: a ring closed lazily is still a ring a reader must untangle); `from a import b` names
    the module a.b where there is one, else a."""
    trees = {module_name(path): tree for package in PACKAGES for path, tree in sources(package)}
    graph: dict[str, set[str]] = {}
    for name, tree in trees.items():
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names if alias.name in trees}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    edges |= {child} if child in trees else ({node.module} & trees.keys())
        graph[name] = edges - {name}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


def rings(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that each reach the others through their imports, sorted by name."""
    reach = {node: reachable(graph, node) for node in graph}
    found = {
        tuple(sorted({node} | {other for other in reach[node] if node in reach[other]}))
        for node in graph
        if node in reach[node]
    }
    return [list(ring) for ring in sorted(found)]


def test_rings_are_found_where_modules_import_each_other() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert rings(graph) == [["a", "b", "c"], ["e", "f"]]


def test_no_modules_import_each_other_round_a_ring() -> None:
    """Each room has a floor below it: a module never reaches itself through what it imports."""
    assert rings(import_graph()) == []


MAX_MODULE_LINES = 450
"""A module a person reads at a sitting: longer ones split along their seams (docs/architecture.md)."""


def test_no_module_outside_tests_and_migrations_is_longer_than_a_sitting() -> None:
    long = [
        f"{path.relative_to(REPO_ROOT)}: {lines} lines"
        for package in (*PACKAGES, "bench", "scripts")
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert long == []


@pytest.mark.parametrize("package", ["core", "app"])
def test_the_service_side_names_the_engine_only_in_the_entry_point_registry(package: str) -> None:
    named = [
        f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.value!r}"
        for path, tree in sources(package)
        if path != BY_NAME_HOME
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("workers.")
    ]
    assert named == []


def _is_state(value: ast.expr) -> bool:
    if isinstance(value, ast.Attribute):
        return ast.unparse(value).startswith("JobStatus.")
    return isinstance(value, ast.Constant) and value.value in STATES


def _writes_status(node: ast.AST) -> bool:
    """`.values(status=...)`, `Job(status=...)`, any call given `status=JobStatus.x`, or
    `something.status = <a state>`."""
    if isinstance(node, ast.Call):
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for keyword in node.keywords:
            if keyword.arg == "status" and (
                callee in ("values", "Job") or isinstance(keyword.value, ast.Attribute)
            ):
                return callee in ("values", "Job") or _is_state(keyword.value)
    if isinstance(node, ast.Assign):
        return _is_state(node.value) and any(
            isinstance(target, ast.Attribute) and target.attr == "status" for target in node.targets
        )
    return False


def test_only_the_lifecycle_module_writes_a_jobs_status() -> None:
    writers = [
        f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
        for package in PACKAGES
        for path, tree in sources(package)
        if path != STATUS_WRITER
        for node in ast.walk(tree)
        if _writes_status(node)
    ]
    assert writers == []


def test_no_code_outside_the_registry_branches_on_a_method_name() -> None:
    names = set(METHOD_NAMES) | set(STORED_METHOD_NAMES)
    branches = [
        f"{path.relative_to(REPO_ROOT)}:{node.lineno} {ast.unparse(node)}"
        for package in PACKAGES
        for path, tree in sources(package)
        if path != METHOD_REGISTRY
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(
            isinstance(part, ast.Constant) and part.value in names for part in (node.left, *node.comparators)
        )
    ]
    assert branches == []


def test_the_service_side_loads_no_torch_or_transformers() -> None:
    heavy = ("torch", "transformers", "safetensors", "accelerate")
    script = (
        "import sys, core.lifecycle, core.methods, core.specs, core.prediction.laws, app.main, app.cli\n"
        "app.main.create_app\n"
        f"print(','.join(name for name in {heavy!r} if name in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "", f"the service side imported {done.stdout.strip()}"


PORTABLE = REPO_ROOT / "workers" / "slicing" / "portable"
PORTABLE_THIRD_PARTY = {"torch", "transformers", "safetensors"}


def test_the_portable_code_exported_checkpoints_carry_needs_only_torch_and_transformers() -> None:
    from core.families import SLICED_MODEL_TYPE
    from workers.slicing.portable.modeling_prunecast_sliced import MODEL_TYPE, PORTABLE_FILES

    assert MODEL_TYPE == SLICED_MODEL_TYPE  # spelled twice: the portable code cannot import core

    assert {path.name for path in PORTABLE.glob("*.py")} == {*PORTABLE_FILES, "__init__.py"}
    outside = []
    for name in PORTABLE_FILES:
        tree = ast.parse((PORTABLE / name).read_text())
        for node in ast.walk(tree):
            sibling = (
                isinstance(node, ast.ImportFrom) and node.level == 1 and f"{node.module}.py" in PORTABLE_FILES
            )
            if isinstance(node, ast.ImportFrom) and node.level > 0 and not sibling:
                outside.append(f"{name}:{node.lineno} relative import of {node.module!r}")
        for line, module in imported_modules(tree):
            top = module.split(".")[0]
            if top not in PORTABLE_THIRD_PARTY and top not in sys.stdlib_module_names:
                outside.append(f"{name}:{line} imports {module}")
    assert outside == []


def test_views_draw_what_they_are_given_and_never_import_services() -> None:
    reaching = [
        f"{path.relative_to(REPO_ROOT)}:{line} imports {module}"
        for path, tree in sources("app")
        if "views" in path.relative_to(REPO_ROOT / "app").parts[:1]
        for line, module in imported_modules(tree)
        if module.startswith("app.services")
    ]
    assert reaching == []


def test_model_structure_is_read_through_the_architectures_package_alone() -> None:
    """Outside `workers/architectures/`, code imports the package, never one of its modules."""
    home = REPO_ROOT / "workers" / "architectures"
    reaching = [
        f"{path.relative_to(REPO_ROOT)}:{line} imports {module}"
        for package in (*PACKAGES, "tests", "bench")
        for path, tree in sources(package)
        if home not in path.parents
        for line, module in imported_modules(tree)
        if module.startswith("workers.architectures.")
    ]
    assert reaching == []
