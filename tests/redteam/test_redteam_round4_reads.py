"""Red team, round four (issue 55), classes 1, 2 and 4: what a folder names outside itself, readers of special
files, and reports that show only what they were given.

Every function of src/symfusion that opens or lists a file is found by an AST scan and must be in READERS with
the kind of folder it reads and the test that holds it, so a new reader fails here until it has a case.
Class 1: a base model for fine-tuning (symfusion-train's resolve_base, then the text fine-tuner or the decoder's
load_model/load_tokenizer) gets align()'s checks: every hostile folder of hostile.MUTATIONS and the tokenizer
cases below (fast_tokenizer_files, chat templates and links in subfolders, FIFOs) is refused in one line with
nothing written, and an audit hook sees no Python open of a file outside the folder; the files transformers
opens from a good folder are enumerated (OPENED) so a new one fails until it has a case.
Class 2: every reader of a results folder (RESULT_READERS) meets a FIFO, a link to /dev/zero, a link to a FIFO
and an oversized file: one line or a skip, within seconds (an alarm fails a wait).
Class 4: report.md shows only the tables and figures among its inputs.
"""
from __future__ import annotations

import ast
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from symfusion.errors import SymfusionError
from symfusion.io import modelio, outputs, regular
from symfusion.io.modelio import load_model, load_tokenizer
from symfusion.pipeline import cli
from symfusion.pipeline.basemodels import resolve_base
from symfusion.pipeline.report import artefacts, audit, compare, results
from symfusion.pipeline.report.registry import experiment
from symfusion.pipeline.stages.kway import read_line
from symfusion.pipeline.stages.statistics import _open_statistics
from symfusion.pipeline.tasks.text import finetune_text_model
from hostile import ACCEPTED, MUTATIONS, applicable, assert_refused, leftovers, outcome, snapshot
from test_train_text import tokenizer as bert_tokenizer, toy_splits
from tiny_decoders import tiny_decoder
from tiny_models import tiny_model

SRC = Path(__file__).resolve().parents[2] / "src" / "symfusion"
TESTS = Path(__file__).resolve().parents[1]
SECRET = "zzsecretzz"

# ---------------------------------------------------------------- every reader, enumerated

