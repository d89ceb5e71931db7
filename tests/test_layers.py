"""The house has floors: no import runs up a floor, and no modules import each other in a circle.

The import graph of ``tools/`` is read statically (``ast``, nothing is imported), with the
imports inside functions counted too: a lazy import dodges the cost of importing, not the
dependency. The floors are written down in docs/ARCHITECTURE.md ("Layers"); a module on no floor
fails here until it is given one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"

# Lowest floor first; a module may import its own floor and the floors below. The longest
# matching prefix decides (`tools.build_repo.spec` is below the rest of `tools.build_repo`).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("tools", "tools.errors", "tools.files", "tools.manifest", "tools.stats",
                    "tools.paths", "tools.process", "tools.net", "tools.command",
                    "tools.tensorrt_module", "tools.cpu_isa")),
    ("typed files", ("tools.typed_yaml", "tools.yaml_edit", "tools.build_repo.spec", "tools.slo",
                     "tools.build_repo.quality_sets")),
    ("models", ("tools.models",)),
    ("front", ("tools.front",)),
    ("build", ("tools.build_repo",)),
    ("stages", ("tools.serve", "tools.load", "tools.loadtest", "tools.bench", "tools.tune",
                "tools.deploy", "tools.add", "tools.infer", "tools.gpu_check",
                "tools.spec_schema", "tools.init", "tools.api")),
    ("cli", ("tools.cli", "tools.cli_doc")),
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(TOOLS.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:  # `from pkg import module` imports the module
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in modules else base)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _floor(module: str) -> int | None:
    best, floor = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), index
    return floor


def test_every_module_of_tools_is_on_a_floor():
    assert [m for m in _graph() if _floor(m) is None] == []


def test_no_import_runs_up_a_floor():
    upward = [
        f"{module} ({LAYERS[_floor(module)][0]}) imports {target} ({LAYERS[_floor(target)][0]})"
        for module, targets in sorted(_graph().items())
        for target in sorted(targets)
        if _floor(target) > _floor(module)
    ]
    assert upward == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_no_modules_import_each_other_in_a_circle():
    assert _cycles(_graph()) == []


def test_the_checks_see_a_circle_and_an_upward_arrow_when_there_is_one():
    # the graph reader itself: a made-up circle is found, a real upward import would be named
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _floor("tools.build_repo.spec.entries") < _floor("tools.models.hf") \
        < _floor("tools.build_repo.builders") < _floor("tools.tune.command") < _floor("tools.cli")
    graph = _graph()
    assert "tools.build_repo.model_source" in graph["tools.build_repo.builders"]
    # lazy imports inside functions are edges too
    assert "tools.models.hf" in graph["tools.build_repo.model_source"]


def _package(module: str) -> str | None:
    """The package of the house picture a module belongs to: ``tools.X...`` is ``X``, except
    ``build_repo/spec``; ``tools`` itself is on none."""
    parts = module.split(".")[1:]
    if not parts:
        return None
    return "build_repo/spec" if parts[:2] == ["build_repo", "spec"] else parts[0]


def package_arrows() -> dict[str, set[str]]:
    """Which package imports which (a module's imports of its own package left out)."""
    arrows: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        source = _package(module)
        if source is not None:
            arrows.setdefault(source, set()).update(
                t for t in map(_package, targets) if t not in (None, source))
    return arrows


def arrows_table() -> str:
    """The rows of docs/ARCHITECTURE.md's table of package arrows, as the code has them."""
    return "\n".join(f"| `{source}` | {', '.join(f'`{t}`' for t in sorted(targets)) or '—'} |"
                     for source, targets in sorted(package_arrows().items()))


def test_the_architecture_page_draws_the_arrows_the_code_has():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    table = text.split("<!-- BEGIN PACKAGE ARROWS -->\n", 1)[1].split("<!-- END", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert rows == arrows_table().splitlines(), (
        "docs/ARCHITECTURE.md's package arrows differ from the import graph; the rows now:\n"
        + arrows_table())
