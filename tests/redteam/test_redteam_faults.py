"""Red team, the file system: a full disk (a small tmpfs), read-only folders, permissions (an unprivileged user),
and a kill or Ctrl-C at each step of writing a matched folder, through symfusion-match's entry point and align().

A refusal is exit 2 (SymfusionError), one `error:` line, no traceback, nothing outside the output changed, no
output, no lock or temp; a kill leaves the previous output or the new one, whole, and the next run clears what
the killed writer left. The mounts need root (CI runs as root); elsewhere those tests are skipped, saying so.
"""
from __future__ import annotations

import os
import signal
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

import symfusion
from symfusion.alignment import sharded
from symfusion.io import outputs
from symfusion.pipeline import cli
from symfusion.io.outputs import foreign_entry
from hostile import assert_refused, leftovers, outcome, snapshot
from tiny_decoders import tiny_decoder
from tiny_models import tiny_model

pytestmark = pytest.mark.slow          # children killed mid-write, mounts, dropped capabilities

ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("fault_models")
    tiny_model("bert", seed=1).save_pretrained(str(root / "bert_a"))
    tiny_model("bert", seed=2).save_pretrained(str(root / "bert_b"))
    tiny_decoder("llama", seed=0, num_key_value_heads=2).save_pretrained(str(root / "llama_a"), max_shard_size="40KB")
    tiny_decoder("llama", seed=1, num_key_value_heads=2).save_pretrained(str(root / "llama_b"), max_shard_size="40KB")
    return root


@contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs of `size` mounted at `path` (created), unmounted afterwards; skips the test when not permitted."""
    path.mkdir(parents=True, exist_ok=True)
    if not ROOT:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def match(models: Path, out: Path, source: str = "bert_b", anchor: str = "bert_a"):
    return lambda: cli.match_main([f"source={models / source}", f"anchor={models / anchor}", f"output={out}"])


def align(models: Path, out: Path):
    return lambda: symfusion.align(str(models / "llama_b"), str(models / "llama_a"), output=out)


def complete(out: Path) -> bool:
    """A whole matched folder: its report, and exactly the files its list names."""
    return (out / "match.json").is_file() and foreign_entry(out, "test") is None


@pytest.mark.root
@pytest.mark.parametrize("call", [match, align], ids=["symfusion-match", "align"])
def test_a_full_disk_is_one_line_and_leaves_nothing(models, tmp_path, call):
    with tmpfs(tmp_path / "disk", "48k") as disk:
        out = disk / "new" / "deeper" / "out"                 # the folders it makes go again too
        before = snapshot(models)
        code, text = outcome(call(models, out))
        line = assert_refused(code, text, disk, {}, out, "full disk")
        assert "no space left" in line
        assert snapshot(models) == before and list(disk.iterdir()) == []


@pytest.mark.root
def test_a_full_disk_keeps_the_previous_output(models, tmp_path):
    size = sum(p.stat().st_size for p in (models / "bert_b").iterdir())
    with tmpfs(tmp_path / "disk", f"{int(size * 1.6) // 1024}k") as disk:
        out = disk / "out"
        assert outcome(match(models, out))[0] == 0
        old = snapshot(disk)
        code, text = outcome(match(models, out, source="bert_a", anchor="bert_b"))
        assert code == 2 and "no space left" in text and "Traceback" not in text, text[-1500:]
        assert snapshot(disk) == old and leftovers(out) == []


@pytest.mark.root
def test_read_only_folders(models, tmp_path):
    """Inputs on a read-only file system are read as data (it works); an output there is one line, nothing kept."""
    with tmpfs(tmp_path / "ro", "4m") as ro:
        shutil.copytree(models / "bert_a", ro / "bert_a")
        shutil.copytree(models / "bert_b", ro / "bert_b")
        assert outcome(match(ro, ro / "old"))[0] == 0
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        before = snapshot(ro)
        assert outcome(match(ro, tmp_path / "from_ro"))[0] == 0 and complete(tmp_path / "from_ro")
        for out in (ro / "old", ro / "new"):
            code, text = outcome(match(ro, out))
            assert code == 2 and len(text.strip().splitlines()) == 1 and "writable" in text, text[-1500:]
            assert snapshot(ro) == before


@pytest.mark.root
@pytest.mark.skipif(not ROOT or not shutil.which("setpriv"),
                    reason="needs root and setpriv(1) to run a command without the power to override permissions")
def test_permissions_without_the_power_to_override_them(models, tmp_path):
    """A command that may not override file permissions (root without CAP_DAC_OVERRIDE, as any user is): an output
    folder it may not write, a shard it may not read: one line each, nothing written or left."""
    shutil.copytree(models / "bert_a", tmp_path / "bert_a")
    shutil.copytree(models / "bert_b", tmp_path / "bert_b")
    (tmp_path / "locked").mkdir(mode=0o555)
    (tmp_path / "bert_b" / "model.safetensors").chmod(0o000)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    before = snapshot(tmp_path)
    for source, out, expected in (("bert_a", tmp_path / "locked" / "out", "not writable"),
                                  ("bert_b", tmp_path / "out", "permission denied")):
        result = subprocess.run(
            ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", sys.executable, "-c",
             "from symfusion.pipeline.cli import match_main as m; m()", f"source={tmp_path / source}",
             f"anchor={tmp_path / 'bert_a'}", f"output={out}"],
            capture_output=True, text=True, timeout=300, env=env)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and expected in lines[0].lower(), result.stderr[-1500:]
        assert not out.exists() and leftovers(out) == []
    assert snapshot(tmp_path) == before
    (tmp_path / "locked").chmod(0o755)


# ---------------------------------------------------------------- a kill or Ctrl-C at each step of the write

# (module, attribute): the steps of writing a matched folder; the hook fires when the step is reached
STEPS = [(outputs, "_temp_path"), (sharded.ShardWriter, "write"), (sharded.ShardWriter, "close"),
         (outputs, "swap_in"), (outputs, "exchange"), (outputs.Claim, "release")]
STEP_IDS = ["temp made", "first tensor", "a shard closed", "before the swap", "after the exchange", "before unlock"]


def run_hooked(call, owner, name: str, how: str) -> int:
    """Run call() in a forked child whose step `owner.name` ends it (SIGKILL after the step, or Ctrl-C before it);
    the child's exit status (negative: killed by that signal)."""
    pid = os.fork()
    if pid == 0:                                              # the child: patch, run, never return
        try:
            original = getattr(owner, name)

            def hooked(*args, **kwargs):
                if how == "interrupt":
                    raise KeyboardInterrupt
                result = original(*args, **kwargs)
                os.kill(os.getpid(), signal.SIGKILL)
                return result
            setattr(owner, name, hooked)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.dup2(devnull, 1)
            call()
            os._exit(0)
        except SystemExit as exit_info:
            os._exit(exit_info.code if isinstance(exit_info.code, int) else 1)
        except BaseException:                                 # noqa: BLE001
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