_MODEL = "a model folder's file, through io/folder.py's resolver and modelio.check_model_folder"
_OWN = "a file the project wrote itself, marked (tests/redteam/test_redteam_bookkeeping.py)"
_PACKAGE = "a file shipped with symfusion or an installed package (conf/, presets, a package's model), not a user's"
_DATA = "a dataset file or the data cache (class 7 of issue 55)"
# module:function -> (what it reads, the test that holds it). A function that reads only through io/folder.py's
# read_json or model_file (stages.common:matching_of, stages.evaluate:model_origin) reads through the resolver.
READERS = {
    **{f"symfusion.io.folder:{f}": (_MODEL, "test_every_hostile_folder_is_refused_as_a_base") for f in
       ("read_json", "shard_header")},
    **{f"symfusion.io.modelio:{f}": (_MODEL, "test_every_hostile_folder_is_refused_as_a_base") for f in
       ("_from_pretrained", "check_claims", "check_model_folder", "load_config", "copy_auxiliary_files")},
    "symfusion.io.modelio:_tokenizer": (_MODEL, "test_a_tokenizer_reaches_nothing_outside_its_folder"),
    "symfusion.alignment.checks:whole_model_change": (_MODEL, "test_every_hostile_folder_is_refused_as_a_base"),
    "symfusion.alignment.sharded:data_order": (_MODEL, "test_every_hostile_folder_is_refused_as_a_base"),
    "symfusion.alignment.sharded:handle": (_MODEL, "test_every_hostile_folder_is_refused_as_a_base"),
    "symfusion.pipeline.basemodels:safetensors_weights": (_MODEL, "test_every_hostile_folder_is_refused_as_a_base"),
    "symfusion.pipeline.stages.statistics:_open_statistics": ("a statistics file given to a merge",
                                                              "test_results_readers_never_wait_on_special_files"),
    "symfusion.pipeline.stages.kway:read_line": ("the end models' line given to symfusion-kway (line=)",
                                                 "test_results_readers_never_wait_on_special_files"),
    **{f"symfusion.io.marks:{f}": (_OWN, "test_every_writer_has_a_case") for f in
       ("open_lock", "read_own", "unmarked_leftover")},
    **{f"symfusion.io.outputs:{f}": (_OWN, "test_results_readers_never_wait_on_special_files") for f in
       ("foreign_entry", "json_marker")},
    **{f"symfusion.io.outputs:{f}": ("lists an output's folder (names and sizes; nothing opened)",
                                     "test_every_writer_has_a_case") for f in ("_listing", "recover_leftovers")},
    "symfusion.pipeline.training:load_checkpoint": (_OWN, "test_a_checkpoint_name_that_is_not_the_trainers_is_refused"),
    "symfusion.pipeline.revisions:read_lock": (_OWN, "test_the_hub_lock_file_is_never_written_through_a_planted_name"),
    **{f"symfusion.pipeline.basemodels:{f}": (_OWN, "test_model_caches_are_reused_only_when_this_users") for f in
       ("gguf_folder", "gguf_llama_config", "hub_folder", "file_sha256")},
    **{f"symfusion.pipeline.report.{f}": (_PACKAGE, "test_every_reader_has_a_case") for f in
       ("results:read_paper_table", "registry:experiments")},
    **{f: (_PACKAGE, "test_every_reader_has_a_case") for f in (
        "symfusion.pipeline.config:profile_sources", "symfusion.io.provenance:cpu_model",
        "symfusion.presets.catalog:names", "symfusion.presets.catalog:read")},   # catalog: every preset and conf group
    "symfusion.symmetry:load": (_MODEL, "test_every_reader_has_a_case"),
    **{f: (_DATA, "test_every_reader_has_a_case") for f in (
        "symfusion.pipeline.data.hub:load_hub_images", "symfusion.pipeline.data.standins.__init__:_check_output",
        "symfusion.pipeline.data.standins.__init__:_file_hashes", "symfusion.pipeline.data.standins.__init__:_sha256",
        "symfusion.pipeline.data.standins.__init__:_up_to_date", "symfusion.pipeline.data.standins.__init__:build_standins",
        "symfusion.pipeline.data.standins.__init__:load_manifest", "symfusion.pipeline.data.standins.datasets:corpus_sentences",
        "symfusion.pipeline.data.standins.models:train_bpe", "symfusion.pipeline.data.text.corpora:_read_lines_latin1",
        "symfusion.pipeline.data.text.corpora:load_lee_similarity", "symfusion.pipeline.data.text.hub:_load")},
    **{f"symfusion.pipeline.report.{f}": ("a results folder's file (class 2)",
                                          "test_results_readers_never_wait_on_special_files") for f in (
        "audit:run_provenance", "audit:table_section", "compare:figures_of", "compare:load_table", "compare:mkl_path",
        "compare:recorded_tolerances", "results:is_report_output", "results:read_csv_rows", "results:read_json")},
}
_CALLS = {"from_pretrained", "safe_open", "load_file", "read_text", "read_bytes", "safe_load", "glob", "rglob",
          "iterdir", "walk", "scandir", "listdir", "read_csv", "read_parquet", "from_file", "loadtxt",
          "read_gguf_metadata", "load_dataset", "snapshot_download", "read_regular", "read_regular_text", "is_regular"}


