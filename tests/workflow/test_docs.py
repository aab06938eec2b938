"""README.md and docs/ stay true: every relative link and anchor resolves, and every command they name exists.

A page is checked as a reader would use it: each `[text](target)` outside code must name a file of the
repository (and, with `#anchor`, a heading of that page, as GitHub makes anchors); each command line in a
code block or a code span must name a `symfusion-*` script of pyproject.toml, a `python benchmarks|scripts/*.py`
or `bash scripts/*.sh` file that exists, only `--options` its parser accepts (argparse parsers are read from the
scripts themselves; Snakemake's own; a bash script's `case` labels), only `KEY=VALUE` keys of the stage's
conf/<stage>.yaml, conf names (`matching=`, `fusion=`, `profile=`, `model=`, `task=`, `methods=[..]`, ...) that
have their conf/<group>/<name>.yaml, and Snakemake targets that the workflow builds (a dry run per profile);
a path a page names under src/symfusion/, tests/, conf/, workflow/, scripts/, benchmarks/, reference/ or docs/ (or a
module named by its tail, `matching/heads.py`) must exist. Uppercase words (`DIR`, `NAME`, `N`) are
placeholders. The last test shows each check failing on a tiny page with one mistake of each kind.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import re
import shlex
import sys
import subprocess
import tempfile
import tomllib
from functools import lru_cache
from pathlib import Path

import yaml

from symfusion.pipeline.command import declaration

from workflow_copy import scratch_workflow, snakemake, stderr_lines

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The README's two quick-start commands: CI and newcomers run exactly these (.ci/run runs the second's pytest).
SETUP_AND_RUN = "bash scripts/setup.sh && . .venv/bin/activate && snakemake --cores 2"
TESTS = ". .venv/bin/activate && python -m pytest"
README_MAX_LINES = 200                       # a front door (issue 35): the rest lives in docs/

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"`([^`]+)`")          # a span may wrap onto the next line
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")
CONF_NAME = re.compile(r"[a-z0-9_]+")
# KEY=NAME whose NAME is a conf file of a group, and KEY=[N1,N2] lists of them
GROUP_OF = {"matching": "matching", "fusion": "fusion", "profile": "profile", "model": "model", "task": "task",
            "data_task": "task"}
LIST_GROUP_OF = {"methods": "fusion", "tasks": "task", "eval_tasks": "task"}
CONF_VALUE = re.compile(r"(?<![\w.-])(" + "|".join(GROUP_OF) + r")=[\"']?([^\s'\"\]\[,)]+)")
CONF_LIST = re.compile(r"(?<![\w.-])(" + "|".join(LIST_GROUP_OF) + r")=\[([^\]]*)\]")
TOP_DIRS = ("src/symfusion", "tests", "conf", "workflow", "scripts", "benchmarks", "reference", "docs")
PATH_SPAN = re.compile(r"(?:%s)/[\w./-]*" % "|".join(TOP_DIRS))
MODULE_SPAN = re.compile(r"[\w-]+(?:/[\w-]+)*\.(?:py|smk|sh|yaml)")
SEPARATORS = {"&&", "||", ";", "|", ">", ">>", "2>&1", "<<"}


# ------------------------------------------------------------------------------------------------ pages

def strip_code(text: str) -> str:
    """The page without its fenced blocks and code spans (links and headings are read from what is left)."""
    return SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation but - and _ removed, spaces -> -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page's headings make (a repeated one gets -1, -2, ... as on GitHub)."""
    found, seen = set(), {}
    for match in HEADING.finditer(FENCE.sub("", text)):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_problems(page: Path, text: str) -> list[str]:
    problems = []
    for target in LINK.findall(strip_code(text)):
        if re.match(r"[a-z]+:", target):            # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if path and not where.exists():
            problems.append(f"{page.name}: link to {target}: no such file")
        elif anchor:
            linked = text if where == page else where.read_text() if where.suffix == ".md" else None
            if linked is None or anchor not in anchors(linked):
                problems.append(f"{page.name}: link to {target}: no heading makes #{anchor}")
    return problems


def code_lines(text: str) -> list[str]:
    """Every line of its code blocks (a trailing backslash joins the next) and every code span."""
    lines = []
    for block in FENCE.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    return lines + [" ".join(span.split()) for span in SPAN.findall(FENCE.sub("", text))]


# ------------------------------------------------------------------------------------------------ what exists

@lru_cache(maxsize=None)
def console_scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def group_dir(group: str) -> Path:
    """A matching or fusion preset is the library's (src/symfusion/presets/), any other conf group the pipeline's."""
    return (ROOT / "src" / "symfusion" / "presets" if group in ("matching", "fusion") else ROOT / "conf") / group


