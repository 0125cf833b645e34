"""`hashdist evaluate --cluster-class dask_jobqueue.SLURMCluster` against a real SLURM.

The test starts a one-node SLURM cluster of its own on 127.0.0.1 (munged, slurmctld, slurmd from Debian's
slurm-wlm, configured in a temporary directory), runs the CLI with per-run SLURM jobs as its Dask workers, and
compares the report's metrics with ``--engine local``'s. Every process it starts, the batch jobs' included, ends
with it. It is skipped only where SLURM is not installed or cannot run (no root for slurmd).
"""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, free_port, listening_sockets

CORES = min(2, os.cpu_count() or 1)  # each job's threads: what the node has, at most 2
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sinfo", "squeue", "sbatch", "scancel")
# the daemons live in /usr/sbin, which a non-login PATH may lack
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _which(name: str) -> str | None:
    return shutil.which(name, path=SEARCH_PATH)


def _node_line() -> str:
    """This machine's CPUs and memory as slurmd itself detects them (``slurmd -C``), for NodeName=localhost."""
    out = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True, timeout=30, check=True).stdout
    fields = dict(f.split("=", 1) for f in out.split()[:8] if "=" in f)
    keep = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    return "NodeName=localhost NodeAddr=127.0.0.1 " + " ".join(f"{k}={fields[k]}" for k in keep) + " State=UNKNOWN"


def _slurm_conf(root: Path, munge_socket: Path, node: str) -> str:
    return "\n".join([
        "ClusterName=hashdist-test",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        # slurmctld and slurmd on NodeAddr / SlurmctldHost's address (127.0.0.1), not on every address
        "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
        # SLURM 22.05 (Debian 12) has no auth/slurm: munge, through the test's own munged
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SchedulerType=sched/builtin",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ReturnToService=2",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        node,
        "PartitionName=hashdist Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _logs(root: Path) -> str:
    text = []
    for log in sorted((root / "log").glob("*")):
        lines = log.read_text(errors="replace").splitlines()[-15:]
        text.append(f"--- {log.name}\n" + "\n".join(lines))
    return "\n".join(text)


def _jobs(env) -> list[str]:
    out = subprocess.run([_which("squeue"), "-h", "-o", "%i %T"], env=env, capture_output=True, text=True, timeout=30)
    return out.stdout.splitlines() if out.returncode == 0 else []


def _queue_empties(env) -> bool:
    """Whether SLURM's queue is empty within 30 s (a cluster cancels its jobs as the run ends)."""
    deadline = time.monotonic() + 30
    while _jobs(env) and time.monotonic() < deadline:
        time.sleep(0.5)
    return _jobs(env) == []


def _pending_job_kwargs(tmp_path) -> dict:
    """SLURMCluster arguments whose one job SLURM accepts but keeps pending for 10 minutes."""
    return {"n_workers": 1, "cores": 1, "memory": "1GiB", "queue": "hashdist", "interface": "lo",
            "scheduler_options": {"dashboard_address": "127.0.0.1:0"}, "log_directory": str(tmp_path / "jobs"),
            "job_extra_directives": ["--begin=now+600"]}


def _cmdline(pid: int) -> str:
    """The command line of process ``pid`` ("" once it has exited)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _processes_under(directory: Path) -> list[int]:
    """Processes whose command line names ``directory`` (the batch jobs' workers and their job scripts)."""
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and int(entry.name) != os.getpid() and str(directory) in _cmdline(int(entry.name))]


def _stop(procs) -> None:
    for p in procs[::-1]:
        if p.poll() is None:
            p.terminate()
    for p in procs[::-1]:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


@pytest.fixture
def slurm(tmp_path):
    """A one-node SLURM cluster on 127.0.0.1: yields the environment (SLURM_CONF) its clients need."""
    missing = [name for name in DAEMONS + CLIENTS if _which(name) is None]
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} not found): apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root to start jobs (CI runs as root)")
    if importlib.util.find_spec("dask_jobqueue") is None:
        pytest.fail("dask-jobqueue is not installed: pip install -e '.[cluster]' (the test extra should bring it)")
    root = tmp_path / "slurm"
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir(parents=True)
    node = _node_line()
    # munged wants its socket's directory and every parent searchable by all, which pytest's base directory
    # (mode 700) is not: its files go to a directory of their own in the system's temporary directory
    munge = Path(tempfile.mkdtemp(prefix="hashdist-munge-"))
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf"), "PATH": SEARCH_PATH}
    procs = []

    def start(name, *args):
        with open(root / "log" / f"{name}.out", "wb") as log:
            procs.append(subprocess.Popen([_which(name), *args], env=env, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT))

    try:
        munge.chmod(0o755)
        key, sock = munge / "munge.key", munge / "socket"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        (root / "slurm.conf").write_text(_slurm_conf(root, sock, node))
        start("munged", "--foreground", f"--key-file={key}", f"--socket={sock}", f"--pid-file={munge / 'pid'}",
              f"--log-file={root / 'log' / 'munged.log'}", f"--seed-file={munge / 'seed'}", "--num-threads=2")
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert procs[0].poll() is None and time.monotonic() < deadline, "munged did not start\n" + _logs(root)
            time.sleep(0.1)
        start("slurmctld", "-D")
        start("slurmd", "-D", "-N", "localhost")
        deadline, state = time.monotonic() + 60, ""
        while state != "idle":
            assert all(p.poll() is None for p in procs), "a SLURM daemon exited\n" + _logs(root)
            assert time.monotonic() < deadline, f"the node is not idle after 60 s ({state!r})\n" + _logs(root)
            time.sleep(0.5)
            out = subprocess.run([_which("sinfo"), "-h", "-n", "localhost", "-o", "%t"], env=env,
                                 capture_output=True, text=True, timeout=30)
            state = out.stdout.strip()
        daemons = set().union(*(listening_sockets(p.pid) for p in procs[1:]))
        assert len(daemons) >= 2 and {address for address, _ in daemons} == {"127.0.0.1"}, daemons
        yield env
    finally:
        try:
            if len(procs) == 3 and _jobs(env):
                subprocess.run([_which("scancel"), "--partition=hashdist"], env=env, timeout=30)
                deadline = time.monotonic() + 30
                while _jobs(env) and time.monotonic() < deadline:
                    time.sleep(0.5)
        finally:
            _stop(procs)
            # a job's processes outlive a stopped slurmd: end any left (by pid; their command lines name tmp_path)
            for pid in _processes_under(tmp_path):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(munge, ignore_errors=True)


