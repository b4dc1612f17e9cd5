"""The project's layout: every module says what it holds, and no module imports one above it."""
import ast
import os
import re

import pytest

from conftest import ROOT

# Lowest first: a module may import only modules listed before it.
LAYERS = ["scopes", "kernels", "nesting", "overview", "runinfo", "data", "stopping", "learning", "summarize", "stepview", "ranks",
          "speedups", "speedups.options",
          "speedups.gpu_input", "speedups.prefetch", "speedups.cuda_graph", "flops", "profiling", "distributed",
          "settings", "compare", "train"]


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


def test_train_py_tells_the_tutorial_s_story_in_order():
    """train.py stays short and opens on the story: data and loader, model, step, warm-up, profile, bench, main."""
    path = module_path("train")
    assert sum(1 for _ in open(path)) <= 400, "train.py has outgrown its story: move a concern to its own module"
    order = [n.name for n in ast.parse(open(path).read()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    story = ["build_loader", "build_model", "make_step", "build_step", "warm_up", "run_profile", "run_bench",
             "log_bench", "main"]
    assert [n for n in order if n in story] == story, order


README = os.path.join(ROOT, "README.md")


def markdown_pages():
    docs = os.path.join(ROOT, "docs")
    return [README] + sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))


def anchors(path):
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens (code blocks skipped)."""
    found, fenced = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add("".join(c for c in title if c.isalnum() or c in " -_").replace(" ", "-"))
    return found


def relative_links(path):
    """(target file, anchor) of every relative Markdown link outside code blocks."""
    links, fenced = [], False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fenced = not fenced
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", "" if fenced else line):
            if not re.match(r"[a-z]+:", target):
                file, _, anchor = target.partition("#")
                links.append((os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path, anchor))
    return links


def test_readme_stays_a_short_how_to():
    """The README is the quick start; reference material lives in docs/ (nanoGPT's README is 13.8 KB)."""
    size = os.path.getsize(README)
    assert size <= 16000, f"README.md is {size} bytes: move reference material into docs/ (limit 16000)"


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(page):
    """Every relative link in README.md and docs/*.md points at a file that exists, and at a heading it has."""
    broken = []
    for target, anchor in relative_links(page):
        if not os.path.exists(target):
            broken.append(f"{os.path.relpath(target, ROOT)} (no such file)")
        elif anchor and target.endswith(".md") and anchor not in anchors(target):
            broken.append(f"{os.path.relpath(target, ROOT)}#{anchor} (no such heading)")
    assert not broken, f"{os.path.relpath(page, ROOT)} links to: {', '.join(broken)}"
