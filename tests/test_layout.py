"""The project's layout: every module says what it holds, and no module imports one above it."""

import ast
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

# The folders, lowest first: a module may import only from its own folder's layer or the ones before it.
# Inside a folder, the modules' order: a module may import only modules listed before it.
LAYERS = {
    "steplens": [
        "steplens.errors",
        "steplens.atomic",
        "steplens.stats",
        "steplens.scopes",
        "steplens.polyaxonenv",
        "steplens.text",
    ],
    "steplens.trace": [
        "steplens.trace.intervals",
        "steplens.trace.reader",
        "steplens.trace.spill",
        "steplens.trace.columns",
        "steplens.trace.calls",
        "steplens.trace.damage",
        "steplens.trace.kernels",
        "steplens.trace.nesting",
        "steplens.trace.memory",
        "steplens.trace.soundness",
        "steplens.trace.timeline",
    ],
    "steplens.evidence": [
        "steplens.evidence.delays",
        "steplens.evidence.attribution",
        "steplens.evidence.diagnosis",
        "steplens.evidence.formatting",
        "steplens.evidence.flops",
        "steplens.evidence.work",
        "steplens.evidence.roofline",
        "steplens.evidence.summarize",
        "steplens.evidence.picture",
        "steplens.evidence.snapshot",
        "steplens.evidence.distortion",
        "steplens.evidence.cycle_evidence",
    ],
    # What reads a project's runs (or a run's ranks) stands above what reads one trace: the evidence never imports it.
    "steplens.project": [
        "steplens.project.ranks",
        "steplens.project.runs",
        "steplens.project.diff",
        "steplens.project.comparison",
        "steplens.project.compare",
        "steplens.project.report",
        "steplens.project.decide",
    ],
    "steplens.speedups": [
        "steplens.speedups.options",
        "steplens.speedups.gpu_input",
        "steplens.speedups.prefetch",
        "steplens.speedups.cuda_graph",
    ],
    "steplens.job": [
        "steplens.job.paths",
        "steplens.job.overview",
        "steplens.job.machine",
        "steplens.job.cpu_use",
        "steplens.job.host_memory",
        "steplens.job.loader_timeline",
        "steplens.job.runrecord",
        "steplens.job.checks",
        "steplens.job.stopping",
        "steplens.job.device",
        "steplens.job.data",
        "steplens.job.learning",
        "steplens.job.capture",
        "steplens.job.phases",
        "steplens.job.memory_snapshot",
        "steplens.job.distributed",
        "steplens.job.rank_outputs",
        "steplens.job.bench_outputs",
        "steplens.job.settings",
    ],
    "top": ["steplens.viewer", "steplens.cli", "steplens.__main__", "train"],
}
ORDER = [m for folder in LAYERS.values() for m in folder]
PACKAGES = {"steplens", "steplens.trace", "steplens.evidence", "steplens.project", "steplens.speedups", "steplens.job"}


def project_imports(path):
    """The project's modules a file imports ("from steplens.trace import kernels" counts as steplens.trace.kernels)."""
    tree = ast.parse(open(path).read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n in ORDER or n == "train"}


def module_path(name):
    if name == "train":
        return os.path.join(ROOT, "train.py")
    return os.path.join(ROOT, name.replace(".", os.sep) + ".py")


@pytest.mark.parametrize("name", ORDER)
def test_module_has_a_one_line_docstring_and_imports_only_below(name):
    path = module_path(name)
    doc = ast.get_docstring(ast.parse(open(path).read()))
    assert doc and doc.splitlines()[0].strip(), f"{name}: no docstring saying what it holds"
    above = {n for n in project_imports(path) if ORDER.index(n) >= ORDER.index(name) and n != name}
    assert not above, f"{name} imports {sorted(above)}, which sit above it (or beside it) in {ORDER}"


def test_every_python_module_is_placed_in_a_layer():
    """A new module must be given its place, or the layering test above would not see it."""
    found = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "steplens")):
        package = os.path.relpath(folder, ROOT).replace(os.sep, ".")
        found |= {f"{package}.{f[:-3]}" for f in files if f.endswith(".py") and f != "__init__.py"}
    assert found == set(ORDER) - {"train"}, (
        f"not placed in LAYERS: {sorted(found - set(ORDER))}; "
        f"placed but missing: {sorted(set(ORDER) - found - {'train'})}"
    )


def test_the_top_level_holds_train_py_and_no_other_module():
    """The toolkit lives in the package; the top level keeps the tutorial's script alone."""
    top = sorted(f for f in os.listdir(ROOT) if f.endswith(".py"))
    assert top == ["train.py"], top


