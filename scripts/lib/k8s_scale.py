#!/usr/bin/env python3
"""The driver behind scripts/k8s-scale.sh, which says what it runs, in which phases, and what it
measures. This file starts and stops every process itself (each in its own process group, all
killed on the way out), so a failure anywhere leaves nothing running."""

import argparse
import collections
import ctypes
import http.client
import json
import math
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

NAMESPACES = 10
REPLICAS = 50  # pods per Deployment
NODE_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
MUTATING = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
TICK = os.sysconf("SC_CLK_TCK")
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    """In the child before exec: SIGKILL when this driver dies, however it dies (PR_SET_PDEATHSIG),
    so no program outlives a driver killed -9."""
    _libc.prctl(1, signal.SIGKILL)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Failed(Exception):
    """A phase that could not finish: the target's run stops there and says why."""


_ports_given = set()


def free_port():
    """A loopback port below the ephemeral range (no outbound connection can take it) that binds
    now, and that this run has not handed out before (a port given out may not be bound yet)."""
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    if low <= 12000:
        low = 32768
    while True:
        p = random.randrange(10000, low)
        if p in _ports_given:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            _ports_given.add(p)
            return p
        except OSError:
            pass
        finally:
            s.close()


def wait_for(what, timeout, check, every=0.5):
    """Polls check() until it returns a true value (returned), or raises Failed after timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise Failed(f"{what}: not after {timeout:.0f} s")
        time.sleep(every)


class Proc:
    """One program in its own process group, its output appended to a log. With restart=True it
    is started again when it exits on its own, as a kubelet does for a static pod; `restarts`
    counts those. Samples CPU seconds and peak RSS of every incarnation while it runs."""

    def __init__(self, name, argv, logpath, env=None, restart=False):
        self.name, self.argv, self.logpath, self.env = name, argv, logpath, env
        self.restart, self.restarts, self.stopping = restart, 0, False
        self.p = None
        self.cpu_done = 0.0  # CPU seconds of the incarnations that have ended
        self.cpu_now = 0.0
        self.hwm_kib = 0
        self.window_kib = 0  # the largest RSS sampled since take_window()
        self.lock = threading.Lock()
        self.start()
        if restart:
            threading.Thread(target=self._supervise, daemon=True).start()

    def start(self):
        with self.lock:
            self.stopping = False
            self._spawn_locked()

    def _spawn_locked(self):
        out = open(self.logpath, "ab")
        env = dict(os.environ, **(self.env or {}))
        self.p = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=env, start_new_session=True, preexec_fn=_die_with_parent)
        out.close()
        self.cpu_now = 0.0

    def alive(self):
        return self.p is not None and self.p.poll() is None

    def sample(self):
        """Reads the running incarnation's CPU time and peak RSS from /proc."""
        with self.lock:
            self._sample_locked()

    def _sample_locked(self):
        p = self.p
        if p is None or p.poll() is not None:
            return
        try:
            stat = open(f"/proc/{p.pid}/stat").read()
            fields = stat[stat.rindex(")") + 2:].split()
            self.cpu_now = (int(fields[11]) + int(fields[12])) / TICK
            for line in open(f"/proc/{p.pid}/status"):
                if line.startswith("VmHWM:"):
                    self.hwm_kib = max(self.hwm_kib, int(line.split()[1]))
                elif line.startswith("VmRSS:"):
                    self.window_kib = max(self.window_kib, int(line.split()[1]))
        except (OSError, ValueError):
            pass

    def take_window(self):
        """The largest RSS sampled (once a second) since the last call, in KiB; starts again."""
        with self.lock:
            self._sample_locked()
            got, self.window_kib = self.window_kib, 0
        return got

    def cpu_seconds(self):
        return self.cpu_done + self.cpu_now

    def _end(self, sig):
        with self.lock:
            self.stopping = True
            if not self.alive():
                return
            self._sample_locked()
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                pass
        try:
            self.p.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        self.cpu_done += self.cpu_now
        self.cpu_now = 0.0

    def kill(self):
        self._end(signal.SIGKILL)

    def _supervise(self):
        while True:
            time.sleep(1)
            with self.lock:
                # Checked and started under one hold: a kill() in between would otherwise be
                # followed by a start nobody stops.
                if self.stopping or self.p.poll() is None:
                    continue
                self.cpu_done += self.cpu_now
                self.restarts += 1
                code = self.p.returncode
                self._spawn_locked()
            log(f"{self.name} exited ({code}): started again")


class Sampler(threading.Thread):
    """Samples the given processes every second."""

    def __init__(self, procs):
        super().__init__(daemon=True)
        self.procs, self.stop = procs, threading.Event()

    def run(self):
        while not self.stop.wait(1.0):
            for p in list(self.procs):
                p.sample()


