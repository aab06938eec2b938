import atexit
import shutil
import subprocess
import tempfile
import time

WORKER_VARIABLE = "SYMFUSION_WORKER"   # read by every stage command (src/symfusion/pipeline/warm.py)


# The warm worker (src/symfusion/pipeline/warm.py), for a run on this machine: one process imports the stages once
# and each job's command runs in a child forked from it (about 5 CPU seconds of imports saved per job).
# `--config warm_worker=false` gives every job its own process again; a cluster's jobs always have their own.
WORKER = {}


def stop_worker(*_):
    process = WORKER.pop("process", None)
    if process is None:
        return
    process.terminate()
    try:
        process.wait(timeout=60)       # reaped here: its CPU time (its jobs' included) counts as this run's
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    socket_path = WORKER.pop("socket")
    if os.path.exists(socket_path):
        os.unlink(socket_path)
    os.rmdir(os.path.dirname(socket_path))
    os.environ.pop(WORKER_VARIABLE, None)


onstart:
    if str(config["warm_worker"]).lower() == "true" and workflow.local_exec and not workflow.touch and shutil.which("symfusion-worker"):
        socket_path = os.path.join(tempfile.mkdtemp(prefix="symfusion-worker-"), "socket")
        os.makedirs(LOGS, exist_ok=True)
        with open(f"{LOGS}/worker.log", "a") as worker_log:
            WORKER.update(socket=socket_path, process=subprocess.Popen(
                ["symfusion-worker", socket_path], env={**os.environ, **JOB_ENV}, stdin=subprocess.DEVNULL,
                stdout=worker_log, stderr=worker_log))
        atexit.register(stop_worker)
        waited = time.monotonic()
        while not os.path.exists(socket_path) and WORKER["process"].poll() is None and time.monotonic() - waited < 120:
            time.sleep(0.1)
        if os.path.exists(socket_path):
            os.environ.update({WORKER_VARIABLE: socket_path})
        else:
            stop_worker()


onsuccess:
    stop_worker()


onerror:
    stop_worker()
