"""The workflow with awkward paths and mistaken profiles: every value reaches its command intact, a mistake in a profile
or the registry is one error line when the workflow is read (exit 2, nothing written), no worker temp folder is left."""
import ast
import re
import shlex
import string
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from workflow_copy import ROOT, edit_yaml, scratch_workflow, snakemake, stderr_lines

pytestmark = pytest.mark.slow          # every test runs snakemake

AWKWARD = "my, 'odd' $x [results]"          # a space, a comma, quotes, a dollar and brackets


def shell_strings() -> dict[str, str]:
    """rule -> its shell command template, from workflow/rules/*.smk (adjacent string literals joined); a rule made by
    `use rule X as Y with:` has X's."""
    found, inherited = {}, {}
    for path in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        text = path.read_text()
        for rule, block in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |^use rule |\Z)", text, re.M | re.S):
            shell = re.search(r"^    shell:\n((?:        .*\n?)+)", block, re.M)
            if shell:
                found[rule] = "".join(ast.literal_eval(line.strip()) for line in shell.group(1).splitlines() if line.strip())
        inherited.update({new: old for old, new in re.findall(r"^use rule (\w+) as (\w+) with:", text, re.M)})
    return {**found, **{new: found[old] for new, old in inherited.items() if old in found}}


def test_no_rule_puts_an_unquoted_value_on_its_command_line():
    """Every {placeholder} of every shell command but {threads} is shell-quoted (:q), and none sits inside quotes."""
    shells = shell_strings()
    assert {"data", "train", "match", "merge_evaluate", "lang_merge_pair", "table", "figure", "report"} <= set(shells)
    unquoted = []
    for rule, template in shells.items():
        quoted = False
        for literal, name, spec, _ in string.Formatter().parse(template):
            quoted ^= literal.count("'") % 2 == 1
            if name is not None and name != "threads" and (spec != "q" or quoted):
                unquoted.append(f"{rule}: {{{name}{':' + spec if spec else ''}}}")
    assert unquoted == []


def override_values(words: list[str]) -> list[str]:
    """Every string value of a command's Hydra overrides (list items and dict values too), resolved as the stage
    resolves them."""
    overrides = OverridesParser.create().parse_overrides([w for w in words if "=" in w])
    resolved = OmegaConf.to_container(OmegaConf.create({o.key_or_group.replace(".", "_"): o.value() for o in overrides}),
                                      resolve=True)
    values, stack = [], list(resolved.values())
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack += list(item.values())
        elif isinstance(item, list):
            stack += item
        elif isinstance(item, str):
            values.append(item)
    return values


def test_an_awkward_results_dir_reaches_every_command_intact(tmp_path):
    results, figures = tmp_path / AWKWARD, tmp_path / "my figures"
    run = snakemake(ROOT, "-n", "-p", "--config", "profile=smoke", f"results_dir={results}", f"figures_dir={figures}")
    assert run.returncode == 0, run.stdout[-2000:]
    commands = [c for c in re.findall(r"^Shell command: (.*)$", run.stdout, re.M) if c != "None"]   # `all` has none
    total = int(re.search(r"^total\s+(\d+)", run.stdout, re.M).group(1))
    assert len(commands) == total - 1 > 0                        # every job of the smoke profile but `all`
    for command in commands:
        words = shlex.split(command)
        stage = next(i for i, w in enumerate(words) if w.startswith("symfusion-"))
        redirect = words.index(">")
        assert words[redirect + 1].startswith(f"{results}/smoke/logs/")
        paths = [v for v in override_values(words[stage + 1:redirect]) if "/" in v]
        assert paths and all(p.startswith((f"{results}/smoke/", f"{figures}/smoke/")) for p in paths), command
    assert not results.exists() and not figures.exists()