class Api:
    """kube-apiserver over HTTPS with the admin token: one keep-alive connection per thread."""

    def __init__(self, port, token):
        self.port, self.token = port, token
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE
        self.local = threading.local()
        self.requests = 0

    def _conn(self, fresh=False, timeout=60):
        c = getattr(self.local, "conn", None)
        if c is None or fresh:
            if c is not None:
                c.close()
            c = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=timeout)
            self.local.conn = c
        return c

    def call(self, method, path, body=None, ctype="application/json", ok=(200, 201, 202), retry_for=60):
        """One request; retried on a dropped connection, a 5xx or a 429 for up to retry_for s.
        Returns (status, parsed body)."""
        deadline = time.monotonic() + retry_for
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = ctype
        fresh = False
        while True:
            try:
                c = self._conn(fresh)
                c.request(method, path, body=data, headers=headers)
                r = c.getresponse()
                raw = r.read()
                self.requests += 1
                status = r.status
                if status < 500 and status != 429:
                    parsed = json.loads(raw) if raw and raw[:1] in b"{[" else raw.decode(errors="replace")
                    return status, parsed
                why = f"HTTP {status}"
            except (OSError, http.client.HTTPException) as e:
                why = repr(e)
                fresh = True
            if time.monotonic() > deadline:
                raise Failed(f"{method} {path}: {why}")
            time.sleep(0.5)

    def get(self, path, **kw):
        status, body = self.call("GET", path, **kw)
        if status != 200:
            raise Failed(f"GET {path}: HTTP {status}: {str(body)[:200]}")
        return body

    def list_all(self, path):
        """A whole LIST, page by page (limit 500), as clients page."""
        items, cont = [], ""
        while True:
            sep = "&" if "?" in path else "?"
            status, body = self.call("GET", f"{path}{sep}limit=500" + (f"&continue={cont}" if cont else ""))
            if status == 410 and cont:  # the page's revision was compacted: from the start
                items, cont = [], ""
                continue
            if status != 200:
                raise Failed(f"GET {path}: HTTP {status}: {str(body)[:200]}")
            items += body.get("items", [])
            cont = body["metadata"].get("continue")
            if not cont:
                return items, body["metadata"]["resourceVersion"]

    def create(self, path, obj):
        status, body = self.call("POST", path, obj)
        if status not in (201, 409):  # 409: a retry of a create that had landed
            raise Failed(f"POST {path}: HTTP {status}: {str(body)[:300]}")

    def metrics(self):
        status, body = self.call("GET", "/metrics", retry_for=5)
        return body if status == 200 else ""

    def ready(self):
        try:
            c = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=5)
            c.request("GET", "/readyz", headers={"Authorization": f"Bearer {self.token}"})
            r = c.getresponse()
            ok = r.status == 200 and r.read() == b"ok"
            c.close()
            return ok
        except (OSError, http.client.HTTPException):
            return False


def parallel(fn, items, workers=16):
    """fn over items on `workers` threads; the first exception is raised."""
    items, errors, lock = list(items), [], threading.Lock()
    it = iter(items)

    def work():
        while True:
            with lock:
                if errors:
                    return
                try:
                    x = next(it)
                except StopIteration:
                    return
            try:
                fn(x)
            except Exception as e:  # noqa: BLE001 - handed to the caller
                with lock:
                    errors.append(e)
                return

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class PodWatch(threading.Thread):
    """Follows every pod through one watch from a LIST's resourceVersion, as a controller does, and
    keeps, per pod, when it was first seen, bound (spec.nodeName) and Running, and whether it is
    gone. A dropped watch (the apiserver restart) is resumed by a fresh LIST; pods first met in
    such a LIST are marked, and left out of the startup figures (their first sighting is late)."""

    def __init__(self, api):
        super().__init__(daemon=True)
        self.api, self.lock, self.stop = api, threading.Lock(), threading.Event()
        self.pods = {}  # uid -> dict(name, seen, bound, running, gone, listed)
        self.events = 0
        self.relists = 0
        self.synced = threading.Event()

    def _see(self, pod, now, kind, listed=False):
        uid = pod["metadata"]["uid"]
        rec = self.pods.get(uid)
        if rec is None:
            rec = self.pods[uid] = {"name": f'{pod["metadata"]["namespace"]}/{pod["metadata"]["name"]}',
                                    "seen": now, "bound": None, "running": None, "gone": None,
                                    "listed": listed}
        if kind == "DELETED":
            rec["gone"] = rec["gone"] or now
            return
        if pod.get("spec", {}).get("nodeName") and rec["bound"] is None:
            rec["bound"] = now
            rec["listed"] = rec["listed"] or listed  # seen late: not timed
        if pod.get("status", {}).get("phase") == "Running" and rec["running"] is None:
            rec["running"] = now
            rec["listed"] = rec["listed"] or listed

    def _relist(self):
        items, rv = self.api.list_all("/api/v1/pods")
        now = time.monotonic()
        with self.lock:
            present = set()
            for pod in items:
                present.add(pod["metadata"]["uid"])
                self._see(pod, now, "LIST", listed=True)
            for uid, rec in self.pods.items():
                if uid not in present and rec["gone"] is None:
                    rec["gone"] = now
        self.relists += 1
        return rv

    def run(self):
        while not self.stop.is_set():
            try:
                rv = self._relist()
                self.synced.set()
                c = http.client.HTTPSConnection("127.0.0.1", self.api.port, context=self.api.ctx, timeout=3600)
                c.request("GET", f"/api/v1/pods?watch=1&resourceVersion={rv}&timeoutSeconds=3600",
                          headers={"Authorization": f"Bearer {self.api.token}"})
                r = c.getresponse()
                if r.status != 200:
                    raise OSError(f"watch: HTTP {r.status}")
                while not self.stop.is_set():
                    line = r.readline()
                    if not line:
                        break
                    ev = json.loads(line)
                    if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        with self.lock:
                            self.events += 1
                            self._see(ev["object"], time.monotonic(), ev["type"])
                    elif ev["type"] == "ERROR":
                        break  # 410 Gone and the like: list again
                c.close()
            except (OSError, http.client.HTTPException, ValueError, Failed):
                time.sleep(0.2)

    def live(self):
        with self.lock:
            return [r for r in self.pods.values() if r["gone"] is None]


def quantile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def parse_metrics(text):
    """Prometheus text -> list of (name, labels dict, value)."""
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        try:
            if "{" in line:
                name, rest = line.split("{", 1)
                labels_s, value = rest.rsplit("}", 1)
                labels = {}
                for part in split_labels(labels_s):
                    k, v = part.split("=", 1)
                    labels[k] = v.strip('"')
            else:
                name, value = line.split(None, 1)
                labels = {}
            out.append((name, labels, float(value.split()[0])))
        except ValueError:
            continue
    return out


