"""An elastic data-parallel run (pybridge.runtime.elastic.run) for the elastic tests and benchmark.

Run by `pybridge-launch --elastic ... tests/elastic_train.py ...`. A linear model in float64
with SGD + momentum on tests/resume_train.py's dataset; a commit every --commit-every steps.
Each process appends JSON lines to LOG-<id>.jsonl:
  {"ev": "start", "pid"}                                                 at the start
  {"ev": "step", "gen", "rank", "world", "epoch", "step", "ids", "t"}   after each step
  {"ev": "commit", "gen", "step", "t"}                                  after each commit
  {"ev": "reset", "gen", "lost", "joined", "step", "seen", "left", "agreed", "t"}  after each reset
  {"ev": "enter", "step", "received", "sent_to", "t"}                    each entry of train()
  {"ev": "die", "step", "t"}                                             just before --die-at
  {"ev": "done", "gen", "step", "weights"}                              at the end
A rank with --die-rank R in its first world SIGKILLs itself (or SIGSTOPs itself, --stop)
at step --die-at, mid-step: batch read, nothing reduced.
"""

import argparse
import json
import os
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pybridge.runtime import elastic  # noqa: E402
import pybridge  # noqa: E402
from pybridge.recordio import Loader, decode_fixed  # noqa: E402
from resume_train import FEATURES, LAYOUT, sgd_step  # noqa: E402,F401

LR, MOMENTUM = 0.02, 0.9


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--data", nargs="+", required=True)
    p.add_argument("--log", required=True, help="prefix of the per-process logs")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--commit-every", type=int, default=5)
    p.add_argument("--die-at", type=int, default=0)
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--stop", action="store_true", help="SIGSTOP instead of SIGKILL")
    p.add_argument("--admit-from", type=int, default=0, help="commits admit joiners from this step on")
    p.add_argument("--await-joiner-at", type=int, default=0,
                   help="test scaffolding: before the commit of this step, wait until a process asks to join")
    p.add_argument("--join-after-gen", type=int, default=0,
                   help="test scaffolding: start (import torch, build the data) at once, but ask to join "
                        "only once the job's world number reaches this")
    p.add_argument("--step-ms", type=float, default=0.0, help="sleep this long in every step")
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--ddp", action="store_true", help="pybridge.DistributedDataParallel instead of a Reducer")
    p.add_argument("--ballast-mb", type=float, default=0.0,
                   help="a tensor of this size in the state (committed, sent to joiners): a model's size")
    return p.parse_args(argv)


def _await_generation(n):
    """Until the job's newest world is number n or later (tests/test_elastic_survive.py)."""
    from pybridge.runtime import elastic_store, membership
    store = elastic_store.from_environment().connect(60)
    while membership.generation(store) < n:
        time.sleep(0.05)


def main(opts):
    if opts.join_after_gen:
        _await_generation(opts.join_after_gen)
    g = elastic.init(timeout=opts.timeout)
    first_gen = g.elastic.world.generation
    me = os.environ.get("PYBRIDGE_ELASTIC_ID", str(os.getpid()))
    log = open(f"{opts.log}-{me}.jsonl", "a", buffering=1)

    def write(**event):
        event.update(gen=elastic.session().world.generation, t=time.time())
        log.write(json.dumps(event) + "\n")

    write(ev="start", pid=os.getpid())
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1).double()
    params = list(model.parameters())
    if opts.ddp:
        model = pybridge.DistributedDataParallel(model)  # reduces in backward; rebound by State.reset
        reducer = None
    else:
        reducer = pybridge.Reducer(params)
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    loader = Loader(opts.data, opts.batch, shuffle=True, seed=7, prefetch=0)
    ballast = {"ballast": torch.zeros(int(opts.ballast_mb * 2**20) // 4)} if opts.ballast_mb else {}
    state = elastic.State(model=model, optimizer=opt, reducer=reducer, loader=loader, tensors=ballast,
                          epoch=0, step=0)

    @state.on_reset
    def _note():
        w, err = elastic.session().world, elastic.session().last_change
        write(ev="reset", rank=w.rank, world=w.size, step=state.step, lost=err.lost, joined=err.joined, why=str(err),
              seen=err.seen_at, left=err.left_at, agreed=err.agreed_at)

    @elastic.run
    def train(state):
        write(ev="enter", step=state.step, rank=elastic.session().world.rank, **state.last_sync)  # after the sync or reset: who got bytes
        while state.epoch < opts.epochs:
            loader.set_epoch(state.epoch)  # a rolled-back epoch keeps its committed position
            for batch in loader:
                w = elastic.session().world
                rec = decode_fixed(batch.data, batch.offsets, LAYOUT, as_torch=True)
                step = state.step + 1
                if step == opts.die_at and w.rank == opts.die_rank and w.generation == first_gen == 1:
                    write(ev="die", step=step)
                    os.kill(os.getpid(), signal.SIGSTOP if opts.stop else signal.SIGKILL)
                if opts.step_ms:
                    time.sleep(opts.step_ms / 1000)
                sgd_step(model, opt, reducer, params, rec["x"].double(), rec["y"].double())
                state.step = step
                write(ev="step", rank=w.rank, world=w.size, epoch=state.epoch, step=step,
                      ids=rec["id"].tolist())
                if step == opts.await_joiner_at and w.generation == 2:
                    while elastic.session().membership.joiners_waiting(w) == 0:
                        time.sleep(0.05)
                if step % opts.commit_every == 0:
                    t0 = time.perf_counter()
                    state.commit(admit=step >= opts.admit_from)
                    write(ev="commit", step=step, ms=(time.perf_counter() - t0) * 1e3)
            state.epoch += 1
            state.commit(admit=state.step >= opts.admit_from)
            write(ev="commit", step=state.step)

    train(state)
    write(ev="done", step=state.step, weights=[p.detach().flatten().tolist() for p in params])
    log.close()
    loader.close()
    pybridge.finalize()


if __name__ == "__main__":
    main(parse(sys.argv[1:]))
