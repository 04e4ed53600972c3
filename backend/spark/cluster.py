"""A Spark standalone cluster on loopback (DESIGN.md §6): one master and workers from the pyspark package.

``with Standalone(workdir, workers=1, cores=2) as c: job.session(master=c.url)`` starts
``spark-class org.apache.spark.deploy.master.Master`` and ``...worker.Worker`` bound to 127.0.0.1 on
free ports, waits until every worker has registered, and stops them on exit. This is exactly the set-up
the README documents and the cluster test runs; on real machines, run the same two commands with the
hosts' addresses instead of 127.0.0.1.
"""
import os
import re
import signal
import subprocess
import sys
import time

from backend.live.broker import Service, free_port


class ClusterError(RuntimeError):
    pass


def spark_class():
    import pyspark
    path = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    if not os.path.exists(path):
        raise ClusterError("spark-class not found in the pyspark package at %s" % path)
    return path


class Standalone(Service):
    def __init__(self, workdir, workers=1, cores=2, memory="2g", timeout=60.0):
        self.workdir = os.path.abspath(workdir)
        self.workers, self.cores, self.memory, self.timeout = workers, cores, memory, timeout
        self.port = free_port()
        self.url = "spark://127.0.0.1:%d" % self.port
        self.procs = []
        self.workers_procs = []

    def _env(self):
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_MASTER_HOST="127.0.0.1",
                   PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
                   SPARK_LOG_DIR=self.workdir, SPARK_WORKER_DIR=os.path.join(self.workdir, "work"))
        return env

    def _spawn(self, name, args):
        log = open(os.path.join(self.workdir, name + ".log"), "w")
        p = subprocess.Popen([spark_class()] + args, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        p.log_path = log.name
        log.close()
        self.procs.append(p)
        return p

    def _wait_log(self, proc, pattern, count=1):
        end = time.monotonic() + self.timeout
        rx = re.compile(pattern)
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise ClusterError("%s exited with %s; see %s" % (proc.args[1], proc.returncode, proc.log_path))
            with open(proc.log_path) as f:
                if len(rx.findall(f.read())) >= count:
                    return
            time.sleep(0.2)
        raise ClusterError("timed out waiting for %r in %s" % (pattern, proc.log_path))

    def start(self):
        os.makedirs(os.path.join(self.workdir, "work"), exist_ok=True)
        master = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                        "--port", str(self.port), "--webui-port", str(free_port(taken=(self.port,)))])
        self._wait_log(master, r"I have been elected leader")
        for i in range(self.workers):
            self.workers_procs.append(self._spawn("worker-%d" % i, ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                          "--cores", str(self.cores), "--memory", self.memory,
                                          "--webui-port", str(free_port(taken=(self.port,))),
                                          "--work-dir", os.path.join(self.workdir, "work"), self.url]))
        self._wait_log(master, r"Registering worker", self.workers)
        return self

    def kill_worker(self, i):
        """SIGKILL worker ``i`` and its executors (a machine lost mid-run)."""
        p = self.workers_procs[i]
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs = []
        self.workers_procs = []