def split_labels(s):
    parts, cur, quoted, esc = [], "", False, False
    for ch in s:
        if esc:
            cur += ch
            esc = False
        elif ch == "\\":
            esc = True
        elif ch == '"':
            quoted = not quoted
            cur += ch
        elif ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return parts


def histogram_quantile(buckets, q):
    """buckets: {le: cumulative count}; the quantile by linear interpolation in its bucket, as
    Prometheus computes it."""
    if not buckets:
        return float("nan")
    les = sorted(buckets)
    total = buckets[les[-1]]
    if total == 0:
        return float("nan")
    rank, prev_le, prev_c = q * total, 0.0, 0.0
    for le in les:
        c = buckets[le]
        if c >= rank:
            if math.isinf(le):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 0)
        prev_le, prev_c = le, c
    return prev_le


class Metrics:
    """The sum over every incarnation of a component of its last /metrics scrape."""

    def __init__(self):
        self.done = collections.Counter()  # (name, frozen labels) of incarnations that ended
        self.current = collections.Counter()
        self.started = None  # process_start_time_seconds of the incarnation in `current`
        self.lock = threading.Lock()

    def scraped(self, text):
        """One scrape. A process start time other than the last scrape's is a new incarnation:
        the last one's final scrape is kept and the new one counts from zero."""
        if not text:
            return
        c, started = collections.Counter(), None
        for name, labels, v in parse_metrics(text):
            c[(name, tuple(sorted(labels.items())))] += v
            if name == "process_start_time_seconds":
                started = v
        with self.lock:
            if self.started is not None and started is not None and started < self.started:
                return  # a late scrape of an incarnation already counted
            if started != self.started:
                self.done.update(self.current)
            self.current, self.started = c, started

    def total(self):
        with self.lock:
            t = collections.Counter(self.done)
            t.update(self.current)
            return t


def by_label(total, name, label, where=lambda labels: True):
    """{label value: {le: count}} from histogram `name`_bucket."""
    out = collections.defaultdict(lambda: collections.defaultdict(float))
    for (n, labels), v in total.items():
        if n != name + "_bucket":
            continue
        d = dict(labels)
        if not where(d):
            continue
        out[d.get(label, "")][float(d["le"])] += v
    return out


def quantile_rows(figures, name, histograms, ms):
    """A figure per histogram of {label value: histogram} with 10 calls or more: its p50 / p99
    in ms (each written with `ms`), and its calls."""
    for label in sorted(histograms):
        h = histograms[label]
        count = max(h.values())
        if count < 10:
            continue
        p50, p99 = (ms.format(histogram_quantile(h, q) * 1000) for q in (.5, .99))
        figures[name.format(label)] = f"{p50} / {p99}, {count:.0f}"


def merge(histograms):
    m = collections.defaultdict(float)
    for h in histograms:
        for le, c in h.items():
            m[le] += c
    return m


def counter_sum(total, name, where=lambda labels: True):
    return sum(v for (n, labels), v in total.items() if n == name and where(dict(labels)))