def conf_exists(group: str, name: str) -> bool:
    return (group_dir(group) / f"{name}.yaml").is_file()


@lru_cache(maxsize=None)
def stage_keys(stage: str) -> frozenset[str] | None:
    """The keys a stage command takes on its command line: its declaration's options and groups (its stage module,
    pipeline/stages/<stage>.py); None for a name that is no stage command."""
    try:
        declared = declaration(stage)
    except KeyError:
        return None
    groups = {group.removeprefix("optional ") for group in declared.groups}     # `optional profile` is a group
    return frozenset({f.name for f in dataclasses.fields(declared)} | groups)


@lru_cache(maxsize=None)
def group_keys(group: str) -> frozenset[str]:
    """Every key some <group>/*.yaml sets (what `group.key=` may override)."""
    return frozenset(key for path in group_dir(group).glob("*.yaml")
                     for key in (yaml.safe_load(path.read_text()) or {}))


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def parser_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of a parser and of its subcommands."""
    options = set()
    for action in parser._actions:
        options.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options |= parser_options(sub)
    return options


def captured_parser(main) -> argparse.ArgumentParser:
    """The parser `main()` builds, taken from its first parse_args call (nothing runs beyond it)."""
    def capture(self, *args, **kwargs):
        raise _Captured(self)
    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        main()
    except _Captured as captured:
        return captured.parser
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"{main} built no argparse parser")


@lru_cache(maxsize=None)
def script_options(path: Path) -> frozenset[str]:
    """The options a benchmark or script accepts: its argparse parser's, or a bash script's `case` labels."""
    if path.suffix == ".sh":
        labels = re.findall(r"(?m)^\s*((?:-{1,2}[\w-]+\|?)+)\)", path.read_text())
        return frozenset(option for label in labels for option in label.split("|"))
    spec = importlib.util.spec_from_file_location(f"docs_checked_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # as `python benchmarks/x.py` runs it: its siblings importable by name
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return frozenset(parser_options(captured_parser(module.main)))


@lru_cache(maxsize=None)
def console_options(name: str) -> frozenset[str]:
    """The options of an argparse console script (symfusion-compare)."""
    module, _, function = console_scripts()[name].partition(":")
    return frozenset(parser_options(captured_parser(getattr(importlib.import_module(module), function))))


@lru_cache(maxsize=None)
def snakemake_parser():
    from snakemake.cli import get_argument_parser
    return get_argument_parser()


@lru_cache(maxsize=None)
def repository_files() -> tuple[str, ...]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return tuple(listed.splitlines())


@lru_cache(maxsize=None)
def repository_folders() -> frozenset[str]:
    """The names of the repository's folders (a span `matching/heads.py` is this project's; `glue/glue.py` is not)."""
    return frozenset(part for f in repository_files() for part in f.split("/")[:-1])


# ------------------------------------------------------------------------------------------------ commands

def words(line: str) -> list[str]:
    """A command line's words (quotes removed), its comment dropped."""
    try:
        lexer = shlex.shlex(line, posix=True)
        lexer.whitespace_split, lexer.commenters = True, "#"
        return list(lexer)
    except ValueError:                               # an unbalanced quote: a span cut out of prose
        return line.split()


def arguments(tokens: list[str], start: int) -> list[str]:
    """The words after tokens[start] up to the next separator (a `|` whose next word is KEY=VALUE is an
    alternative inside `[a | b]`, not a pipe)."""
    found = []
    for i in range(start + 1, len(tokens)):
        token = tokens[i]
        if token in SEPARATORS and not (token == "|" and i + 1 < len(tokens) and "=" in tokens[i + 1]):
            break
        found.append(token)
    return found


def hydra_problems(name: str, stage: str, args: list[str]) -> list[str]:
    problems, keys = [], stage_keys(stage)
    for arg in args:
        arg = arg.strip("[]")
        if arg in ("--help", "-h", "|") or "=" not in arg:
            if arg.startswith("-") and arg not in ("--help", "-h"):
                problems.append(f"{name} takes no option {arg} (KEY=VALUE arguments)")
            continue
        key = arg.split("=", 1)[0].lstrip("+~")
        if PLACEHOLDER.fullmatch(key):
            continue
        head, _, rest = key.partition(".")
        if head not in keys:
            problems.append(f"{name}: no key {head!r} in symfusion-{stage}'s declaration")
        elif rest and group_dir(head).is_dir() and rest.split(".")[0] not in group_keys(head):
            problems.append(f"{name}: no key {rest!r} in any {group_dir(head).relative_to(ROOT)}/*.yaml")
    return problems


def option_problems(name: str, args: list[str], accepted: frozenset[str]) -> list[str]:
    return [f"{name} has no option {arg.split('=')[0]}" for arg in args
            if arg.startswith("-") and not re.fullmatch(r"-\d.*", arg) and arg.split("=")[0] not in accepted]


