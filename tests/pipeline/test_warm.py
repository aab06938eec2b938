"""The warm worker: a command forked from it computes and writes what its own process would, or is refused."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from symfusion.pipeline import warm
from tiny_models import tiny_model

# A worker whose "stages" are a few lines of Python, started as the Snakefile starts symfusion-worker.
TOY_WORKER = """
import os, sys, time
from symfusion.pipeline import warm

def run(command, argv):
    if command == "sleep":
        print("sleeping", flush=True)
        time.sleep(60)
    if command == "fail":
        raise RuntimeError("a bug in a stage")
    if command == "exit":
        sys.exit(int(argv[0]))
    print(f"{command} {' '.join(argv)} in {os.getcwd()} with TOY={os.environ.get('TOY')} threads={os.environ.get('OMP_NUM_THREADS')}")
    return 0

warm.serve(sys.argv[1], run, lambda: None, dict(os.environ))
"""


# pytest's own per-phase variable would differ between the worker's start and a test's commands
BASE_ENV = {k: v for k, v in os.environ.items() if k not in (warm.VARIABLE, "PYTEST_CURRENT_TEST")}


def wait_for(path: Path, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, "the worker exited before it served"
        assert time.monotonic() < deadline, "the worker did not start serving"
        time.sleep(0.05)


@pytest.fixture
def toy_worker(tmp_path):
    socket_path, log = tmp_path / "socket", tmp_path / "worker.log"
    script = tmp_path / "toy_worker.py"
    script.write_text(TOY_WORKER)
    with open(log, "w") as handle:
        process = subprocess.Popen([sys.executable, str(script), str(socket_path)], env=BASE_ENV, stdout=handle,
                                   stderr=handle)
    wait_for(socket_path, process)
    yield socket_path, log, process
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=30)


def client(socket_path, command, *argv, extra_env=None, cwd=None, **kwargs):
    env = {**BASE_ENV, warm.VARIABLE: str(socket_path), **(extra_env or {})}
    code = f"import sys; from symfusion.pipeline import warm; code = warm.run_in_worker({command!r}, {list(argv)!r}); " \
           "print('NOT SERVED', file=sys.stderr) if code is None else sys.exit(code)"
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_a_job_runs_in_a_child_with_its_own_arguments_folder_environment_and_streams(toy_worker, tmp_path):
    socket_path, log, _ = toy_worker
    job = client(socket_path, "echo", "a=1", "b=2", extra_env={"OMP_NUM_THREADS": "3"}, cwd=tmp_path)
    out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    assert out.strip() == f"echo a=1 b=2 in {tmp_path} with TOY=None threads=3"
    assert "symfusion-echo a=1 b=2" in log.read_text() and "(echo): exit 0" in log.read_text()


def test_a_request_larger_than_one_read_arrives_whole(toy_worker):
    job = client(toy_worker[0], "echo", "x" * 70_000, extra_env={"TMPDIR": "/tmp/" + "y" * 100_000})
    out, err = job.communicate(timeout=60)
    assert job.returncode == 0 and out.startswith("echo " + "x" * 70_000 + " in "), err[-300:]


@pytest.mark.parametrize("command,argv,code,message", [
    ("exit", ["2"], 2, ""), ("exit", ["0"], 0, ""), ("fail", [], 1, "RuntimeError: a bug in a stage"),
])
def test_the_command_exits_with_its_childs_exit_code(toy_worker, command, argv, code, message):
    job = client(toy_worker[0], command, *argv)
    _, err = job.communicate(timeout=60)
    assert job.returncode == code and message in err


def test_another_environment_is_refused_and_the_command_runs_in_its_own_process(toy_worker):
    socket_path, log, _ = toy_worker
    job = client(socket_path, "echo", extra_env={"TOY": "1", "TMPDIR": "/tmp"})
    _, err = job.communicate(timeout=60)
    assert "NOT SERVED" in err and "the warm worker did not take this job (another environment: TOY)" in err
    assert "refused echo: another environment: TOY" in log.read_text()
    allowed = client(socket_path, "echo", extra_env={"TMPDIR": "/tmp", "OMP_NUM_THREADS": "1", "SHLVL": "7"})
    assert allowed.communicate(timeout=60)[0].startswith("echo")     # per-job variables are not a difference


def test_refusal_names_what_differs():
    own = {"executable": "/py", "installation": "/site/symfusion"}
    request = {**own, "environment": {"PATH": "/bin", "OMP_NUM_THREADS": "2"}}
    assert warm.refusal(request, environment={"PATH": "/bin"}, **own) is None
    assert "another Python" in warm.refusal({**request, "executable": "/other"}, environment={"PATH": "/bin"}, **own)
    assert "another symfusion" in warm.refusal({**request, "installation": "/x"}, environment={"PATH": "/bin"}, **own)
    assert warm.refusal(request, environment={"PATH": "/usr/bin"}, **own) == "another environment: PATH"
    assert warm.refusal(request, environment={"PATH": "/bin", "HF_HUB_OFFLINE": "1"}, **own) \
        == "another environment: HF_HUB_OFFLINE"


def test_no_worker_means_the_commands_own_process():
    job = client("/nonexistent/socket", "echo")
    assert "NOT SERVED" in job.communicate(timeout=60)[1]


def test_a_job_whose_command_goes_away_is_stopped(toy_worker):
    socket_path, log, _ = toy_worker
    job = client(socket_path, "sleep")
    assert job.stdout.readline().strip() == "sleeping"          # the child runs
    job.kill()
    job.wait()
    deadline = time.monotonic() + 30
    while "(sleep): exit 143" not in log.read_text():          # SIGTERM: 128 + 15
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    assert "its command went away; stopping it" in log.read_text()


def test_the_worker_stops_on_sigterm_removes_its_socket_and_states_its_cpu_time(toy_worker):
    socket_path, log, process = toy_worker
    assert client(socket_path, "echo").wait(timeout=60) == 0
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert not socket_path.exists()
    assert "usage: symfusion-worker user " in log.read_text().splitlines()[-1]


@pytest.mark.slow
def test_a_stage_forked_from_symfusion_worker_writes_the_bytes_its_own_process_writes(tmp_path):
    """The real worker (every stage imported) and symfusion-match, with a user mistake's one-line error."""
    tiny_model("bert", seed=1).save_pretrained(tmp_path / "source", safe_serialization=True)
    tiny_model("bert", seed=2).save_pretrained(tmp_path / "anchor", safe_serialization=True)
    socket_path, log = tmp_path / "socket", tmp_path / "worker.log"
    env = BASE_ENV
    with open(log, "w") as handle:
        process = subprocess.Popen(["symfusion-worker", str(socket_path)], env=env, stdout=handle, stderr=handle)
    try:
        wait_for(socket_path, process)
        outputs = {}
        for name, extra in (("warm", {warm.VARIABLE: str(socket_path)}), ("cold", {})):
            done = subprocess.run(["symfusion-match", f"source={tmp_path / 'source'}", f"anchor={tmp_path / 'anchor'}",
                                   f"output={tmp_path / name}", "matching=rotation"], env={**env, **extra},
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr
            outputs[name] = {p.name: p.read_bytes() for p in (tmp_path / name).glob("*.safetensors")}
        assert outputs["warm"] and outputs["warm"] == outputs["cold"]
        assert f"symfusion-match source={tmp_path / 'source'}" in log.read_text()
        mistake = subprocess.run(["symfusion-match", "source=nowhere", f"anchor={tmp_path / 'anchor'}",
                                  f"output={tmp_path / 'never'}", "matching=rotation"],
                                 env={**env, warm.VARIABLE: str(socket_path)}, capture_output=True, text=True)
        assert mistake.returncode == 2 and mistake.stderr.strip().splitlines() == [
            "error: source=nowhere: no such directory"]
        assert not (tmp_path / "never").exists() and "(match): exit 2" in log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_symfusion_worker_refuses_a_bad_socket_path(tmp_path):
    (tmp_path / "taken").write_text("mine")
    for argv in ([], [str(tmp_path / "taken")], [str(tmp_path / "no" / "folder" / "socket")]):
        done = subprocess.run(["symfusion-worker", *argv], capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1
    assert (tmp_path / "taken").read_text() == "mine"
