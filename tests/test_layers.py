"""The package's layers: imports point down only, and the NumPy layers never import torch."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "targetrows"
# lowest first: a module may import from its own layer and the ones before it
LAYERS = ["core", "decoding", "cost", "specbench", "jobs", "heads", "hf", "rowlog", "pipeline",
          "analysis", "fetch", "train", "bench", "cli"]
NUMPY_ONLY = ["core", "decoding", "cost", "specbench", "jobs"]


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) > 1:
            yield rel.parts[0], path


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The targetrows modules (or packages) a module imports, at any depth of its code,
    relative imports resolved."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base.startswith("targetrows"):
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)  # a submodule by name
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("targetrows"))
    return found


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package stands for its __init__)."""
    return {name: {m for m in _imports(path) if m in MODULES and m != name}
            for name, path in MODULES.items()}


@pytest.mark.parametrize("layer, path", list(_modules()), ids=lambda x: str(x))
def test_imports_point_down(layer, path):
    rank = LAYERS.index(layer)
    layers = {m.split(".")[1] for m in _imports(path) if m.count(".") >= 1}
    above = sorted(x for x in layers if x in LAYERS and LAYERS.index(x) > rank)
    assert not above, f"{path.relative_to(PACKAGE)} ({layer}) imports the higher layer(s) {above}"


def test_every_package_folder_is_a_layer():
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(LAYERS)


def test_the_import_graph_has_no_cycles():
    graph, state, stack = _graph(), {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_numpy_layers_import_without_torch():
    """Every module of core/ and decoding/ imports with torch unavailable, and `import targetrows`
    does not load torch."""
    names = [f"targetrows.{p.relative_to(PACKAGE).with_suffix('').as_posix().replace('/', '.')}"
             for layer in NUMPY_ONLY for p in sorted((PACKAGE / layer).glob("*.py"))]
    names = [n.removesuffix(".__init__") for n in names]
    code = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises
            "import importlib, targetrows\n"
            f"for name in {names!r}: importlib.import_module(name)\n"
            "assert 'transformers' not in sys.modules\n"
            "print(len(" + repr(names) + "))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == len(names) > 10


def test_the_readme_example_runs_without_torch():
    """The README's first Python example, as it stands, with torch unavailable."""
    readme = (PACKAGE.parents[1] / "README.md").read_text()
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    code = "import sys; sys.modules['torch'] = None\n" + example
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("command", ["decode", "record", "compare", "bench", "part-times"])
def test_model_commands_answer_help_and_bad_options_without_torch(command):
    """The commands that load models build their options with torch unavailable, so `--help`
    and a mistyped option answer at once, not after torch and transformers load (seconds)."""
    code = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises
            "from targetrows.cli import main\n"
            "main(sys.argv[1:])")
    run = [sys.executable, "-c", code, command]
    helped = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "--dtype" in helped.stdout, helped.stderr
    bad = subprocess.run([*run, "--target", "t", "--dtype", "fp8"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "invalid choice: 'fp8'" in bad.stderr, bad.stderr