def snakemake_problems(args: list[str], targets: list) -> list[str]:
    """Snakemake's own parser takes the line; its targets are kept for the dry runs, with their profile."""
    args = ["1" if PLACEHOLDER.fullmatch(a) else a for a in args if a != "..."]   # `snakemake ...`: elided
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parsed = snakemake_parser().parse_args(args)
    except BaseException as error:                   # argparse exits; a bad value raises
        return [f"snakemake does not take {' '.join(args)} ({type(error).__name__})"]
    problems, config = [], dict(entry.split("=", 1) for entry in parsed.config or [] if "=" in entry)
    for entry in parsed.config or []:
        if "=" not in entry:
            problems.append(f"snakemake --config takes {entry!r} as a config entry: targets go before --config")
    pipeline = yaml.safe_load((ROOT / "conf" / "pipeline.yaml").read_text())
    problems += [f"snakemake --config {key}=: no such key in conf/pipeline.yaml" for key in config if key not in pipeline]
    profile = config.get("profile", pipeline["profile"])
    targets += [(profile, target) for target in parsed.targets or [] if not PLACEHOLDER.fullmatch(target)]
    return problems


def command_problems(line: str, targets: list) -> list[str]:
    tokens, problems = words(line), []
    for i, token in enumerate(tokens):
        args = arguments(tokens, i)
        command = re.fullmatch(r"symfusion-([a-z]+)", token)
        if command:
            name = token
            if name not in console_scripts():
                problems.append(f"{name}: no such command in pyproject.toml's scripts")
            elif stage_keys(command.group(1)) is not None:
                problems += hydra_problems(name, command.group(1), args)
            elif name != "symfusion-worker":
                problems += option_problems(name, args, console_options(name))
        elif token == "snakemake" and (i == 0 or tokens[i - 1] not in ("import", "from")):
            problems += snakemake_problems(args, targets)
        elif token in ("python", "bash") and args and re.fullmatch(r"(benchmarks|scripts)/[\w.-]+\.(py|sh)", args[0]):
            script = ROOT / args[0]
            if script.is_file():                     # (a missing one: path_problems says so)
                problems += option_problems(args[0], args[1:], script_options(script))
                if script.name == "check_slurm.sh" and len(args) > 1 and CONF_NAME.fullmatch(args[1]) \
                        and not conf_exists("profile", args[1]):
                    problems.append(f"{args[0]} {args[1]}: no conf/profile/{args[1]}.yaml")
    for key, value in CONF_VALUE.findall(line):
        for name in value.split("|"):
            if CONF_NAME.fullmatch(name) and not conf_exists(GROUP_OF[key], name):
                problems.append(f"{key}={name}: no {group_dir(GROUP_OF[key]).relative_to(ROOT)}/{name}.yaml")
    for key, values in CONF_LIST.findall(line):
        for name in (v.strip() for v in values.split(",")):
            if CONF_NAME.fullmatch(name) and not conf_exists(LIST_GROUP_OF[key], name):
                problems.append(f"{key}=[..{name}..]: no {group_dir(LIST_GROUP_OF[key]).relative_to(ROOT)}/{name}.yaml")
    return problems


def path_problems(span: str) -> list[str]:
    """A path a code span names: under a top-level folder it must exist; a module by its tail must be one."""
    if re.search(r"[<*{$]", span):
        return []
    if PATH_SPAN.fullmatch(span):
        return [] if (ROOT / span).exists() else [f"{span}: no such path"]
    if span.startswith("src/"):                      # another project's source tree (transformers' src/...)
        return []
    if MODULE_SPAN.fullmatch(span) and ("/" not in span or span.split("/")[0] in repository_folders()) \
            and not any(f == span or f.endswith("/" + span) for f in repository_files()):
        return [f"{span}: no file of the repository is called so"]
    return []


def page_problems(page: Path, text: str, targets: list) -> list[str]:
    """Everything wrong with one page but its Snakemake targets, which go to `targets` (profile, target)."""
    problems = link_problems(page, text)
    for line in code_lines(text):
        problems += [f"{page.name}: `{line.strip()[:70]}`: {p}" for p in command_problems(line, targets)]
        for word in dict.fromkeys([line.strip(), *words(line)]):
            problems += [f"{page.name}: {p}" for p in path_problems(word)]
    return list(dict.fromkeys(problems))