def _reads(call: ast.Call) -> bool:
    """Whether a call opens, reads or lists a file or folder (a write-only open does not count)."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
    if name == "open":
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        return owner == "os" or not (isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wxa"))
    if name == "load":
        return owner in ("json", "torch", "np", "yaml", "pickle")
    return name in _CALLS


def scanned_readers() -> set[str]:
    """module:function of every function in src/symfusion that opens, reads or lists a file (io.regular aside:
    it is the bounded reader the others use)."""
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        if module == "symfusion.io.regular":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    isinstance(c, ast.Call) and _reads(c) for c in ast.walk(node)):
                found.add(f"{module}:{node.name}")
    return found


def test_every_reader_has_a_case():
    """A new function that opens or lists a file fails here until READERS says what it reads and which test
    holds it; every test named exists."""
    found = scanned_readers()
    assert sorted(found - set(READERS)) == [], "readers without a case: add them to READERS with their test"
    assert sorted(set(READERS) - found) == [], "READERS names functions that no longer read"
    defined = {node.name for path in TESTS.rglob("test_*.py") for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.FunctionDef)}
    assert sorted({test for _, test in READERS.values()} - defined) == []


# ---------------------------------------------------------------- watching what is opened

OPENED: list[str] = []
_WATCHING = [False]


def _audit(event, args):
    if _WATCHING[0] and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


@contextmanager
def watching():
    """Record every path Python opens meanwhile (transformers' own reads included; Rust readers are not seen)."""
    OPENED.clear()
    _WATCHING[0] = True
    try:
        yield OPENED
    finally:
        _WATCHING[0] = False


def _address_space() -> int:
    """This process's virtual memory size in bytes (VmSize)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmSize:"))
    return int(line.split()[1]) * 1024


@contextmanager
def no_wait(seconds: int = 20, fifos: Path | None = None):
    """Fail (instead of hanging or exhausting memory) when the body waits longer than `seconds` or reads a device
    without end: an alarm for Python-level waits; after `seconds` a child process opens every FIFO under `fifos`
    (made before the body) as a writer, so a reader blocked in a library's open that holds the GIL (deaf to
    signals and threads) wakes and the test fails; the address space may grow by 2 GiB at most (/dev/zero read to
    the end is a MemoryError, not the machine's memory)."""
    def expire(*_):
        raise TimeoutError(f"waited {seconds} s: a reader blocked")
    found = [str(p) for p in fifos.rglob("*") if p.is_fifo()] if fifos is not None else []
    waker = subprocess.Popen(["sh", "-c", f'sleep {seconds}; echo woke; for f; do exec 3<>"$f"; exec 3>&-; done',
                              "sh", *found], stdout=subprocess.PIPE, text=True, start_new_session=True)
    previous = signal.signal(signal.SIGALRM, expire)
    limits = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + 2 * 2**30, limits[1]))
    signal.alarm(seconds + 5)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, limits)
        signal.signal(signal.SIGALRM, previous)
        os.killpg(waker.pid, signal.SIGKILL)              # sh and its sleep
        woke = waker.communicate()[0]
    assert "woke" not in woke, f"waited {seconds} s: a reader blocked on a FIFO"


# ---------------------------------------------------------------- class 1: a base model's folder

@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """A sharded tiny BERT with its tokenizer (the text fine-tune's base), a sharded tiny Llama with the same
    tokenizer (the decoder's base), and a folder `outside` holding a rogue tokenizer and a secret."""
    root = tmp_path_factory.mktemp("bases")
    torch.manual_seed(0)
    tiny_model("bert", seed=1, head=None).save_pretrained(str(root / "bert"), max_shard_size="20KB")
    tiny_decoder("llama", seed=0, num_key_value_heads=2).save_pretrained(str(root / "llama"), max_shard_size="40KB")
    for name in ("bert", "llama"):
        bert_tokenizer().save_pretrained(str(root / name))
    return root


