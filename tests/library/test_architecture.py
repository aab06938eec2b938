"""The code's shape: imports flow one way (no cycle, no upward import, no import hidden inside a function)."""
import ast
import re
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "symfusion"

# Layers from the bottom up, read off the folder tree: a module belongs to the deepest entry listed here that contains
# it (so a new module needs no entry), and may import only from its own layer or a lower one. The library is
# everything outside pipeline/ (its core: families, arch, stream, symmetry, matching/, fusion/, measures,
# interpolation, presets, errors; io/: model folders on disk, below matching/; alignment/: symfusion.align and the
# folder-streamed matching); the pipeline sits above it.
LAYERS = [
    ("library", ["symfusion"]),
    ("library: model folders", ["symfusion.io"]),           # storage only: below matching/ and fusion/
    ("library: matching and fusion", ["symfusion.matching", "symfusion.fusion"]),
    ("library: align()", ["symfusion.alignment", "symfusion.many"]),
    ("pipeline plumbing", ["symfusion.pipeline"]),        # config, warm, allocator, revisions, training, packing, ...
    ("data sources", ["symfusion.pipeline.data"]),
    ("tasks", ["symfusion.pipeline.tasks"]),
    ("stages and report", ["symfusion.pipeline.stages", "symfusion.pipeline.report"]),
    ("entry points", ["symfusion.pipeline.cli"]),        # the console scripts: each imports its own stage lazily
]
PIPELINE = "symfusion.pipeline"
MAX_TOP_LEVEL = 13            # modules and packages a library user imports from symfusion/ (besides __init__)


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), filename=str(p)) for p in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> int:
    """The layer of the deepest LAYERS folder holding `module` (every module lies under "symfusion")."""
    found = [(len(folder), index) for index, (_, folders) in enumerate(LAYERS) for folder in folders
             if module == folder or module.startswith(folder + ".")]
    assert found, f"{module} lies outside the symfusion package"
    return max(found)[1]


