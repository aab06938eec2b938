import atexit
import shutil
import subprocess
import tempfile
import time

WORKER_VARIABLE = "SYMFUSION_WORKER"   # read by every stage command (src/symfusion/pipeline/warm.py)
SOCKET_PATH_MAX = 107                 # sun_path's 108 bytes on Linux, less the terminating NUL


# The warm worker (src/symfusion/pipeline/warm.py), for a run on this machine: one process imports the stages once
# and each job's command runs in a child forked from it (about 5 CPU seconds of imports saved per job).
# `--config warm_worker=false` gives every job its own process again; a cluster's jobs always have their own.
WORKER = {}


def remove_worker_folder():
    """The worker's temp folder (its socket inside) goes with the worker: none is left behind by any run."""
    folder = WORKER.pop("folder", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def stop_worker(*_):
    process = WORKER.pop("process", None)
    if process is not None:
        process.terminate()
        try:
            process.wait(timeout=60)       # reaped here: its CPU time (its jobs' included) counts as this run's
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    remove_worker_folder()
    os.environ.pop(WORKER_VARIABLE, None)


def start_worker():
    """Start symfusion-worker on a socket in a new temp folder; without a log (results/ not writable) or a
    worker, the jobs start their own processes, and the temp folder is removed in every case."""
    try:
        os.makedirs(LOGS, exist_ok=True)
        worker_log = open(f"{LOGS}/worker.log", "a")
    except OSError as error:
        print(f"warm worker off: cannot write {LOGS}/worker.log ({error.strerror}); jobs start their own processes",
              file=sys.stderr)
        return
    atexit.register(stop_worker)
    WORKER["folder"] = tempfile.mkdtemp(prefix="symfusion-worker-")
    socket_path = os.path.join(WORKER["folder"], "socket")
    if len(os.fsencode(socket_path)) > SOCKET_PATH_MAX:   # a long TMPDIR: the worker could not bind its socket
        print(f"warm worker off: {socket_path} is longer than a Unix socket path may be ({SOCKET_PATH_MAX} bytes); "
              "jobs start their own processes (set TMPDIR to a shorter folder to use the worker)", file=sys.stderr)
        stop_worker()
        return
    with worker_log:
        try:
            WORKER["process"] = subprocess.Popen(
                ["symfusion-worker", socket_path], env={**os.environ, **JOB_ENV}, stdin=subprocess.DEVNULL,
                stdout=worker_log, stderr=worker_log)
        except OSError:
            stop_worker()
            return
    waited = time.monotonic()
    while not os.path.exists(socket_path) and WORKER["process"].poll() is None and time.monotonic() - waited < 120:
        time.sleep(0.1)
    if os.path.exists(socket_path):
        os.environ.update({WORKER_VARIABLE: socket_path})
    else:
        stop_worker()


onstart:
    if str(config["warm_worker"]).lower() == "true" and workflow.local_exec and not workflow.touch and shutil.which("symfusion-worker"):
        start_worker()


onsuccess:
    stop_worker()


onerror:
    stop_worker()
