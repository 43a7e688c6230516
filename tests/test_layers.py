"""The package's layers: imports point down only, and the NumPy layers never import torch."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "targetrows"
# lowest first: a module may import from its own layer and the ones before it
LAYERS = ["core", "decoding", "hf", "rowlog", "analysis", "build", "bench", "pipeline", "cli"]
NUMPY_ONLY = ["core", "decoding"]


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) > 1:
            yield rel.parts[0], path


def _imported_layers(path: Path) -> set[str]:
    """Layers of targetrows that a module imports (at any depth of its code)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.startswith("targetrows."):
                found.add(node.module.split(".")[1])
            elif node.level == 2 and node.module:  # from ..layer import x
                found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("targetrows."):
                    found.add(alias.name.split(".")[1])
    return found


@pytest.mark.parametrize("layer, path", list(_modules()), ids=lambda x: str(x))
def test_imports_point_down(layer, path):
    rank = LAYERS.index(layer)
    above = sorted(x for x in _imported_layers(path) if x in LAYERS and LAYERS.index(x) > rank)
    assert not above, f"{path.relative_to(PACKAGE)} ({layer}) imports the higher layer(s) {above}"


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