def test_a_real_job_with_an_awkward_results_dir_writes_only_inside_it_and_leaves_no_worker_folder(tmp_path,
                                                                                                  tmp_path_factory):
    folder = scratch_workflow(tmp_path / "checkout")
    # TMPDIR a short folder of its own: the worker's socket, TMPDIR/symfusion-worker-*/socket, must fit AF_UNIX's 107
    # bytes, and this test's tmp_path under pytest-xdist (.../pytest-N/popen-gwK/test_a_real_job_with_an_awkwar0) left
    # it ~110 (the worker failed to start: "AF_UNIX path too long" in worker.log)
    results, temp = tmp_path / AWKWARD, tmp_path_factory.mktemp("t")
    run = snakemake(folder, "--cores", "1", f"{results}/smoke/data/digits.json", "--config", "profile=smoke",
                    f"results_dir={results}", f"figures_dir={tmp_path / 'my figures'}", env={"TMPDIR": str(temp)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (results / "smoke" / "data" / "digits.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["checkout", AWKWARD])
    assert "): exit 0 after" in (results / "smoke" / "logs" / "worker.log").read_text()   # the job ran in the worker
    assert list(temp.glob("symfusion-worker-*")) == []                            # its socket folder went with it


def test_a_tmpdir_too_long_for_the_workers_socket_turns_the_worker_off_in_one_line(tmp_path):
    """TMPDIR so long that TMPDIR/symfusion-worker-*/socket passes AF_UNIX's 107 bytes: the run says so in one line,
    its jobs start their own processes and succeed, and no worker folder is left (the worker used to die with a
    traceback in worker.log while the jobs ran without it, unsaid)."""
    folder = scratch_workflow(tmp_path / "checkout")
    temp = tmp_path / ("t" * 100)
    temp.mkdir()
    results = tmp_path / "results"
    run = snakemake(folder, "--cores", "1", f"{results}/smoke/data/digits.json", "--config", "profile=smoke",
                    f"results_dir={results}", env={"TMPDIR": str(temp)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (results / "smoke" / "data" / "digits.json").is_file()
    said = [line for line in run.stderr.splitlines() if line.startswith("warm worker off:")]
    assert len(said) == 1 and "longer than a Unix socket path may be" in said[0], run.stderr[-3000:]
    assert list(temp.glob("symfusion-worker-*")) == []
    assert "exit 0 after" not in (results / "smoke" / "logs" / "worker.log").read_text()  # no job ran in a worker


def test_a_worker_that_cannot_log_leaves_no_temp_folder(tmp_path):
    """results/ not writable (here: under a file, which stops root too): the run fails, no worker folder is left."""
    folder = scratch_workflow(tmp_path / "checkout")
    (tmp_path / "a_file").write_text("x")
    temp = tmp_path / "tmp"
    temp.mkdir()
    results = tmp_path / "a_file" / "results"
    run = snakemake(folder, "--cores", "1", f"{results}/smoke/data/digits.json", "--config", "profile=smoke",
                    f"results_dir={results}", env={"TMPDIR": str(temp)})
    assert run.returncode != 0
    assert list(temp.glob("symfusion-worker-*")) == []
    assert (tmp_path / "a_file").read_text() == "x"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    return scratch_workflow(tmp_path_factory.mktemp("profiles") / "checkout")


PROFILE_MISTAKES = [
    (("vision", "model"), "vit_smol", "vision.model"),
    (("vision", "task"), "digitz", "vision.task"),
    (("vision", "fusion_methods"), ["simple", "fishr"], "vision.fusion_methods"),
    (("vision", "seeds"), [0, 0], "vision.seeds"),
    (("language", "models"), ["minilmm"], "language.models"),
    (("language", "emotion"), ["rt_d0", "rt_dx"], "language.emotion"),
    (("language", "ner_ood"), "ner_leee", "language.ner_ood"),
    (("language", "matching"), "attn_only_no_rescal", "language.matching"),
    (("language", "fusion_methods"), ["simple", "regmaen"], "language.fusion_methods"),
    (("language", "ner"), ["ner_plot", "ner_plot"], "language.ner"),
    (("decoder", "model"), "llama_minni", "decoder.model"),
    (("decoder", "task"), "lm_englsh", "decoder.task"),
    (("decoder", "seeds"), [1, 1], "decoder.seeds"),
    (("decoder", "fusion_methods"), ["simple", "fishr"], "decoder.fusion_methods"),
    ((None, "experiments_off"), ["fig9_nothing"], "experiments_off"),
]


@pytest.mark.parametrize("where,value,expected", PROFILE_MISTAKES, ids=[m[2] + "-" + str(i) for i, m in enumerate(PROFILE_MISTAKES)])
def test_a_profile_naming_no_conf_file_fails_when_the_workflow_is_read(checkout, tmp_path, where, value, expected):
    name = f"bad{PROFILE_MISTAKES.index((where, value, expected))}"
    profile = checkout / "conf" / "profile" / f"{name}.yaml"
    profile.write_text((checkout / "conf" / "profile" / "smoke.yaml").read_text())
    section, key = where
    edit_yaml(profile, lambda data: (data if section is None else data[section]).__setitem__(key, value))
    run = snakemake(checkout, "-n", "--config", f"profile={name}", f"results_dir={tmp_path / 'r'}",
                    f"figures_dir={tmp_path / 'f'}")
    lines = stderr_lines(run)
    assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], run.stderr
    assert list(tmp_path.iterdir()) == []


REGISTRY_MISTAKES = [
    ("src/symfusion/presets/matching/ffn_only.yaml", lambda d: d.pop("label"),
     "src/symfusion/presets/matching/ffn_only.yaml has no label"),
    ("conf/experiments.yaml", lambda d: d["table2"].__setitem__("writer", "tabel2"), "writer 'tabel2'"),
    ("conf/experiments.yaml", lambda d: d["fig5_barrier"]["inputs"]["vision"]["barriers"].__setitem__(
        "matchings", ["none", "rotaton"]), "matching 'rotaton'"),
    ("conf/experiments.yaml", lambda d: d["fig6_layers"]["inputs"]["lang"].__setitem__("barriers", {}), "has no barriers"),
    ("conf/experiments.yaml", lambda d: d["table1"].__setitem__("titel", "x"), "titel"),
    ("conf/experiments.yaml", lambda d: d["fig3_ablation"].__setitem__("methods", ["simple", "fishr"]), "fishr"),
    ("conf/experiments.yaml", lambda d: d["fig4_distance"]["labels"].__setitem__("attn_only", "x"), "attn_only"),
]


@pytest.mark.parametrize("file,change,expected", REGISTRY_MISTAKES, ids=[m[2] for m in REGISTRY_MISTAKES])
def test_a_registry_mistake_fails_when_the_workflow_is_read(tmp_path, file, change, expected):
    folder = scratch_workflow(tmp_path / "checkout")
    edit_yaml(folder / file, change)
    run = snakemake(folder, "-n", "--config", f"results_dir={tmp_path / 'r'}", f"figures_dir={tmp_path / 'f'}")
    lines = stderr_lines(run)
    assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkout"]


def test_braces_in_the_results_dir_are_refused(tmp_path):
    run = snakemake(ROOT, "-n", "--config", f"results_dir={tmp_path / 'r{x}'}")
    lines = stderr_lines(run)
    assert run.returncode == 2 and len(lines) == 1 and "results_dir" in lines[0] and "braces" in lines[0]
    assert list(Path(tmp_path).iterdir()) == []


@pytest.mark.parametrize("value", ["yes", "Vendor", "avx2"])
def test_a_mistaken_portable_value_is_one_line(tmp_path, value):
    """`--config portable=` takes true, false or vendors (workflow/job_environment.py): anything else is one error line
    naming the key and what it takes, when the workflow is read, nothing written."""
    run = snakemake(ROOT, "-n", "--config", f"portable={value}", f"results_dir={tmp_path / 'r'}",
                    f"figures_dir={tmp_path / 'f'}")
    lines = stderr_lines(run)
    assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), run.stderr
    assert "portable" in lines[0] and "vendors" in lines[0]
    assert list(tmp_path.iterdir()) == []