def _outside(world: Path, base: Path) -> Path:
    """world/outside: a secret and a tokenizer.json whose first word is the secret."""
    outside = world / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "secret.txt").write_text(f"{SECRET}\n")
    rogue = json.loads((base / "tokenizer.json").read_text())
    vocab = rogue["model"]["vocab"]
    vocab[SECRET] = vocab.pop("the")
    (outside / "tokenizer.4.0.json").write_text(json.dumps(rogue))
    return outside


def _tokenizer_config(folder: Path, **fields) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(fields)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def fast_files_traverse(folder, outside):
    _tokenizer_config(folder, fast_tokenizer_files=["../outside/tokenizer.4.0.json"])


def fast_files_absolute(folder, outside):
    _tokenizer_config(folder, fast_tokenizer_files=[str(outside / "tokenizer.4.0.json")])


def fast_files_not_names(folder, outside):
    _tokenizer_config(folder, fast_tokenizer_files=[{"file": "tokenizer.json"}])


def chat_template_in_a_subfolder_links_out(folder, outside):
    (folder / "additional_chat_templates").mkdir()
    os.symlink(outside / "secret.txt", folder / "additional_chat_templates" / "evil.jinja")


def subfolder_is_a_link_out(folder, outside):
    os.symlink(outside, folder / "additional_chat_templates")


def deep_link_out(folder, outside):
    (folder / "a" / "b").mkdir(parents=True)
    os.symlink(outside / "secret.txt", folder / "a" / "b" / "vocab.txt")


def chat_template_is_a_fifo(folder, outside):
    os.mkfifo(folder / "chat_template.jinja")


def fifo_in_a_subfolder(folder, outside):
    (folder / "additional_chat_templates").mkdir()
    os.mkfifo(folder / "additional_chat_templates" / "evil.jinja")


def chat_template_links_to_a_device(folder, outside):
    os.symlink("/dev/zero", folder / "chat_template.jinja")


