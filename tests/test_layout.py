"""The project's layout: every module says what it holds, and no module imports one above it."""
import ast
import os

import pytest

from conftest import ROOT

# Lowest first: a module may import only modules listed before it.
LAYERS = ["scopes", "runinfo", "data", "stopping", "summarize", "ranks", "speedups", "speedups.options",
          "speedups.gpu_input", "speedups.prefetch", "speedups.cuda_graph", "flops", "profiling", "distributed",
          "compare", "train"]


def project_imports(path):
    tree = ast.parse(open(path).read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n in LAYERS}


def module_path(name):
    rel = name.replace(".", os.sep)
    return os.path.join(ROOT, rel, "__init__.py") if name == "speedups" else os.path.join(ROOT, rel + ".py")


@pytest.mark.parametrize("name", LAYERS)
def test_module_has_a_one_line_docstring_and_imports_only_below(name):
    path = module_path(name)
    doc = ast.get_docstring(ast.parse(open(path).read()))
    assert doc and doc.splitlines()[0].strip(), f"{name}: no docstring saying what it holds"
    above = {n for n in project_imports(path) if LAYERS.index(n) >= LAYERS.index(name) and n != name}
    assert not above, f"{name} imports {sorted(above)}, which sit above it (or beside it) in {LAYERS}"


def test_every_python_module_is_placed_in_a_layer():
    """A new module must be given its place, or the layering test above would not see it."""
    found = {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")}
    found |= {f"speedups.{f[:-3]}" for f in os.listdir(os.path.join(ROOT, "speedups"))
              if f.endswith(".py") and f != "__init__.py"}
    assert found <= set(LAYERS), f"not placed in LAYERS: {sorted(found - set(LAYERS))}"


def test_compare_does_not_import_train():
    assert "train" not in project_imports(module_path("compare"))
