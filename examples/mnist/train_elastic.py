"""train.py --elastic: elastic training (docs/elastic.md) under `pybridge-launch --elastic`,
the Python twin of elastic.go (same flags and output lines).

The model (pybridge's DDP wrapper), the optimizer, the loader position, the epoch and the
step are an elastic.State, committed in memory every --commit-every steps and at each
epoch's end. When a rank dies, the survivors' current call raises MembershipChanged and
elastic.run resets them onto the smaller world, rolled back to the last commit; train()
then goes on from the committed epoch and step. Each rank keeps the per-rank batch of the
first world (--batch-size divided by WORLD_SIZE), so the global batch follows the world.
"""

import hashlib
import os
import signal
import sys

import torch

import mnist_format as fmt
import pybridge
from pybridge.runtime import elastic
from pybridge import recordio


def check(opts):
    """The options --elastic cannot go with, named (SystemExit)."""
    if opts.partition != "static":
        raise SystemExit("--elastic takes the static partition only (a dynamic one cannot be re-shared over a new world)")
    if opts.ddp != "pybridge":
        raise SystemExit("--elastic goes with --ddp pybridge (torch's DDP cannot move to a new world)")
    if opts.checkpoint or opts.resume or opts.init_weights or opts.metrics:
        raise SystemExit("--elastic keeps its state in memory: --checkpoint, --resume, --init-weights and "
                         "--metrics are not used")
    if opts.commit_every < 1:
        raise SystemExit("--commit-every must be positive")


def run(opts, device, train_py):
    """The elastic run; train_py is train.py's module (model, inputs, evaluation)."""
    check(opts)
    g = elastic.init(backend="gloo" if device.type == "cpu" else "auto", timeout=30)
    first = int(os.environ.get("WORLD_SIZE") or g.size)  # a joiner's world may differ: the first one's rules
    if opts.batch_size % first:
        raise SystemExit(f"--batch-size {opts.batch_size} must be divisible by the first world's size {first}")
    per_rank = opts.batch_size // first
    model = train_py.build_model(opts.seed).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=opts.lr, momentum=opts.momentum)
    ddp = pybridge.DistributedDataParallel(model)
    train = recordio.Loader(os.path.join(opts.data, fmt.TRAIN_GLOB), per_rank, shuffle=True, seed=opts.seed,
                            drop_last=True)
    box = {"test": None}
    state = elastic.State(model=ddp, optimizer=opt, loader=train, epoch=0, step=0)

    @state.on_reset
    def _moved():
        w, ch = elastic.session().world, elastic.session().last_change
        if w.rank == 0:
            print(f"elastic: world {ch.old_size} -> {ch.new_size} ranks (lost ranks {ch.lost}, {ch.joined} joined); "
                  f"back to the commit of step {state.step}, epoch {state.epoch}", flush=True)

    @elastic.run
    def loop(state):
        g = pybridge.current()
        rank, world = g.rank, g.size
        say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
        if box["test"] is not None:
            box["test"].close()  # opened over an old world
        test = box["test"] = recordio.Loader(os.path.join(opts.data, fmt.TEST_GLOB), train_py.EVAL_BATCH,
                                             shuffle=False, drop_last=False)
        if state.step == 0:
            say(f"data: {train_py.data_kind(opts.data)}, train {train.num_records}, test {test.num_records} | "
                f"{world} ranks, {per_rank} per rank, elastic, commit every {opts.commit_every} steps")
        acc = None
        while state.epoch < opts.epochs and (opts.steps is None or state.step < opts.steps):
            train.set_epoch(state.epoch)  # a rolled-back epoch keeps its committed position
            loss_sum, done = 0.0, 0
            for batch in train:
                if opts.steps is not None and state.step >= opts.steps:
                    break
                if state.step + 1 == opts.fail_at and rank == opts.fail_rank and elastic.session().world.generation == 1:
                    print(f"rank {rank}: SIGKILL before step {state.step + 1} (--fail-at)", file=sys.stderr, flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                loss_sum += train_py.train_step(ddp, opt, batch, device)
                done += 1
                state.step += 1
                if state.step % opts.commit_every == 0:
                    state.commit()
            correct, counted = train_py.evaluate(model, test, device, g)
            totals = torch.tensor([loss_sum, done, correct, counted], dtype=torch.float64, device=device)
            pybridge.all_reduce(totals)
            acc = totals[2].item() / max(totals[3].item(), 1)
            state.epoch += 1
            say(f"epoch {state.epoch}/{opts.epochs}  loss {totals[0].item() / max(totals[1].item(), 1):.4f}  "
                f"test-acc {acc:.4f}  (rank {rank} of {world})")
            state.commit()
        if acc is None:  # nothing left to train: just evaluate
            acc = train_py.global_accuracy(model, test, device, g)
        return acc

    acc = loop(state)
    g = pybridge.current()
    digest = hashlib.sha1()
    for p in train_py.params_of(model):
        digest.update(p.detach().cpu().numpy().tobytes())
        digest.update(opt.state[p]["momentum_buffer"].cpu().numpy().tobytes())
    # One write: the ranks share the console, and print() writes the line end separately.
    sys.stdout.write(f"elastic: rank {g.rank} of {g.size} done at step {state.step}, epoch {state.epoch}, "
                     f"weights {digest.hexdigest()[:16]}\n")
    sys.stdout.flush()
    if g.rank == 0 and opts.save_weights:
        fmt.write_checkpoint(opts.save_weights, state.epoch, state.step, train_py.state_arrays(model, opt))
    if g.rank == 0:
        print(f"final test accuracy: {acc:.4f}", flush=True)
    train.close()
    box["test"].close()
    ddp.close()
    pybridge.finalize()
    return 0