def tokenizer_config_links_out(folder, outside):
    (outside / "tokenizer_config.json").write_text((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").unlink()
    os.symlink(outside / "tokenizer_config.json", folder / "tokenizer_config.json")


TOKENIZER_CASES = [fast_files_traverse, fast_files_absolute, fast_files_not_names, chat_template_in_a_subfolder_links_out,
                   subfolder_is_a_link_out, deep_link_out, chat_template_is_a_fifo, fifo_in_a_subfolder,
                   chat_template_links_to_a_device, tokenizer_config_links_out]


def vocab_file_outside(folder, outside):
    """Keys transformers >= 5 replaces by the folder's own files: accepted, and the outside file is never read."""
    _tokenizer_config(folder, vocab_file=str(outside / "secret.txt"), tokenizer_file=str(outside / "tokenizer.4.0.json"))


ACCEPTED_TOKENIZER = [vocab_file_outside]


def fine_tune(base: Path, out: Path):
    """What symfusion-train does with a text task's base model: resolve_base, then the fine-tuner (one epoch)."""
    folder = resolve_base(str(base)).folder
    return finetune_text_model(str(out), folder, toy_splits("text_classification", 32, 16), seed=0, epochs=1,
                               batch_size=16, lr=1e-3, weight_decay=0.0, warmup_ratio=0.0, max_length=16,
                               metric="macro_f1", eval_batch_size=16)


def decoder_base(base: Path, out: Path):
    """What symfusion-train does with a causal_lm task's base model before training: resolve_base, its tokenizer
    and its weights (nothing written: `out` stays absent)."""
    folder = resolve_base(str(base)).folder
    load_tokenizer(folder)
    load_model(folder)


READERS_OF_A_BASE = {"text fine-tune": ("bert", fine_tune), "decoder base": ("llama", decoder_base)}


def _hostile_copy(bases: Path, tmp_path: Path, kind: str, mutation) -> tuple[Path, Path, Path]:
    world = tmp_path / "world"
    world.mkdir()
    base = world / "base"
    shutil.copytree(bases / kind, base)
    outside = _outside(world, base)
    if mutation.__name__ == "tokenizer_link_outside":  # hostile's link takes the place of the folder's own file
        (base / "tokenizer.json").unlink()
    mutation(base, outside)
    return world, base, outside


def _refused_reading_nothing_outside(world, base, outside, call, what):
    out = world / "out"
    before = snapshot(world, out)
    modelio._tokenizer.cache_clear()                    # a fresh read of this folder's tokenizer
    with no_wait(20, world), watching() as opened:
        code, text = outcome(lambda: call(base, out))
    line = assert_refused(code, text, world, before, out, what)
    reached = [p for p in opened if Path(os.path.realpath(p)).is_relative_to(os.path.realpath(outside))]
    assert reached == [], f"{what}: opened {reached[:3]} outside the folder"
    return line


CASES = [(kind, m) for kind, ms in MUTATIONS.items() for m in ms] + [("tokenizer", m) for m in TOKENIZER_CASES]


@pytest.mark.parametrize("reader", list(READERS_OF_A_BASE))
@pytest.mark.parametrize("kind,mutation", CASES, ids=[f"{k}-{m.__name__}" for k, m in CASES])
def test_every_hostile_folder_is_refused_as_a_base(bases, tmp_path, reader, kind, mutation):
    """Every hostile change of hostile.MUTATIONS and TOKENIZER_CASES to a fine-tuning base: one line, exit 2,
    nothing written, no Python open of a file outside the folder."""
    family, call = READERS_OF_A_BASE[reader]
    if not applicable(mutation, bases / family):
        pytest.skip("an index mutation of a single-file folder")
    world, base, outside = _hostile_copy(bases, tmp_path, family, mutation)
    if getattr(mutation, "readers", None) is not None:     # refused only by writers that keep the shard names
        modelio._tokenizer.cache_clear()
        assert outcome(lambda: call(base, world / "out"))[0] == "ok"
        return
    _refused_reading_nothing_outside(world, base, outside, call, f"{reader}: {mutation.__name__}")


@pytest.mark.parametrize("mutation", ACCEPTED + ACCEPTED_TOKENIZER, ids=lambda m: m.__name__)
def test_a_tokenizer_reaches_nothing_outside_its_folder(bases, tmp_path, mutation):
    """Changes a correct fine-tune accepts: it trains, and nothing from outside the folder is read by Python nor
    found in the output (the secret word would be in the saved vocabulary)."""
    world, base, outside = _hostile_copy(bases, tmp_path, "bert", mutation)
    modelio._tokenizer.cache_clear()
    with watching() as opened:
        fine_tune(base, world / "out")
    assert [p for p in opened if Path(os.path.realpath(p)).is_relative_to(os.path.realpath(outside))] == []
    written = b"".join(p.read_bytes() for p in (world / "out").rglob("*") if p.is_file())
    assert SECRET.encode() not in written and (world / "out" / "model.safetensors").is_file()


# Files transformers opens by Python's open from a good base folder (tokenizer.json and the weights are read by
# Rust: tokenizers and safetensors, checked by check_model_folder and io/folder.py). A new one fails here.
OPENED_NAMES = {"config.json", "tokenizer_config.json", "special_tokens_map.json", "model.safetensors.index.json",
                "vocab.txt", "tokenizer.json"}


def test_the_files_transformers_opens_from_a_base_are_enumerated(bases, tmp_path):
    """Every file Python opens in a good base folder during a fine-tune is one of OPENED_NAMES, each of which
    a case above makes hostile (the enumeration of 'every place transformers opens a file on our behalf')."""
    modelio._tokenizer.cache_clear()
    with watching() as opened:
        fine_tune(bases / "bert", tmp_path / "out")
    base = os.path.realpath(bases / "bert")
    shards = set(json.loads((bases / "bert" / "model.safetensors.index.json").read_text())["weight_map"].values())
    names = {os.path.relpath(os.path.realpath(p), base) for p in opened if os.path.realpath(p).startswith(base + os.sep)}
    names -= shards                                     # the index's shards: io/folder.py's resolver
    assert names and names <= OPENED_NAMES, f"new files opened from a base folder: {sorted(names - OPENED_NAMES)}"


# ---------------------------------------------------------------- class 2: readers of results folders


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _link_to_zero(path: Path) -> None:
    os.symlink("/dev/zero", path)


def _link_to_fifo(path: Path) -> None:
    os.mkfifo(path.parent / f".{path.name}.fifo")
    os.symlink(path.parent / f".{path.name}.fifo", path)


def _oversized(path: Path) -> None:
    with open(path, "wb") as handle:                    # sparse: no disk used
        handle.truncate(regular.RESULT_BYTES + 1)


SPECIALS = {"fifo": _fifo, "link to /dev/zero": _link_to_zero, "link to a fifo": _link_to_fifo,
            "oversized": _oversized}
_REFUSED = (SymfusionError, compare.Malformed)
# reader (as READERS names it) -> (the file name it reads under a folder, call(folder) -> result, what it must give:
# "refused" (one SymfusionError line) or the value of a skip)
RESULT_READERS = {
    "symfusion.pipeline.report.results:read_json": ("stage.json", lambda d: results.read_json(d / "stage.json"), "refused"),
    "symfusion.pipeline.report.results:read_csv_rows": ("t.csv", lambda d: results.read_csv_rows(d / "t.csv"), "refused"),
    "symfusion.pipeline.report.results:is_report_output": ("t.md", lambda d: results.is_report_output(d / "t.md"), False),
    "symfusion.pipeline.report.audit:table_section": (
        "table2.md", lambda d: audit.table_section(d, experiment("table2"), audit.given([str(d / "table2.csv")])),
        "refused"),
    "symfusion.pipeline.report.audit:run_provenance": ("stage.json", audit.run_provenance, {}),
    "symfusion.pipeline.report.compare:load_table": ("t.csv", lambda d: compare.load_table(d / "t.csv"), "refused"),
    "symfusion.pipeline.report.compare:mkl_path": ("provenance.json", compare.mkl_path, None),
    "symfusion.pipeline.report.compare:figures_of": ("report.md", compare.figures_of, None),
    "symfusion.pipeline.report.compare:recorded_tolerances": ("tolerances.yaml", compare.recorded_tolerances, "refused"),
    "symfusion.io.outputs:json_marker": ("out.json", lambda d: outputs.json_marker(d / "out.json", ()), False),
    "symfusion.io.outputs:foreign_entry": (outputs.FILES_LIST, lambda d: outputs.foreign_entry(d, "stage") is not None,
                                           True),
    "symfusion.pipeline.stages.statistics:_open_statistics": (
        "stats.safetensors", lambda d: _open_statistics(d / "stats.safetensors"), None),
    "symfusion.pipeline.stages.kway:read_line": (
        "ends.json", lambda d: read_line(str(d / "ends.json"), [], SimpleNamespace(name="digits"), None), "refused"),
}


def test_every_results_reader_has_a_special_file_case():
    """Every reader READERS sends to the special-file test has a case in RESULT_READERS, and no other."""
    sent = {f for f, (_, test) in READERS.items() if test == "test_results_readers_never_wait_on_special_files"}
    assert sent == set(RESULT_READERS)


@pytest.mark.parametrize("special", list(SPECIALS))
@pytest.mark.parametrize("reader", list(RESULT_READERS))
def test_results_readers_never_wait_on_special_files(tmp_path, reader, special):
    """A FIFO, a link to /dev/zero, a link to a FIFO or an oversized file where a reader expects a result: one
    SymfusionError line or a skip, within seconds, never read into memory."""
    name, call, expected = RESULT_READERS[reader]
    SPECIALS[special](tmp_path / name)
    with no_wait(10, tmp_path):
        try:
            got = call(tmp_path)
        except _REFUSED as error:
            assert expected == "refused", f"{reader} refused {special} where it should skip it: {error}"
            assert len(str(error).strip().splitlines()) == 1 and str(tmp_path) in str(error)
            return
    assert expected != "refused" and got == expected, f"{reader} read {special}: {got!r}"


def test_report_and_compare_never_wait_on_special_files(tmp_path, capsys, monkeypatch):
    """Through the real entry points: symfusion-report given a FIFO as an input refuses in one line; the audit
    report with a FIFO among the results folder's JSON files is written; symfusion-compare with a FIFO table."""
    monkeypatch.chdir(tmp_path)
    results_dir = tmp_path / "results" / "mini"
    results_dir.mkdir(parents=True)
    os.mkfifo(results_dir / "stage.json")
    (tmp_path / "note.txt").write_text("an input\n")
    os.mkfifo(results_dir / "table2.csv")                 # not an input of the report: never opened by it
    with no_wait(30, tmp_path):
        code, text = outcome(lambda: cli.report_main(["artefact=table2", f"inputs=[{results_dir / 'stage.json'}]",
                                                      f"output={tmp_path / 'table2.csv'}"]))
        err = text.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("error:") and "not a regular file" in err[0]
        assert not (tmp_path / "table2.csv").exists() and leftovers(tmp_path / "table2.csv") == []
        code, text = outcome(lambda: cli.report_main(["artefact=report", f"inputs=[{tmp_path / 'note.txt'}]",
                                                      f"output={results_dir / 'report.md'}"]))
        assert code in (0, "ok") and (results_dir / "report.md").is_file(), text
        reference = tmp_path / "reference"
        shutil.copytree(results_dir, reference, symlinks=True, ignore=lambda d, names: [
            n for n in names if not (Path(d) / n).is_file()])
        (reference / "table2.csv").write_text("a,b\n1,2\n")
        code, text = outcome(lambda: compare.main([str(results_dir), "--reference", str(reference),
                                                   "--figures", str(tmp_path), "--only", "table2.csv"]))
    out = capsys.readouterr().out + text
    assert "table2" in out and "regular file" in out, out


# ---------------------------------------------------------------- class 4: a report shows what it was given


def test_a_report_shows_only_the_artefacts_it_was_given(tmp_path, capsys, monkeypatch):
    """A table's CSV and Markdown and a figure's PNG lying in the results and figures folders, not among the
    report's inputs, are not shown nor summarised; given, the same table is shown (the test can fail)."""
    monkeypatch.chdir(tmp_path)
    results_dir, figures = tmp_path / "results" / "mini", tmp_path / "figures" / "mini"
    results_dir.mkdir(parents=True)
    figures.mkdir(parents=True)
    (results_dir / "table2.csv").write_text("not,the,table\n")            # would fail table2's summary if read
    (results_dir / "table2.md").write_text("# Table 2\n\nPLANTED-TABLE\n")
    (figures / "fig5_barrier.png").write_bytes(b"\x89PNG planted")
    (figures / "fig5_barrier.csv").write_text("not,the,figure\n")
    (tmp_path / "note.txt").write_text("an input\n")
    output = results_dir / "report.md"
    code, text = outcome(lambda: cli.report_main(["artefact=report", f"inputs=[{tmp_path / 'note.txt'}]",
                                                  f"output={output}"]))
    assert code in (0, "ok"), text
    text = output.read_text()
    assert "PLANTED-TABLE" not in text and "fig5_barrier.png" not in text
    assert "Not produced in this profile" in text.split(experiment("table2").title)[1].split("## ")[0]
    given = audit.table_section(results_dir, experiment("table2"), audit.given([str(results_dir / "table2.csv")]))
    assert "PLANTED-TABLE" in given
    assert artefacts.summary_lines(results_dir, figures, audit.given([str(tmp_path / "note.txt")])) == []
