"""Outsiders (issue 32, findings 6-8): a process that reaches a job's store port but is not
part of the job. Every store and backend listens only where the job lives (loopback for a
single-node job), and without the job secret an outsider, here a plain torch TCPStore
client, can neither read the job's state nor steer it. Loopback only, bounded."""

import base64
import datetime
import json
import os
import pickle
import threading

import pytest
import torch
import torch.distributed as dist

import pybridge
from launcher import launch
from listening import listening, wildcards
from pybridge.base import netif
from pybridge.runtime import membership as mb
from pybridge.runtime.elastic_store import TcpStore
from ranks import free_port, run_ranks

SECRET = "outsiders-test-secret-0123456789abcdef"


# ---- finding 6: listeners only where the job lives --------------------------------------

def _init_job(rank, world):
    g = pybridge.init(backend="gloo", timeout=30)
    t = torch.ones(1)
    pybridge.all_reduce(t)
    found = listening([os.getpid()])
    seen = _everything(_outsider(int(os.environ["MASTER_PORT"]))) if rank == 0 else ""
    pybridge.all_reduce(t)  # every rank has looked before rank 0 (the store) leaves
    pybridge.finalize()
    return found, seen, g.rank


@pytest.fixture(scope="module")
def init_job():
    """A 2-rank pybridge.init job with a secret: what each rank listens on, and what an
    outsider read from its store (one run for two tests)."""
    return run_ranks(_init_job, 2, env={"PYBRIDGE_SECRET": SECRET}, timeout=60)


def test_init_job_listens_on_loopback_only(init_job):
    found = [a for r in init_job for a in r[0]]
    assert init_job[0][0], "rank 0 hosts the store: it listens somewhere"
    assert not wildcards(found), f"listening on all interfaces: {wildcards(found)} (all: {found})"


_LAUNCHED = r"""
import json, os, sys
sys.path.insert(0, os.path.join({root!r}, "tests"))
from listening import family, listening
import pybridge
import torch
elastic = os.environ.get("PYBRIDGE_ELASTIC") == "1"
if elastic:
    from pybridge.runtime import elastic as el
    g = el.init(timeout=30)
else:
    g = pybridge.init(backend="gloo", timeout=30)
t = torch.ones(1)
pybridge.all_reduce(t)
if g.rank == 0:
    print("LISTENING " + json.dumps(listening(family(os.getppid()))), flush=True)
    print("SECRET " + ("given" if len(os.environ.get("PYBRIDGE_SECRET", "")) >= 32 else "none"), flush=True)
pybridge.all_reduce(t)
pybridge.finalize()
"""