def imported(tree: ast.Module, module: str, top_level_only: bool) -> set[str]:
    """symfusion modules imported by a module (at the top level only, or anywhere)."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("symfusion"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("symfusion"))
    return found


def resolve(name: str, known: set[str]) -> str | None:
    """The module an imported name refers to (a module, or the module defining an imported attribute)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def test_the_folder_tree_shows_library_and_pipeline():
    """The library's modules sit outside pipeline/, the pipeline's inside it; the library's top level holds at most
    MAX_TOP_LEVEL modules (what a library user imports); no module is longer than 450 lines."""
    names = set(modules())
    library = {n for n in names if n != PIPELINE and not n.startswith(PIPELINE + ".")}
    assert all(layer_of(n) < layer_of(PIPELINE) for n in library)
    assert all(layer_of(n) >= layer_of(PIPELINE) for n in names - library)
    top = sorted(p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
                 if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").is_file()))
    assert PIPELINE.split(".")[1] in top
    top.remove(PIPELINE.split(".")[1])
    assert len(top) <= MAX_TOP_LEVEL, top
    long = {p.relative_to(SRC).as_posix(): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert long == {}


def test_no_symfusion_import_inside_a_function_below_the_entry_points():
    """Only the top layer (the console scripts' entry points) imports inside functions: each command imports its own
    stage lazily, so a pipeline job starts fast; everywhere else imports sit at the top of the module."""
    nested = []
    for name, tree in modules().items():
        if layer_of(name) == len(LAYERS) - 1:
            continue
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(function):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and imported(
                            ast.Module(body=[node], type_ignores=[]), name, True):
                        nested.append(f"{name}:{node.lineno} in {function.name}()")
    assert nested == []


def test_imports_only_go_down_the_layers():
    trees = modules()
    known = set(trees)
    upward = []
    for name, tree in trees.items():
        if name == "symfusion":
            continue
        for target in filter(None, (resolve(t, known) for t in imported(tree, name, False))):
            if target != "symfusion" and layer_of(target) > layer_of(name):
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_no_import_cycle():
    trees = modules()
    known = set(trees)
    graph = {name: {t for t in map(lambda x: resolve(x, known), imported(tree, name, False)) if t and t != name}
             for name, tree in trees.items()}
    # a package's __init__ re-exporting its submodules is not a cycle through the package
    for name in graph:
        graph[name] = {t for t in graph[name] if not (t == name.rpartition(".")[0] and t in trees)}
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == []


REPORT = "symfusion.pipeline.report"
REPORT_SHARED = {f"{REPORT}.registry", f"{REPORT}.results", f"{REPORT}.effects", f"{REPORT}.barriers",
                 f"{REPORT}.spread"}


def test_report_modules_import_no_sibling_but_the_shared_ones():
    """report/ is one module per artefact (its writer) plus shared modules (registry: the experiments; results: reading
    results, writing CSV / Markdown / figures; effects: effects of matching; barriers: loss paths): no module imports a sibling that is not
    shared, so no chain runs sideways; artefacts.py, symfusion-report itself, imports the writers by the registry's
    names and the audit report."""
    trees = modules()
    known = set(trees)
    sideways = []
    for name, tree in trees.items():
        if not name.startswith(REPORT + "."):
            continue
        siblings = {t for t in map(lambda x: resolve(x, known), imported(tree, name, False))
                    if t and t.startswith(REPORT + ".") and t != name}
        allowed = REPORT_SHARED | ({f"{REPORT}.audit"} if name == f"{REPORT}.artefacts" else set())
        sideways += [f"{name} -> {t}" for t in sorted(siblings - allowed)]
    assert REPORT_SHARED <= known and sideways == []


@pytest.mark.parametrize("forbidden", ["is_text", "TEXT_KINDS", "IMAGE_KINDS"])
def test_no_task_kind_branches_outside_the_tasks_package(forbidden):
    users = [name for name, tree in modules().items()
             if not name.startswith("symfusion.pipeline.tasks") and not name.startswith("symfusion.pipeline.data")
             and any(isinstance(n, ast.Name) and n.id == forbidden for n in ast.walk(tree))]
    assert users == []


def test_the_wheel_ships_the_presets_and_not_the_pipeline_conf():
    """pip install symfusion (a wheel) carries the library's presets (package-data lists every file of
    src/symfusion/presets) and no conf/: the package holds no link to the checkout's pipeline configuration."""
    import fnmatch
    import tomllib

    root = SRC.parent
    links = [p.relative_to(SRC).as_posix() for p in PACKAGE.rglob("*") if p.is_symlink()]
    assert links == [] and not (PACKAGE / "conf").exists()
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["symfusion"]
    files = [p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "presets").rglob("*") if p.is_file()
             and p.suffix not in (".pyc", ".py")]      # modules ship as the package's
    unshipped = [f for f in files if not any(fnmatch.fnmatchcase(f, pattern) for pattern in patterns)]
    assert files and unshipped == []
    assert not any(pattern.startswith("conf") for pattern in patterns)


def test_the_presets_catalog_is_plain_python():
    """The workflow loads presets/catalog.py by its path where symfusion may not be installed: it may import only the
    standard library and PyYAML (which Snakemake needs itself), never the package."""
    tree = ast.parse((PACKAGE / "presets" / "catalog.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported and imported - {"yaml"} <= set(sys.stdlib_module_names), imported


# ---------------------------------------------------------------- docs/architecture.md names what exists

ROOT = SRC.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
_PATHLIKE = re.compile(r"[\w.-]+(/[\w.-]*)*")
# where a path the prose names bare (`sharded.py`, `tracks.smk`) may lie
_PROSE_HOMES = ("", "src/symfusion", "src/symfusion/pipeline", "workflow/rules", "workflow")


def _is_path(token: str) -> bool:
    return bool(_PATHLIKE.fullmatch(token)) and ("/" in token or re.search(r"\.\w+$", token) is not None
                                                or token == "Snakefile") and not token.startswith(".")


def layout_paths() -> list[str]:
    """Every path the Layout tree of docs/architecture.md names, joined to the folders it is indented under: the
    words of each entry before its description (a word holding <...> stands for many names and is left out)."""
    text = ARCHITECTURE.read_text()
    block = text[text.index("## Layout"):]
    block = block[block.index("```\n") + 4:]
    block = block[:block.index("```")]
    found, parents = [], []                      # parents: (indent, folder) of the open folder entries
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent >= 20:     # a description's continuation
            continue
        parents = [(i, f) for i, f in parents if i < indent]
        base = parents[-1][1] if parents else ""
        entry = re.split(r"\s{2,}", line.strip())[0]          # the names; a description follows 2+ spaces
        names = [word for word in entry.split() if "<" not in word and _is_path(word)]
        found += [base + name for name in names]
        if names and names[0].endswith("/"):
            parents.append((indent, base + names[0]))
    return found


def prose_paths() -> list[str]:
    """Every file path the page names in backquotes outside its Layout tree (`matching/compose.py`, `sharded.py`)."""
    words = re.findall(r"`([^`\s]+)`", ARCHITECTURE.read_text())
    return sorted({w for w in words if "<" not in w and re.search(r"\.(py|smk|yaml|sh|csv|md)$", w)
                   and _is_path(w)})


def test_the_architecture_page_names_only_paths_that_exist():
    named = layout_paths()
    assert len(named) > 40 and "src/symfusion/alignment/sharded.py" in named      # the tree was read, folders joined
    missing = [p for p in named if not (ROOT / p).exists()]
    assert missing == [], f"docs/architecture.md's Layout names what is not there: {missing}"
    prose = prose_paths()
    assert "matching/compose.py" in prose and len(prose) > 20
    unfound = [p for p in prose if not any((ROOT / home / p).exists() for home in _PROSE_HOMES)]
    assert unfound == [], f"docs/architecture.md names what is not there: {unfound}"


def test_the_architecture_page_names_every_top_level_module_and_package():
    """The Layout tree lists each module and package directly in src/symfusion/ (a new one gets its line)."""
    named = set(layout_paths())
    top = sorted(str(p.relative_to(ROOT)) + ("/" if p.is_dir() else "") for p in PACKAGE.iterdir()
                 if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file())
    assert len(top) > 10 and [p for p in top if p not in named] == []