# Ctrl-C at every step but the lock's release, which runs in a `finally` (the hook would replace it, not interrupt it)
CASES = [(step, how) for how in ("kill", "interrupt") for step in range(len(STEPS))
         if not (how == "interrupt" and STEPS[step][0] is outputs.Claim)]


@pytest.mark.parametrize("step,how", CASES, ids=[f"{how} at {STEP_IDS[step]}" for step, how in CASES])
def test_a_kill_or_ctrl_c_at_each_step_of_the_write(models, tmp_path, step, how):
    out = tmp_path / "out"
    assert outcome(match(models, out))[0] == 0                # the previous output
    old = snapshot(tmp_path)
    owner, name = STEPS[step]
    status = run_hooked(match(models, out, source="bert_a", anchor="bert_b"), owner, name, how)
    if how == "interrupt":                                    # Ctrl-C: one line, exit 130, nothing changed at all
        assert status == cli.INTERRUPTED and snapshot(tmp_path) == old and leftovers(out) == [], status
        return
    assert status == -signal.SIGKILL, status
    assert complete(out)                                      # the old output or the new one, whole, never missing
    code, text = outcome(match(models, out, source="bert_a", anchor="bert_b"))     # the next run ...
    assert code == 0, text[-1500:]
    assert complete(out) and leftovers(out) == []             # ... clears what the killed writer left


def test_align_killed_mid_shard_leaves_the_old_folder_and_reruns_clean(models, tmp_path):
    out = tmp_path / "out"
    assert outcome(align(models, out))[0] == "ok"
    old = snapshot(tmp_path)
    assert run_hooked(align(models, out), sharded.ShardWriter, "write", "kill") == -signal.SIGKILL
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith(f".{out.name}.")} == old
    assert outcome(align(models, out))[0] == "ok" and complete(out) and leftovers(out) == []