def _launched(tmp_path, *flags):
    script = tmp_path / "listen.py"
    script.write_text(_LAUNCHED.format(root=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    rc, out, _ = launch(["--nproc-per-node", "2", *flags, str(script)], timeout=90)
    assert rc == 0, out
    lines = [ln for ln in out.splitlines() if "LISTENING " in ln]
    assert lines, out
    assert "SECRET given" in out, "the launcher hands its workers a job secret (finding 7, 8)\n" + out
    return [tuple(a) for a in json.loads(lines[0].split("LISTENING ", 1)[1])]


def test_launch_listens_on_loopback_only(tmp_path):
    found = _launched(tmp_path)
    assert found, "the launcher's store and rank 0's are listening somewhere"
    assert not wildcards(found), f"listening on all interfaces: {wildcards(found)} (all: {found})"


def test_elastic_launch_listens_on_loopback_only(tmp_path):
    found = _launched(tmp_path, "--elastic")
    assert found
    assert not wildcards(found), f"listening on all interfaces: {wildcards(found)} (all: {found})"


# ---- findings 7 and 8: an outsider (a plain TCPStore client, no secret) ---------------------

class _Evil:
    """A pickle that, unpickled, leaves a file behind: it would run in the launcher."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _outsider(port):
    return dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=20), wait_for_workers=False)


def _done(store):
    """Return once the server has applied this connection's writes (a set is not answered;
    a check is, after everything sent before it on the same connection)."""
    store.check(["-"])


def _everything(store):
    """What an outsider can see: every key and every value, as one text."""
    keys = store.list_keys()
    return " ".join(keys + [bytes(store.get(k)).decode("latin-1") for k in keys])


@pytest.fixture
def job(monkeypatch):
    """A store hosted here (as pybridge-launch --elastic's), a job secret in the environment,
    and a factory of members; all closed at the end."""
    monkeypatch.setenv("PYBRIDGE_SECRET", SECRET)
    # a port the kernel picks, bound at once: no other test can take it in between
    # (a free_port() before pybridge could bind one itself)
    fd = netif.listener("127.0.0.1", 0).detach() if hasattr(netif, "listener") else None
    host = dist.TCPStore("127.0.0.1", 0 if fd is not None else free_port(), None, True,
                         datetime.timedelta(seconds=10), wait_for_workers=False, master_listen_fd=fd)
    port = host.port
    made = []

    def member(mid, **kw):
        kw.setdefault("timeout", 20)  # a bound only: the rounds take milliseconds
        m = mb.Membership(TcpStore("127.0.0.1", port), member_id=mid, **kw)
        made.append(m)
        return m
    member.port = port
    yield member
    for m in made:
        m.close()
    del host


def _world(members):
    """The first world of these members, formed in threads."""
    out, errors = [None] * len(members), []

    def run(i):
        try:
            out[i] = members[i].first_world()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(members))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert not errors, errors
    return out


def test_outsider_cannot_read_the_member_list(job):
    worlds = _world([job("alice", initial=2, want=0), job("bob", initial=2, want=1)])
    assert worlds[0].ids == ["alice", "bob"]
    seen = _everything(_outsider(job.port))
    for secret_word in ("alice", "bob", '"pid"', "members", "elastic", str(os.getpid())):
        assert secret_word not in seen, f"an outsider read {secret_word!r} in the store"


def test_outsider_cannot_read_an_init_jobs_store(init_job):
    seen = init_job[0][1]
    assert seen, "the outsider listed the store"
    for word in ("pid", "rank", "world_size", "pybridge/who"):
        assert word not in seen, f"an outsider read {word!r} in an init job's store (roster, gloo addresses)"


def test_outsider_add_on_the_next_generation_counter_admits_nobody(job):
    alice = job("alice", initial=1)
    (world,) = _world([alice])
    evil = _outsider(job.port)
    evil.add(mb.PREFIX + "g2/count", 1)  # the key of a job without a secret
    for key in evil.list_keys():  # and whatever it can see (an add is answered: no race)
        try:
            _outsider(job.port).add(key, 1)
        except Exception:  # noqa: BLE001 - a sealed value is no counter
            pass
    assert alice.joiners_waiting(world) == 0


def test_a_counter_bump_admits_nobody_without_a_secret_either(job, monkeypatch):
    monkeypatch.delenv("PYBRIDGE_SECRET")
    alice = job("alice", initial=1)
    (world,) = _world([alice])
    _outsider(job.port).add(mb.PREFIX + "g2/count", 1)
    assert alice.joiners_waiting(world) == 0  # entries are counted, not the counter


def test_outsider_dead_mark_removes_no_one(job):
    alice, bob = job("alice", initial=2, want=0), job("bob", initial=2, want=1)
    _world([alice, bob])
    evil = _outsider(job.port)
    evil.set(mb.PREFIX + "dead/bob", "killed by an outsider")
    evil.set(mb.PREFIX + "dead/bob", json.dumps({"generation": 1, "reason": "killed by an outsider"}))
    _done(evil)
    assert alice.lost_reason(bob.me, 2) is None
    # one that knows the sealed key's name but not the secret: ignored, the key named
    from pybridge.base import secret as sec
    evil.set(sec.Seal(SECRET.encode()).name(mb.PREFIX + "dead/bob"), "forged")
    _done(evil)
    with pytest.warns(UserWarning, match="dead/bob"):
        assert alice.lost_reason(bob.me, 2) is None


def test_dead_marks_expire_with_their_generation(job, monkeypatch):
    monkeypatch.delenv("PYBRIDGE_SECRET")
    alice = job("alice")
    mb.mark_dead(alice.store, "bob", "exited with code 1")  # written while generation 0 is the newest
    bob = {"id": "bob", "host": "h", "pid": 1, "machine": "elsewhere", "want": None}
    assert alice.lost_reason(bob, 1) == "exited with code 1"
    # a process with that id that registers again generations later is not kept out for ever
    assert alice.lost_reason(bob, 1 + mb.MARK_GENERATIONS + 1) is None


def test_a_non_json_candidate_is_ignored_and_named(job, monkeypatch):
    monkeypatch.delenv("PYBRIDGE_SECRET")  # the worst case: the outsider can write the real keys
    evil = _outsider(job.port)
    k = evil.add(mb.PREFIX + "g1/count", 1)
    evil.set(mb.PREFIX + f"g1/cand/{k}", "{not json")
    _done(evil)
    with pytest.warns(UserWarning, match=f"g1/cand/{k}"):
        worlds = _world([job("alice", initial=2, want=0), job("bob", initial=2, want=1)])
    assert worlds[0].ids == ["alice", "bob"]


def test_registering_with_want_minus_one_is_refused(job, monkeypatch):
    monkeypatch.delenv("PYBRIDGE_SECRET")
    evil = _outsider(job.port)
    k = evil.add(mb.PREFIX + "g1/count", 1)
    evil.set(mb.PREFIX + f"g1/cand/{k}",
             json.dumps({"id": "evil", "host": "h", "pid": 1, "machine": None, "want": -1}))
    _done(evil)
    with pytest.warns(UserWarning, match="wanted rank -1 is absurd"):
        worlds = _world([job("alice", initial=2, want=0), job("bob", initial=2, want=1)])
    assert worlds[0].ids == ["alice", "bob"]  # not ["evil", ...]: the outsider is not rank 0


def test_outsider_cannot_register_without_the_secret(job):
    evil = _outsider(job.port)
    k = evil.add(mb.PREFIX + "g1/count", 1)
    evil.set(mb.PREFIX + f"g1/cand/{k}", json.dumps({"id": "evil", "host": "h", "pid": 1, "machine": None,
                                                     "want": 0}))
    _done(evil)
    worlds = _world([job("alice", initial=2, want=0), job("bob", initial=2, want=1)])
    assert worlds[0].ids == ["alice", "bob"]


def test_outsider_setting_done_does_not_end_the_job(job):
    alice = job("alice", initial=1)
    evil = _outsider(job.port)
    evil.set(mb.PREFIX + "done", "1")
    _done(evil)
    assert not mb.finished(alice.store)
    assert alice.first_world().ids == ["alice"]  # a job "finished" by an outsider still forms worlds


def test_a_pickle_at_the_rendezvous_key_is_not_run(tmp_path, monkeypatch):
    """Finding 7: torchrun's c10d rendezvous unpickles its state from the store. The
    rendezvous pybridge-launch sets up for a multi-node dynamic job (its torchrun arguments,
    built as torchrun builds them) must not load an outsider's pickle."""
    import torch.distributed.run as torchrun_cli
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
    from pybridge.launch import torchrun
    try:
        from pybridge.launch import rdzv
        rdzv.register()
    except ImportError:  # before pybridge had backends of its own
        pass
    monkeypatch.setenv("PYBRIDGE_SECRET", SECRET)
    port = free_port()
    opts = torchrun._parser().parse_args(["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "/bin/true"])
    args = torchrun_cli.get_args_parser().parse_args(torchrun.torchrun_args(opts, str(tmp_path), lambda: 0)[0])
    params = RendezvousParameters(args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id, 1, 2)
    handler = get_rendezvous_handler(params)  # node 0's launcher: it hosts the store
    marker = tmp_path / "ran"
    evil = _outsider(port)
    bomb = base64.b64encode(pickle.dumps(_Evil(str(marker))))
    for key in ["torch.rendezvous.pybridge"] + evil.list_keys():  # the predictable key, and all it sees
        evil.set(key, bomb)
    _done(evil)
    try:
        handler._state_holder.sync()  # where torch unpickles the state it reads
    except Exception:  # noqa: BLE001 - refused: torch's rendezvous error, whatever its type
        pass
    assert not marker.exists(), "the outsider's pickle ran in the launcher"
    assert args.rdzv_id != "pybridge" and len(args.rdzv_id) > 30  # not guessable either


def test_a_multi_node_dynamic_rendezvous_needs_the_secret(monkeypatch):
    from pybridge.base import secret as sec
    from pybridge.launch import torchrun
    monkeypatch.delenv("PYBRIDGE_SECRET", raising=False)
    monkeypatch.delenv("PYBRIDGE_SECRET_FILE", raising=False)
    opts = torchrun._parser().parse_args(["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29999", "/bin/true"])
    with pytest.raises(SystemExit, match="needs the job secret"):
        torchrun.torchrun_args(opts, "/tmp", lambda: 0)
    monkeypatch.setenv("PYBRIDGE_SECRET", SECRET)
    args, _ = torchrun.torchrun_args(opts, "/tmp", lambda: 0)
    run_id = args[args.index("--rdzv-id") + 1]
    assert "pybridge-c10d" in args and run_id != "pybridge" and run_id == sec.run_id(SECRET.encode(), "pybridge")