def target_problems(targets: list) -> list[str]:
    """Dry-run each profile's targets in a scratch copy of the workflow: each must be a file a rule writes."""
    problems, by_profile = [], {}
    for profile, target in targets:
        by_profile.setdefault(profile, set()).add(target)
    with tempfile.TemporaryDirectory() as scratch:
        folder = scratch_workflow(Path(scratch))
        for profile, names in sorted(by_profile.items()):
            if snakemake(folder, *sorted(names), "-n", "--config", f"profile={profile}").returncode == 0:
                continue                             # all of them at once; else each alone, to name the bad ones
            for name in sorted(names):
                done = snakemake(folder, name, "-n", "--config", f"profile={profile}")
                if done.returncode != 0:
                    lines = stderr_lines(done) or ["?"]
                    why = next((line for line in lines if re.search(r"No rule|Error|Exception", line)), lines[-1])
                    problems.append(f"snakemake {name} (profile={profile}): the workflow does not build it ({why[:150]})")
    return problems


# ------------------------------------------------------------------------------------------------ tests

def test_every_relative_link_and_anchor_resolves():
    problems = [p for page in PAGES for p in link_problems(page, page.read_text())]
    assert not problems, "\n".join(problems)


def test_every_command_option_conf_name_and_path_the_pages_name_exists():
    targets: list = []
    problems = [p for page in PAGES for p in page_problems(page, page.read_text(), targets)]
    assert not problems, "\n".join(problems)
    assert ("mini", "results/mini/table2.csv") in targets           # the targets were found (next test)


def test_every_snakemake_target_the_pages_name_is_built_by_the_workflow():
    targets: list = []
    for page in PAGES:
        page_problems(page, page.read_text(), targets)
    assert {profile for profile, _ in targets} >= {"mini", "smoke", "paper"}
    problems = target_problems(targets)
    assert not problems, "\n".join(problems)


def test_the_readme_is_a_front_door_with_the_quick_start_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    blocks = [block.strip() for block in FENCE.findall(readme)]
    assert SETUP_AND_RUN in blocks and TESTS in blocks             # each its own block, exactly
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/setup.sh" in ci and re.search(r"(?m)^python -m pytest( --durations=\d+)?$", ci)
    assert all(f"docs/{page.name}" in readme for page in PAGES[1:])   # the index names every page


def test_a_page_with_one_mistake_of_each_kind_fails_on_each():
    page = ROOT / "docs" / "a_fake_page.md"                       # never written: checked as text
    text = "\n".join([
        "# A fake page", "## Its section",
        "[fine](#its-section) [fine](matching.md#design-choices) [fine](../README.md)",
        "[gone](no_such_page.md) [gone](matching.md#no-such-heading) [gone](#nowhere)",
        "```bash",
        "symfusion-match source=a anchor=b output=c matching=rotation [layers=[0,2] | last_layers=2]   # fine",
        "snakemake --cores 2 results/mini/table2.csv                                                    # fine",
        "symfusion-frobnicate x=1",
        "symfusion-match sauce=a anchor=b output=c matching=rotatoin",
        "symfusion-match source=a anchor=b output=c matching.rescaling=false",
        "symfusion-merge task=fashion_mnist 'methods=[simple,averaging]' 'models=[a,b]' eval_dir=e",
        "symfusion-compare results/mini --tolerence 1",
        "python benchmarks/bench_nothing.py",
        "python benchmarks/bench_pipeline.py --predikt",
        "bash scripts/check_slurm.sh huge --skip-rule report",
        "snakemake --corse 2",
        "snakemake --cores 2 --config profile=paper results/paper/table2.csv",
        "snakemake --cores 2 results/mini/table9.csv",
        "```",
        "Also `fusion=averaging`, `src/symfusion/no_such_module.py` and `matching/no_such_solver.py`.",
    ])
    targets: list = []
    problems = page_problems(page, text, targets) + target_problems(targets)
    expected = ["no_such_page.md: no such file", "#no-such-heading", "#nowhere",
                "symfusion-frobnicate: no such command", "no key 'sauce' in symfusion-match's declaration",
                "matching=rotatoin: no src/symfusion/presets/matching/rotatoin.yaml",
                "no key 'rescaling' in any src/symfusion/presets/matching",
                "methods=[..averaging..]", "symfusion-compare has no option --tolerence",
                "benchmarks/bench_nothing.py: no such path", "has no option --predikt",
                "scripts/check_slurm.sh has no option --skip-rule", "no conf/profile/huge.yaml",
                "snakemake does not take --corse", "targets go before --config",
                "snakemake results/mini/table9.csv (profile=mini): the workflow does not build it",
                "fusion=averaging: no src/symfusion/presets/fusion/averaging.yaml", "src/symfusion/no_such_module.py: no such path",
                "matching/no_such_solver.py: no file of the repository"]
    for mistake in expected:
        assert sum(mistake in p for p in problems) == 1, (mistake, problems)
    assert len(problems) == len(expected), "\n".join(problems)      # and the fine lines raised nothing