def _command(dataset, out, *args):
    return [str(BIN / "hashdist"), "evaluate", str(dataset), "--out", str(out), "--no-html", "--quiet",
            "--query-block-rows", "64", "--db-block-rows", "1000", *args]


def _evaluate(dataset, out, env, *args, cwd=None):
    cmd = _command(dataset, out, *args)
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd)}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return json.loads((Path(out) / "report.json").read_text())


def _evaluate_on_slurm(dataset, out, env, jobs: Path, *args):
    """``_evaluate`` in ``jobs``, watching what the CLI and its batch jobs' Dask workers (whose command lines name
    the test's directory, ``jobs.parent``) listen on: returns the report and the (address, port) pairs seen in
    the jobs."""
    cmd = _command(dataset, out, *args)
    job_sockets = set()
    with open(jobs.parent / "cli.out", "w+") as output:
        cli = subprocess.Popen(cmd, env=env, cwd=jobs, stdout=output, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 600
            while cli.poll() is None and time.monotonic() < deadline:
                own = listening_sockets(cli.pid)
                assert {address for address, _ in own} <= {"127.0.0.1"}, own
                job_sockets |= set().union(*(listening_sockets(pid) for pid in _processes_under(jobs.parent)
                                             if pid != cli.pid and "dask_worker" in _cmdline(pid)))
                time.sleep(0.05)
            returncode = cli.wait(timeout=60)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait(timeout=30)
        output.seek(0)
        assert returncode == 0, f"{' '.join(cmd)}\n{output.read()}"
    return json.loads((Path(out) / "report.json").read_text()), job_sockets


@pytest.fixture(scope="module")
def local_report(tmp_path_factory):
    """A small multi-label dataset made by `hashdist synth`, and its `--engine local` report."""
    directory = tmp_path_factory.mktemp("slurm-data")
    dataset = directory / "data.zarr"
    subprocess.run([str(BIN / "hashdist"), "synth", "--n-database", "4000", "--n-queries", "300", "--nbits", "32",
                    "--labels", "multilabel", "--n-concepts", "12", "--collision", "0.3", "--chunk-rows", "1000",
                    "--seed", "3", "--out", str(dataset)], check=True, capture_output=True, timeout=300)
    return dataset, _evaluate(dataset, directory / "local", os.environ, "--engine", "local", "--no-cache")


def _run_env(cli_env, slurm, tmp_path):
    """The CLI's environment with the test cluster's SLURM_CONF; what sbatch passes on to the jobs."""
    (tmp_path / "tmp").mkdir()
    # the CLI sets distributed's logging to warning unless told otherwise: the workers' INFO lines name the scheduler
    return {**cli_env, "SLURM_CONF": slurm["SLURM_CONF"], "PATH": slurm["PATH"], "TMPDIR": str(tmp_path / "tmp"),
            "DASK_LOGGING__DISTRIBUTED": "info"}


def _check_slurm_run(report, local, slurm, jobs, threads, scheduler, job_sockets):
    assert report["metrics"] == local["metrics"]
    # the job's nanny and worker: their comm ports and the worker's HTTP server, all on 127.0.0.1
    assert len(job_sockets) >= 3 and {address for address, _ in job_sockets} == {"127.0.0.1"}, job_sockets
    assert report["engine"]["kind"] == "prefect-dask"
    assert report["blocks"]["computed"] == report["blocks"]["total"] > 1  # computed by the job, not cached
    assert report["engine"]["threads"] == threads  # the job's worker threads, not those there when the run began
    # the worker ran as a SLURM job (job 1), logging to the job directory, and registered with the run's scheduler
    # on 127.0.0.1; the cluster cancelled the job when the run ended
    logs = list(jobs.glob("*-1.err"))
    assert len(logs) == 1, sorted(p.name for p in jobs.iterdir())
    log = logs[0].read_text(errors="replace")
    assert f"Registered to: {scheduler}127.0.0.1:" in " ".join(log.split()), log
    assert _queue_empties(slurm), "the per-run cluster left its SLURM job running"


def test_slurm_cluster_from_cluster_kwargs(slurm, tmp_path, cli_env, local_report):
    """Everything in --cluster-kwargs, loopback only: the scheduler, its dashboard and the worker on 127.0.0.1."""
    dataset, local = local_report
    env = _run_env(cli_env, slurm, tmp_path)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    kwargs = {
        "n_workers": 1,
        "cores": CORES,
        "processes": 1,
        "memory": "2GiB",
        "walltime": "00:10:00",
        "queue": "hashdist",
        "python": sys.executable,  # the venv's python runs the worker in the batch job
        "interface": "lo",  # scheduler and worker on 127.0.0.1 only
        "scheduler_options": {"dashboard_address": "127.0.0.1:0"},
        "worker_extra_args": ["--dashboard-address", "127.0.0.1:0"],  # the worker's HTTP server too
        "local_directory": str(tmp_path / "worker-space"),
        "log_directory": str(jobs),
        "death_timeout": 30,
    }
    report, job_sockets = _evaluate_on_slurm(dataset, tmp_path / "report", env, jobs, "--cluster-class",
                                             "dask_jobqueue.SLURMCluster", "--cluster-kwargs", json.dumps(kwargs))
    _check_slurm_run(report, local, slurm, jobs, threads=CORES, scheduler="tcp://", job_sockets=job_sockets)
    assert (tmp_path / "worker-space" / "dask-scratch-space").is_dir()


def test_slurm_cluster_from_the_shipped_config(slurm, tmp_path, cli_env, local_report):
    """deploy/dask/slurm.yaml as a user installs it, TLS included; only site values (partition, node size,
    network interface, certificate paths) overridden through DASK_* variables, and --cluster-kwargs as the
    docs/clusters.md gives it."""
    from distributed.security import Security

    dataset, local = local_report
    env = _run_env(cli_env, slurm, tmp_path)
    config = tmp_path / "dask-config"
    config.mkdir()
    shutil.copy(Path(__file__).parents[1] / "deploy" / "dask" / "slurm.yaml", config / "jobqueue.yaml")
    tls = tmp_path / "tls"
    tls.mkdir()
    temporary = Security.temporary()  # one self-signed certificate: the CA and every role's certificate
    (tls / "ca.pem").write_text(temporary.tls_ca_file)
    (tls / "cert.pem").write_text(temporary.tls_scheduler_cert)
    (tls / "key.pem").write_text(temporary.tls_scheduler_key)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    env.update({
        "DASK_CONFIG": str(config),
        "DASK_JOBQUEUE__SLURM__QUEUE": "hashdist",
        "DASK_JOBQUEUE__SLURM__CORES": str(CORES),
        "DASK_JOBQUEUE__SLURM__MEMORY": "2GiB",
        "DASK_JOBQUEUE__SLURM__INTERFACE": "lo",
        "DASK_JOBQUEUE__SLURM__LOG_DIRECTORY": str(jobs),
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(tls / "ca.pem"),
    })
    for role in ("scheduler", "worker", "client"):
        env[f"DASK_DISTRIBUTED__COMM__TLS__{role.upper()}__CERT"] = str(tls / "cert.pem")
        env[f"DASK_DISTRIBUTED__COMM__TLS__{role.upper()}__KEY"] = str(tls / "key.pem")
    report, job_sockets = _evaluate_on_slurm(dataset, tmp_path / "report", env, jobs, "--cluster-class",
                                             "dask_jobqueue.SLURMCluster", "--cluster-kwargs", '{"n_workers": 1}')
    _check_slurm_run(report, local, slurm, jobs, threads=CORES, scheduler="tls://", job_sockets=job_sockets)
    # local-directory: $TMPDIR, expanded in the job
    assert (tmp_path / "tmp" / "dask-scratch-space").is_dir()


@pytest.mark.parametrize(("sig", "status", "message"), [(signal.SIGINT, 130, "hashdist: interrupted"),
                                                         (signal.SIGTERM, 143, "hashdist: terminated")],
                         ids=["SIGINT", "SIGTERM"])
def test_interrupting_a_run_that_waits_for_its_slurm_job(slurm, tmp_path, cli_env, local_report, sig, status,
                                                         message):
    """Ctrl-C (or SIGTERM) while the run waits for its job to start: exit status 130 (143), no report, the pending
    job cancelled.

    (Importing dask-jobqueue 0.9.0 makes SIGINT call sys.exit(), which would end the run with status 0.)
    """
    dataset, _ = local_report
    env = _run_env(cli_env, slurm, tmp_path)
    kwargs = _pending_job_kwargs(tmp_path)
    out = tmp_path / "report"
    cmd = [str(BIN / "hashdist"), "evaluate", str(dataset), "--out", str(out), "--quiet", "--cluster-class",
           "dask_jobqueue.SLURMCluster", "--cluster-kwargs", json.dumps(kwargs)]
    with open(tmp_path / "stderr.txt", "wb") as stderr:
        # SIGINT as a terminal's Ctrl-C delivers it, whatever this process inherited
        run = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not any(job.endswith("PENDING") for job in _jobs(slurm)):
            assert run.poll() is None, (tmp_path / "stderr.txt").read_text()
            assert time.monotonic() < deadline, "no pending SLURM job after 120 s"
            time.sleep(0.5)
        time.sleep(1)
        run.send_signal(sig)
        returned = run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert returned == status, stderr
    assert message in stderr
    assert not out.exists()
    assert _queue_empties(slurm), "the interrupted run left its SLURM job in the queue"


def test_a_run_whose_slurm_job_never_starts_ends_after_the_worker_timeout(slurm, tmp_path, cli_env, local_report):
    """$HASHDIST_WORKER_TIMEOUT bounds the wait for the first job: then one line, exit status 2, no report, and
    the pending job cancelled."""
    dataset, _ = local_report
    env = {**_run_env(cli_env, slurm, tmp_path), "HASHDIST_WORKER_TIMEOUT": "3"}
    kwargs = _pending_job_kwargs(tmp_path)
    out = tmp_path / "report"
    run = subprocess.run([str(BIN / "hashdist"), "evaluate", str(dataset), "--out", str(out), "--quiet",
                          "--cluster-class", "dask_jobqueue.SLURMCluster", "--cluster-kwargs", json.dumps(kwargs)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2, run.stderr
    assert len(lines) == 1 and "no worker of the cluster started within 3 s" in lines[0], run.stderr
    assert not out.exists()
    assert _queue_empties(slurm), "the run left its SLURM job in the queue"