class Target:
    """One store and one control plane on it, through every phase."""

    def __init__(self, args, kind, members, work):
        self.args, self.kind, self.n = args, kind, members
        self.name = f"{kind}:{members}"
        self.dir = os.path.join(work, f"{kind}-{members}")
        os.makedirs(self.dir)
        self.work = work
        self.fig = collections.OrderedDict()
        self.phases = collections.OrderedDict()
        # phase -> the apiserver's metrics summed at its start and at its end
        self.phase_totals = collections.OrderedDict()
        self.phase_rss = collections.OrderedDict()  # phase -> each member's largest RSS sampled
        self.phase_cpu = collections.OrderedDict()  # phase -> [store, control plane] CPU seconds
        self.procs = []
        self.members = []
        self.apiserver_metrics = Metrics()
        self.controller_metrics = {"kube-controller-manager": Metrics(), "kube-scheduler": Metrics()}
        self.deployments = {}  # (namespace, name) -> replicas wanted
        self.problems = []

    # -- the store ---------------------------------------------------------------------------
    def start_store(self):
        a = self.args
        ports = [(free_port(), free_port()) for _ in range(self.n)]
        cluster = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, (_, p) in enumerate(ports))
        self.endpoints = [f"http://127.0.0.1:{c}" for c, _ in ports]
        binary = a.leasehold if self.kind == "leasehold" else a.etcd
        for i, (c, p) in enumerate(ports):
            argv = [binary, "--name", f"m{i}", "--data-dir", os.path.join(self.dir, f"m{i}"),
                    "--log-level", "warn",
                    "--listen-client-urls", f"http://127.0.0.1:{c}", "--advertise-client-urls", f"http://127.0.0.1:{c}",
                    "--listen-peer-urls", f"http://127.0.0.1:{p}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{p}",
                    "--initial-cluster", cluster, "--initial-cluster-token", "k8s-scale"]
            m = Proc(f"m{i}", argv, os.path.join(self.dir, f"m{i}.log"), env={"LEASEHOLD_LOG": "warn"})
            self.members.append(m)
            self.procs.append(m)
        wait_for("the store", 30, lambda: self.etcdctl("get", "ready-probe", check=False) is not None, 0.1)

    def etcdctl(self, *argv, check=True, endpoints=None):
        return self.etcdctl_run(*argv, check=check, endpoints=endpoints)[0]

    def etcdctl_run(self, *argv, check=True, endpoints=None):
        """(stdout or None on failure, stderr)."""
        eps = endpoints or [e for e, m in zip(self.endpoints, self.members) if m.alive()]
        r = subprocess.run([self.args.etcdctl, "--endpoints", ",".join(eps), "--dial-timeout", "2s",
                            "--command-timeout", "10s", *argv], capture_output=True, text=True)
        if r.returncode != 0:
            if check:
                raise Failed(f"etcdctl {' '.join(argv)}: {r.stderr.strip()[:300]}")
            return None, r.stderr
        return r.stdout, r.stderr

    def leader_index(self):
        for i, (e, m) in enumerate(zip(self.endpoints, self.members)):
            if not m.alive():
                continue
            out = self.etcdctl("endpoint", "status", "-w", "json", check=False, endpoints=[e])
            if out:
                s = json.loads(out)[0]["Status"]
                if s["leader"] == s["header"]["member_id"]:
                    return i
        return None

    def store_revision(self):
        out = json.loads(self.etcdctl("endpoint", "status", "-w", "json"))
        return max(s["Status"]["header"]["revision"] for s in out), max(s["Status"]["dbSize"] for s in out)

    # -- the control plane -------------------------------------------------------------------
    def start_control_plane(self):
        a, d = self.args, self.dir
        self.port = free_port()
        self.apiserver_argv = [
            a.apiserver, f"--etcd-servers={','.join(self.endpoints)}", "--bind-address=127.0.0.1",
            "--advertise-address=192.0.2.10", f"--secure-port={self.port}", f"--cert-dir={d}/certs",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-signing-key-file={self.work}/sa.key",
            f"--service-account-key-file={self.work}/sa.pub",
            f"--token-auth-file={self.work}/tokens.csv", "--authorization-mode=Node,RBAC",
            "--service-cluster-ip-range=10.96.0.0/16", "--endpoint-reconciler-type=lease",
            f"--etcd-compaction-interval={a.compaction_interval}s"]
        self.apiserver = Proc("kube-apiserver", self.apiserver_argv, f"{d}/kube-apiserver.log")
        self.procs.append(self.apiserver)
        self.api = Api(self.port, self.args.token)
        wait_for("kube-apiserver ready", 120, self.api.ready)
        kubeconfig = f"{d}/kubeconfig"
        with open(kubeconfig, "w") as f:
            f.write(f"""apiVersion: v1
kind: Config
clusters: [{{name: scale, cluster: {{server: "https://127.0.0.1:{self.port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: admin, user: {{token: "{self.args.token}"}}}}]
contexts: [{{name: scale, context: {{cluster: scale, user: admin}}}}]
current-context: scale
""")
        self.kcm_port, self.sched_port = free_port(), free_port()
        # No delegated authentication: /metrics is open to anonymous callers on loopback, and
        # neither component needs the apiserver's client-CA configmap to start.
        common = [f"--kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
                  "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"]
        # Every file first, then each program, each in self.procs as soon as it runs.
        with open(f"{d}/scheduler.yaml", "w") as f:
            f.write(f"""apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {{kubeconfig: "{kubeconfig}", qps: 100, burst: 200}}
""")
        stages = f"{d}/kwok-stages.yaml"
        with open(stages, "w") as f:
            for part in ("node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
                         "pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml"):
                f.write(open(os.path.join(a.kwok_stages, part)).read().rstrip() + "\n---\n")
        self.kcm = Proc("kube-controller-manager", [
            a.controller_manager, *common, f"--secure-port={self.kcm_port}", f"--cert-dir={d}/kcm-certs",
            "--kube-api-qps=100", "--kube-api-burst=200", f"--root-ca-file={d}/certs/apiserver.crt",
            "--controllers=*", "--leader-elect=true"], f"{d}/kube-controller-manager.log", restart=True)
        self.procs.append(self.kcm)
        self.scheduler = Proc("kube-scheduler", [
            a.scheduler, f"--config={d}/scheduler.yaml", *common[1:], f"--secure-port={self.sched_port}",
            f"--cert-dir={d}/sched-certs"], f"{d}/kube-scheduler.log", restart=True)
        self.procs.append(self.scheduler)
        self.kwok = Proc("kwok", [
            a.kwok, f"--kubeconfig={kubeconfig}", f"--config={stages}",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-lease-duration-seconds=40", "--cidr=10.0.0.1/12", "--node-ip=10.255.255.1"],
            f"{d}/kwok.log", restart=True)
        self.procs.append(self.kwok)

    def scrape(self):
        """The last /metrics of the apiserver, the controller manager and the scheduler."""
        self.apiserver_metrics.scraped(self.api.metrics())
        for name, port in (("kube-controller-manager", self.kcm_port), ("kube-scheduler", self.sched_port)):
            try:
                c = http.client.HTTPSConnection("127.0.0.1", port, context=self.api.ctx, timeout=10)
                c.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.args.token}"})
                r = c.getresponse()
                body = r.read().decode(errors="replace")
                c.close()
                if r.status == 200:
                    self.controller_metrics[name].scraped(body)
            except (OSError, http.client.HTTPException):
                pass

    def scraper(self, stop):
        while not stop.wait(5):
            try:
                self.scrape()
            except Failed:
                pass

    # -- the phases --------------------------------------------------------------------------
    def apiserver_totals(self):
        """The apiserver's metrics summed over its incarnations, scraped now (when the scrape
        fails, as of the last one)."""
        try:
            self.apiserver_metrics.scraped(self.api.metrics())
        except Failed:
            pass
        return self.apiserver_metrics.total()

    def phase(self, name, fn, timeout):
        log(f"{self.name}: {name}")
        before = self.apiserver_totals()
        for m in self.members:
            m.take_window()
        cpu_before = self.cpu_split()
        t0 = time.monotonic()
        fn(t0, timeout)
        self.phases[name] = time.monotonic() - t0
        self.phase_totals[name] = (before, self.apiserver_totals())
        self.phase_rss[name] = [m.take_window() for m in self.members]
        self.phase_cpu[name] = [b - a for a, b in zip(cpu_before, self.cpu_split())]
        log(f"{self.name}: {name} done in {self.phases[name]:.1f} s")

    def control_plane(self):
        return [self.apiserver, self.kcm, self.scheduler, self.kwok]

    def cpu_split(self):
        """CPU seconds so far: the store's members, and the control plane."""
        plane = self.control_plane()
        for p in self.members + plane:
            p.sample()
        return [sum(p.cpu_seconds() for p in self.members), sum(p.cpu_seconds() for p in plane)]

    def ready_nodes(self):
        items, _ = self.api.list_all("/api/v1/nodes?labelSelector=type%3Dkwok")
        return sum(1 for n in items for c in n.get("status", {}).get("conditions", [])
                   if c["type"] == "Ready" and c["status"] == "True"), len(items)

    def nodes(self, t0, timeout):
        n = self.args.nodes

        def make(i):
            name = f"kwok-node-{i:05}"
            self.api.create("/api/v1/nodes", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                             "labels": {"type": "kwok", "kubernetes.io/hostname": name,
                                        "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
                "spec": {"taints": [NODE_TAINT]},
                "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                           "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}}})
        parallel(make, range(n))
        wait_for(f"{n} nodes Ready", timeout - (time.monotonic() - t0), lambda: self.ready_nodes()[0] >= n, 1)

    def deployment(self, ns, name, replicas):
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}},
                                      "spec": {"nodeSelector": {"type": "kwok"},
                                               "tolerations": [{"key": NODE_TAINT["key"], "operator": "Exists",
                                                                "effect": "NoSchedule"}],
                                               "containers": [{"name": "app", "image": "registry.invalid/app:1",
                                                               "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}}

    def make_namespace(self, ns):
        self.api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        # Pods are refused until the service account controller has made `default`.
        wait_for(f"{ns}/default service account", 60,
                 lambda: self.api.call("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")[0] == 200, 0.2)

    def create_deployments(self, which):
        parallel(lambda key: self.api.create(f"/apis/apps/v1/namespaces/{key[0]}/deployments",
                                             self.deployment(key[0], key[1], self.deployments[key])), which, 8)

    def wait_pods(self, what, t0, timeout):
        """Until the watch sees exactly the wanted pods, every one bound and Running."""
        want = sum(self.deployments.values())

        def done():
            live = self.watch.live()
            return len(live) == want and all(r["running"] and r["bound"] for r in live)
        wait_for(what, timeout - (time.monotonic() - t0), done, 0.5)

    def pods(self, t0, timeout):
        nss = [f"scale-{i}" for i in range(NAMESPACES)]
        parallel(self.make_namespace, nss, NAMESPACES)
        left, j = self.args.pods, 0
        while left > 0:
            self.deployments[(nss[j % NAMESPACES], f"app-{j:04}")] = min(REPLICAS, left)
            left -= REPLICAS
            j += 1
        # Paced, as Kubernetes' scale tests create pods: one Deployment at a time, at --pod-rate
        # pods a second in all (its replica set makes its pods at once). Pod startup is then the
        # control plane's and the store's answer to a steady load, not the depth of a queue.
        made, rate = 0, self.args.pod_rate
        paced_from = self.pods_t0 = time.monotonic()
        for key in self.deployments:
            lag = paced_from + made / rate - time.monotonic()
            if lag > 0:
                time.sleep(lag)
            self.create_deployments([key])
            made += self.deployments[key]
        self.wait_pods(f"{self.args.pods} pods Running", t0, timeout)

    def scale_all(self, factor):
        def scale(key):
            want = self.full[key] if factor == 1 else self.full[key] // 2
            self.deployments[key] = want
            status, body = self.api.call("PATCH", f"/apis/apps/v1/namespaces/{key[0]}/deployments/{key[1]}/scale",
                                         {"spec": {"replicas": want}}, ctype="application/merge-patch+json")
            if status != 200:
                raise Failed(f"scale {key}: HTTP {status}: {str(body)[:200]}")
        parallel(scale, list(self.deployments), 8)

    def scale_down(self, t0, timeout):
        self.full = dict(self.deployments)
        killed = None
        if self.n > 1:
            killed = self.leader_index()
            if killed is None:
                raise Failed("no store leader to kill")
            log(f"{self.name}: killing the store's leader m{killed} (-9)")
            self.members[killed].kill()
        self.scale_all(0)
        self.wait_pods("half the pods", t0, timeout)
        if killed is not None:
            self.members[killed].start()
            self.fig["store leader killed"] = f"m{killed}, started again after {time.monotonic() - t0:.0f} s"

    def restart_apiserver(self):
        self.scrape()
        # Killed, not stopped: a SIGTERM'd apiserver waits 60 s for its watches to drain, and
        # what is tested here is the relist of every watch cache, not the drain.
        log(f"{self.name}: restarting kube-apiserver (-9)")
        self.apiserver.kill()
        down = time.monotonic()
        self.apiserver.start()
        wait_for("kube-apiserver ready again", 120, self.api.ready, 0.1)
        self.fig["kube-apiserver ready again after its kill"] = f"{time.monotonic() - down:.1f} s"

    def scale_up(self, t0, timeout):
        self.restart_apiserver()
        self.scale_all(1)
        self.wait_pods("the pods back", t0, timeout)

    def namespace(self, t0, timeout):
        ns = "scale-0"
        status, body = self.api.call("DELETE", f"/api/v1/namespaces/{ns}")
        if status not in (200, 202, 409):  # 409: a retried DELETE after the first had landed
            raise Failed(f"DELETE namespace {ns}: HTTP {status}")
        ours = [k for k in self.deployments if k[0] == ns]
        for k in ours:
            self.deployments[k] = 0
        wait_for(f"namespace {ns} gone", timeout,
                 lambda: self.api.call("GET", f"/api/v1/namespaces/{ns}")[0] == 404, 0.5)
        for k in ours:
            self.deployments[k] = self.full[k]
        self.make_namespace(ns)
        self.create_deployments(ours)
        self.wait_pods(f"namespace {ns} Running again", t0, timeout)

    def check(self, t0, timeout):
        """The final state, from fresh LISTs, agrees with what was asked for."""
        want = sum(self.deployments.values())

        def settled():
            deps, _ = self.api.list_all("/apis/apps/v1/deployments")
            ours = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in deps
                    if d["metadata"]["namespace"].startswith("scale-")}
            ready = all(d["spec"]["replicas"] == self.deployments[k]
                        and d.get("status", {}).get("readyReplicas", 0) == self.deployments[k]
                        and d.get("status", {}).get("observedGeneration") == d["metadata"]["generation"]
                        for k, d in ours.items() if k in self.deployments)
            return (ours, ready) if ready and set(ours) == set(self.deployments) else None
        try:
            ours, _ = wait_for("every Deployment ready", 120, settled, 1)
        except Failed:
            deps, _ = self.api.list_all("/apis/apps/v1/deployments")
            ours = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in deps}
            self.problems.append("Deployments not all ready after 120 s")
        self.fig["deployments (want / found / ready)"] = (
            f"{len(self.deployments)} / {sum(1 for k in self.deployments if k in ours)} / "
            f"{sum(1 for k, d in ours.items() if k in self.deployments and d.get('status', {}).get('readyReplicas', 0) == self.deployments[k])}")
        pods, _ = self.api.list_all("/api/v1/pods")
        pods = [p for p in pods if p["metadata"]["namespace"].startswith("scale-")]
        nodes, _ = self.api.list_all("/api/v1/nodes?labelSelector=type%3Dkwok")
        node_names = {n["metadata"]["name"] for n in nodes}
        ready_nodes = sum(1 for n in nodes for c in n["status"].get("conditions", [])
                          if c["type"] == "Ready" and c["status"] == "True")
        running = sum(1 for p in pods if p["status"].get("phase") == "Running"
                      and p["spec"].get("nodeName") in node_names and not p["metadata"].get("deletionTimestamp"))
        self.fig["pods (want / listed / bound and Running)"] = f"{want} / {len(pods)} / {running}"
        self.fig["nodes (want / listed / Ready)"] = f"{self.args.nodes} / {len(nodes)} / {ready_nodes}"
        # The watch's view of the pods must be the LIST's: no event lost, none made up.
        listed = {f'{p["metadata"]["namespace"]}/{p["metadata"]["name"]}' for p in pods}
        try:
            wait_for("the watch agreeing with a LIST", 30,
                     lambda: {r["name"] for r in self.watch.live() if r["name"].startswith("scale-")} == listed, 0.5)
            self.fig["watched pods = listed pods"] = "yes"
        except Failed:
            self.fig["watched pods = listed pods"] = "NO"
        if len(pods) != want or running != want:
            self.problems.append(f"pods: want {want}, listed {len(pods)}, bound and Running {running}")
        if len(nodes) != self.args.nodes or ready_nodes != self.args.nodes:
            self.problems.append(f"nodes: want {self.args.nodes}, listed {len(nodes)}, Ready {ready_nodes}")
        if self.fig["watched pods = listed pods"] != "yes":
            self.problems.append("the pod watch and a LIST disagree")

    def delete(self, t0, timeout):
        for i in range(NAMESPACES):
            self.api.call("DELETE", f"/api/v1/namespaces/scale-{i}")
        for k in self.deployments:
            self.deployments[k] = 0
        # The nodes go last: kwok finishes the deletion of a pod only while its node exists (else
        # the pod waits for the pod garbage collector's orphan sweep).
        wait_for("every pod gone", timeout, lambda: not [r for r in self.watch.live() if r["name"].startswith("scale-")], 1)
        self.api.call("DELETE", "/api/v1/nodes?labelSelector=type%3Dkwok")
        wait_for("every namespace gone", timeout - (time.monotonic() - t0), lambda: all(
            self.api.call("GET", f"/api/v1/namespaces/scale-{i}")[0] == 404 for i in range(NAMESPACES)), 1)
        wait_for("every node gone", 60, lambda: self.ready_nodes()[1] == 0, 1)
        gone = time.monotonic() - t0
        self.fig["7 of which: until everything was gone"] = f"{gone:.1f} s"
        log(f"{self.name}: everything deleted after {gone:.1f} s; waiting for a compaction")
        rev, size = self.store_revision()
        self.fig["store revision after deletes"] = rev
        # kube-apiserver compacts to the revision it saw one interval before: two intervals on,
        # the revision of the deletes is compacted away.
        wait_for("an apiserver compaction past the deletes", 3 * self.args.compaction_interval + 30,
                 lambda: "required revision has been compacted" in
                 self.etcdctl_run("get", "compact_rev_key", f"--rev={rev}", check=False)[1], 2)
        self.fig["compacted past the deletes"] = "yes"

    # -- the figures -------------------------------------------------------------------------
    def figures(self):
        f = self.fig
        recs = list(self.watch.pods.values())
        created = self.phase_pods
        startup = [r["running"] - r["seen"] for r in created]
        f["pod startup p50 / p99 (s), phase 2"] = f"{quantile(startup, .5):.2f} / {quantile(startup, .99):.2f}"
        later = [r for r in recs if not r["listed"] and r["running"] and hasattr(self, "later_t0")
                 and r["seen"] >= self.later_t0]
        startup = [r["running"] - r["seen"] for r in later]
        f["pod startup p50 / p99 (s), phases 4-5 (all at once)"] = (
            f"{quantile(startup, .5):.2f} / {quantile(startup, .99):.2f}")
        if hasattr(self, "ns_t0"):
            burst = [r for r in later if r["seen"] < self.ns_t0]
            if burst:
                f["pods/s Running, phase 4 (all at once, apiserver restart included)"] = (
                    f"{len(burst) / (max(r['running'] for r in burst) - self.later_t0):.0f}")
        f["this script's pod watch: LISTs (1 + one per broken watch)"] = f"{self.watch.relists}"
        f["pods timed / first met in a re-LIST"] = (
            f"{len(created) + len(later)} / {sum(1 for r in recs if r['listed'])}")
        if created and hasattr(self, "pods_t0"):
            span = lambda key: max(r[key] for r in created) - self.pods_t0  # noqa: E731
            n = len(created)
            f["pods/s created / bound / Running (phase 2)"] = (
                f"{n / span('seen'):.0f} / {n / span('bound'):.0f} / {n / span('running'):.0f}")
        total = self.apiserver_metrics.total()
        verbs = by_label(total, "apiserver_request_duration_seconds", "verb",
                         lambda l: l.get("verb") not in ("WATCH", "CONNECT"))
        quantile_rows(f, "apiserver {} p50 / p99 (ms), calls", verbs, "{:.0f}")
        mut = merge(verbs[v] for v in verbs if v in MUTATING)
        f["apiserver mutating p99 (ms)"] = f"{histogram_quantile(mut, .99) * 1000:.0f}"
        store = by_label(total, "etcd_request_duration_seconds", "operation")
        allstore = merge(store.values())
        f["store p50 / p99 from the apiserver (ms)"] = (
            f"{histogram_quantile(allstore, .5) * 1000:.1f} / {histogram_quantile(allstore, .99) * 1000:.1f}")
        quantile_rows(f, "store {} p50 / p99 (ms), calls", store, "{:.1f}")
        by_phase = []
        for before, after in self.phase_totals.values():
            during = collections.Counter(after)
            during.subtract(before)
            h = merge(by_label(during, "etcd_request_duration_seconds", "operation").values())
            by_phase.append(f"{histogram_quantile(h, .99) * 1000:.0f}" if max(h.values(), default=0) >= 10 else "-")
        f["store p99 by phase (ms)"] = " / ".join(by_phase)
        # Phase 3 (the store leader's kill), operation by operation, the most called first.
        kill = next((t for name, t in self.phase_totals.items() if name.startswith("3 ")), None)
        if kill:
            during = collections.Counter(kill[1])
            during.subtract(kill[0])
            ops = by_label(during, "etcd_request_duration_seconds", "operation")
            busiest = sorted(ops.items(), key=lambda kv: -max(kv[1].values(), default=0))
            f["store p99 by operation, phase 3 (ms, calls)"] = ", ".join(
                f"{op} {histogram_quantile(h, .99) * 1000:.0f} ({max(h.values()):.0f})"
                for op, h in busiest if max(h.values(), default=0) >= 10) or "-"
        worst = max(store, key=lambda op: histogram_quantile(store[op], .99)) if store else None
        if worst:
            f["store's slowest operation p99 (ms)"] = f"{worst} {histogram_quantile(store[worst], .99) * 1000:.0f}"
        f["watch events sent by the apiserver"] = f"{counter_sum(total, 'apiserver_watch_events_total'):.0f}"
        # Resource requests only: /readyz answers 500 while the apiserver starts, and this script
        # polls it.
        f["apiserver 5xx answers"] = f"{counter_sum(total, 'apiserver_request_total', lambda l: l.get('code', '').startswith('5') and l.get('resource')):.0f}"
        errs = []
        for name, m in self.controller_metrics.items():
            t = m.total()
            errs.append(f"{counter_sum(t, 'rest_client_requests_total', lambda l: l.get('code', '').startswith('5') or l.get('code') == '<error>'):.0f}")
        f["failed requests: controller-manager / scheduler"] = " / ".join(errs)
        f["restarts: controller-manager / scheduler / kwok"] = f"{self.kcm.restarts} / {self.scheduler.restarts} / {self.kwok.restarts}"
        f["store CPU seconds (all members)"] = f"{sum(m.cpu_seconds() for m in self.members):.1f}"
        f["store peak RSS per member (MiB)"] = " ".join(f"{m.hwm_kib / 1024:.0f}" for m in self.members)
        f["CPU seconds by phase: store / control plane"] = " ; ".join(
            f"{st:.0f} / {cp:.0f}" for st, cp in self.phase_cpu.values())
        f["store RSS by phase, largest sampled per member (MiB)"] = " ; ".join(
            " ".join(f"{k / 1024:.0f}" for k in rss) for rss in self.phase_rss.values())
        cp = sum(p.cpu_seconds() for p in self.control_plane())
        f["control plane CPU seconds"] = f"{cp:.1f}"

    def slo(self):
        """Kubernetes' SLOs as this run can see them: mutating calls p99 <= 1 s (all resources
        together, from the apiserver's histograms), pod startup p99 <= 5 s (the paced pods of
        phase 2)."""
        misses = []
        mut = float(self.fig.get("apiserver mutating p99 (ms)", "nan"))
        if not mut <= 1000:
            misses.append(f"mutating p99 {mut:.0f} ms")
        p99 = float(self.fig.get("pod startup p50 / p99 (s), phase 2", "nan / nan").split(" / ")[1])
        if not p99 <= 5:
            misses.append(f"pod startup p99 {p99:.2f} s")
        return misses

    def run(self):
        a = self.args
        stop_scraper = threading.Event()
        sampler = Sampler(self.procs)
        sampler.start()
        self.phase_pods = []
        try:
            self.start_store()
            self.start_control_plane()
            threading.Thread(target=self.scraper, args=(stop_scraper,), daemon=True).start()
            self.watch = PodWatch(self.api)
            self.watch.start()
            self.watch.synced.wait(60)
            big = max(120, a.pods / 10, a.nodes / 5)
            self.phase("1 nodes", self.nodes, big)
            self.phase("2 pods", self.pods, 3 * big + a.pods / a.pod_rate)
            with self.watch.lock:
                self.phase_pods = [dict(r) for r in self.watch.pods.values()
                                   if r["seen"] >= self.pods_t0 and r["running"] and r["bound"] and not r["listed"]]
            self.phase("3 scale-down" + (" + leader kill" if self.n > 1 else ""), self.scale_down, 3 * big)
            self.later_t0 = time.monotonic()
            self.phase("4 scale-up + apiserver restart", self.scale_up, 3 * big)
            self.ns_t0 = time.monotonic()
            self.phase("5 namespace deleted and made again", self.namespace, 3 * big)
            self.phase("6 check", self.check, big)
            self.scrape()
            self.phase("7 delete + compaction", self.delete, 3 * big)
        except Exception as e:  # noqa: BLE001 - any failure ends this target, not the run
            self.problems.append(str(e) if isinstance(e, Failed) else repr(e))
            log(f"{self.name}: FAILED: {e!r}")
        finally:
            stop_scraper.set()
            try:
                if hasattr(self, "apiserver") and self.apiserver.alive():
                    self.scrape()
            except Exception:  # noqa: BLE001 - the figures are best effort once a phase failed
                pass
            if hasattr(self, "watch"):
                self.watch.stop.set()
            # Everything stopped before the figures, and with signals held off, so that neither a
            # slow figure nor a second SIGTERM leaves a program running.
            old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
            try:
                for p in reversed(self.procs):
                    try:
                        p.kill()
                    except Exception as e:  # noqa: BLE001
                        log(f"{self.name}: stopping {p.name}: {e!r}")
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)
            sampler.stop.set()
            try:
                self.figures()
            except Exception as e:  # noqa: BLE001
                self.problems.append(f"figures: {e!r}")
        return self