def test_trace_reading_needs_neither_torch_nor_polyaxon():
    """The trace, evidence and project modules import no torch, torchvision or Polyaxon at their top level."""
    heavy = {"torch", "torchvision", "polyaxon", "numpy", "pandas"}
    readers = ("steplens.trace", "steplens.evidence", "steplens.project")
    for name in ORDER:
        if not name.startswith(readers) and name not in LAYERS["steplens"]:
            continue
        tree = ast.parse(open(module_path(name)).read())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module}
        assert not names & heavy, f"{name} imports {sorted(names & heavy)} at its top level"


def test_no_function_is_longer_than_about_80_lines():
    """Long functions are split at their seams; a stage is a named function, not a screenful."""
    long = []
    paths = [module_path(n) for n in ORDER] + [
        os.path.join(ROOT, "scripts", f) for f in os.listdir(os.path.join(ROOT, "scripts")) if f.endswith(".py")
    ]
    for path in paths:
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 85:
                long.append(f"{os.path.relpath(path, ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


def test_compare_does_not_import_train():
    assert "train" not in project_imports(module_path("steplens.project.compare"))


def test_train_py_tells_the_tutorial_s_story_in_order():
    """train.py stays short and opens on the story: data and loader, model, step, warm-up, profile, bench, main."""
    path = module_path("train")
    assert sum(1 for _ in open(path)) <= 400, "train.py has outgrown its story: move a concern to its own module"
    order = [n.name for n in ast.parse(open(path).read()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    story = [
        "build_loader",
        "build_model",
        "make_step",
        "build_step",
        "warm_up",
        "run_profile",
        "run_bench",
        "main",
    ]
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


@pytest.mark.parametrize("page, limit", [("EVIDENCE.md", 30000), ("RESULTS.md", 25000)])
def test_the_long_docs_stay_readable_in_one_sitting(page, limit):
    """The definitions and the studies stay short enough to finish: a new subject gets its own page."""
    size = os.path.getsize(os.path.join(ROOT, "docs", page))
    assert size < limit, f"docs/{page} is {size} bytes (limit {limit}): give the new subject a page of its own"


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


def test_the_toolkit_reads_a_trace_without_torch_or_polyaxon(tmp_path):
    """steplens summarize on a stored H200 trace with torch, torchvision and Polyaxon made unimportable."""
    trace = os.path.join(ROOT, "results", "h200-warmup", "offline", "runs")
    found = [os.path.join(d, f) for d, _, fs in os.walk(trace) for f in fs if f.endswith(".pt.trace.json.gz")]
    assert found, "no stored H200 trace under results/h200-warmup"
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'torchvision', 'polyaxon', 'numpy', 'pandas'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from steplens.cli import main\n"
        f"raise SystemExit(main(['summarize', {sorted(found)[0]!r}]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "GPU compute holds the step" in proc.stdout and "kernel class" in proc.stdout, proc.stdout[-2000:]


def test_public_functions_of_the_package_have_type_hints():
    """Every public function and method of steplens says what it takes and returns (self and cls aside)."""
    missing = []
    for name in ORDER:
        if name in ("train", "steplens.__main__"):
            continue
        tree = ast.parse(open(module_path(name)).read())
        scopes = [(None, tree.body)] + [
            (c.name, c.body) for c in tree.body if isinstance(c, ast.ClassDef) and not c.name.startswith("_")
        ]
        for owner, body in scopes:
            for node in body:
                if not isinstance(node, ast.FunctionDef) or (node.name.startswith("_") and node.name != "__init__"):
                    continue
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                args += [a for a in (node.args.vararg, node.args.kwarg) if a]
                bare = [a.arg for a in args if a.annotation is None and a.arg not in ("self", "cls")]
                if bare or (node.returns is None and node.name != "__init__"):
                    where = f"{owner}.{node.name}" if owner else node.name
                    missing.append(f"{name}.{where}" + (f" (args {bare})" if bare else " (return)"))
    assert not missing, f"{len(missing)} public functions without type hints: {missing[:20]}"


def test_the_source_hash_covers_train_py_and_every_module_of_the_package():
    """run.json's source_sha256 changes when any code the job runs changes: train.py and all of steplens/."""
    from steplens.job import paths

    files = {os.path.relpath(p, ROOT) for p in paths.source_files()}
    package = {
        os.path.relpath(os.path.join(d, f), ROOT)
        for d, _, fs in os.walk(os.path.join(ROOT, "steplens"))
        for f in fs
        if f.endswith(".py")
    }
    assert files == package | {"train.py"}, sorted(files ^ (package | {"train.py"}))
    assert paths.DEFAULT_OFFLINE_ROOT == os.path.join(ROOT, ".polyaxon-offline"), "offline runs land at the root"