def write_figures(a, work, results):
    """The targets' figures side by side, in <work>/summary.md (and --json's file); returns the table."""
    names = [r.name for r in results]
    rows = []
    for r in results:
        for k in list(r.phases) + list(r.fig):
            if k not in rows:
                rows.append(k)
    lines = [f"k8s-scale: {a.nodes} nodes, {a.pods} pods", "",
             "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for k in rows:
        cells = []
        for r in results:
            if k in r.phases:
                cells.append(f"{r.phases[k]:.1f} s")
            else:
                cells.append(str(r.fig.get(k, "")))
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines.append("| SLO misses | " + " | ".join(", ".join(r.slo()) or "none" for r in results) + " |")
    lines.append("| problems | " + " | ".join("; ".join(r.problems) or "none" for r in results) + " |")
    table = "\n".join(lines)
    with open(f"{work}/summary.md", "w") as f:
        f.write(table + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({r.name: {"phases_s": r.phases, "figures": r.fig, "slo_misses": r.slo(),
                                "problems": r.problems} for r in results}, f, indent=1)
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    for tool in ("leasehold", "etcd", "etcdctl", "apiserver", "controller-manager", "scheduler", "kwok", "kwok-stages"):
        ap.add_argument(f"--{tool}", required=True)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--pod-rate", type=float, default=40, help="pods a second created in phase 2")
    ap.add_argument("--targets", default="leasehold:1 leasehold:3 etcd:1 etcd:3")
    ap.add_argument("--compaction-interval", type=int, default=60,
                    help="kube-apiserver's --etcd-compaction-interval in seconds (its default is 300)")
    ap.add_argument("--check", action="store_true", help="fail unless every target's final state is right")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    if a.nodes < 1 or a.pods < 1 or not a.pod_rate > 0:
        ap.error("--nodes and --pods must be at least 1")
    if a.pods > 100 * a.nodes:
        ap.error("at most 100 pods a node (each fake node takes 110)")
    targets = a.targets.split()
    for t in targets:
        kind, _, n = t.partition(":")
        if kind not in ("leasehold", "etcd") or n not in ("1", "3"):
            ap.error(f"unknown target {t}: leasehold:1 leasehold:3 etcd:1 etcd:3")

    # A SIGTERM (a timeout, a CI cancel) unwinds like an exception, so every target's `finally`
    # kills what it started: the programs run in sessions of their own and would outlive us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = tempfile.mkdtemp(prefix="leasehold-k8s-scale.")
    subprocess.run(["openssl", "genrsa", "-out", f"{work}/sa.key", "2048"], check=True, capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", f"{work}/sa.key", "-pubout", "-out", f"{work}/sa.pub"],
                   check=True, capture_output=True)
    a.token = os.urandom(24).hex()
    with open(f"{work}/tokens.csv", "w") as f:
        f.write(f'{a.token},admin,admin,"system:masters"\n')
    log(f"k8s-scale: {a.nodes} nodes, {a.pods} pods, targets {' '.join(targets)}; work directory {work}")

    results = []
    for t in targets:
        kind, _, n = t.partition(":")
        results.append(Target(a, kind, int(n), work).run())
        # Written after every target, so a long run stopped part way keeps what it measured.
        table = write_figures(a, work, results)
        if len(results) < len(targets):
            log(f"figures so far: {work}/summary.md")
    print(table)
    failed = [r.name for r in results if r.problems]
    keep = os.environ.get("KEEP") == "1" or failed
    if keep:
        log(f"work directory kept: {work}")
    else:
        subprocess.run(["rm", "-rf", work])
    if failed and a.check:
        log(f"k8s-scale: the final state is wrong on {' '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
