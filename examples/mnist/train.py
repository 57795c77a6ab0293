"""The Python twin of the Go MNIST trainer: an MLP trained data-parallel with pybridge.

    python -m pybridge.launch --nproc-per-node 2 examples/mnist/train.py --data data/mnist
    python examples/mnist/train.py --data data/mnist          # one process, no launcher

Model: 784-128-10 MLP (ReLU), softmax cross-entropy, SGD with momentum (torch.optim.SGD:
buf = momentum * buf + grad; w -= lr * buf), pixels scaled by /255. Initial parameters come
from --seed (torch's nn.Linear init) or --init-weights, and rank 0's are broadcast to all.
Data: each rank reads its static partition of DATA/train-*.recordio (shuffled by chunk with
--seed and the epoch, drop_last), --batch-size is the GLOBAL batch (each of W ranks takes
batch-size / W records per step; it must divide). With --partition dynamic the ranks claim
chunks as they go, so they run different numbers of steps: the epoch's loop runs inside
ddp.join() (torch's Join), where a rank that has no more batches shadows the others, and
afterwards every rank takes the momentum of the rank that trained longest (the join itself
syncs the parameters). --slow-rank R --slow-ms MS slows rank R before each step. Gradients are averaged across ranks by
pybridge.DistributedDataParallel, so W ranks compute what one process computes on the
global batch. Evaluation: every test record exactly once (static partition, padding ignored),
correct/total summed across ranks by allreduce.

Output (rank 0; the Go trainer prints the same lines):
    data: synthetic digits (SYNTHETIC: not real MNIST), train 10000, test 2000 | 2 ranks, ...
    epoch 1/5  loss 0.4123  test-acc 0.9120  samples/s 12345  (rank 0 of 2)
    ...
    final test accuracy: 0.9120
loss: mean training cross-entropy over the epoch's steps (all ranks); samples/s: global training
records per second of the epoch's training time (evaluation and checkpointing excluded).

Checkpoint: rank 0 writes --checkpoint after every epoch (format: mnist_format.py). --resume
continues from it when the file exists (else starts fresh): rank 0 reads it and broadcasts
parameters, momentum buffers, epoch and step. Fault injection for tests: env
PYBRIDGE_TEST_FAIL_AT_STEP=N makes rank PYBRIDGE_TEST_FAIL_RANK (default 1) exit with
os._exit(PYBRIDGE_TEST_FAIL_CODE, default 17) before global step N; with
PYBRIDGE_TEST_FAIL_MARKER=PATH only when PATH does not exist yet (it is created), i.e. once.
"""

import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_format as fmt  # noqa: E402

import pybridge  # noqa: E402
from pybridge.ddp import join
from pybridge.base import netif
from pybridge import recordio  # noqa: E402

EVAL_BATCH = 500  # test records per rank and batch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Data-parallel MNIST MLP (the Python twin of the Go trainer)")
    p.add_argument("--data", default="data/mnist", help="folder written by prepare.py (default data/mnist)")
    p.add_argument("--epochs", type=int, default=5, help="epochs (default 5)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="GLOBAL batch: records per step over all ranks, divisible by the world size (64)")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--seed", type=int, default=1, help="initial parameters and data order (default 1)")
    p.add_argument("--checkpoint", default=None, help="rank 0 writes this file after every epoch")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint if it exists")
    p.add_argument("--steps", type=int, default=None,
                   help="stop after this many global steps in all (counted across epochs and resumes)")
    p.add_argument("--metrics", default=None,
                   help="rank 0 writes one JSON line per epoch here (plot with plot.py)")
    p.add_argument("--init-weights", default=None, help="start from these parameters (checkpoint format)")
    p.add_argument("--save-weights", default=None,
                   help="rank 0 writes the final parameters and momentum here (checkpoint format)")
    p.add_argument("--ddp", choices=["pybridge", "torch"], default="pybridge",
                   help="gradient averaging: pybridge.DistributedDataParallel (default) or torch's own "
                        "(the baseline of bench/gotorch.py)")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP bucket size in MiB (default: torch DDP's 25, the first bucket 1)")
    p.add_argument("--partition", choices=["static", "dynamic"], default="static",
                   help="training data: static (equal shares) or dynamic (claimed as ranks go; uneven "
                        "steps, trained under Join)")
    p.add_argument("--slow-rank", type=int, default=-1, help="this rank sleeps --slow-ms before each step")
    p.add_argument("--slow-ms", type=float, default=0.0, help="milliseconds --slow-rank sleeps before each step")
    p.add_argument("--elastic", action="store_true",
                   help="elastic training under pybridge-launch --elastic: survivors of a lost rank go on "
                        "from the last in-memory commit, new ranks join (elastic.py, docs/elastic.md)")
    p.add_argument("--commit-every", type=int, default=10, help="--elastic: commit every N steps (default 10)")
    p.add_argument("--fail-at", type=int, default=0, help="--elastic test aid: --fail-rank SIGKILLs itself "
                                                          "before this step, in the first world")
    p.add_argument("--fail-rank", type=int, default=-1, help="--elastic test aid: the rank that --fail-at kills")
    p.add_argument("--device", default=None,
                   help="cpu or cuda[:N] (default: env PYBRIDGE_DEVICE set by pybridge-launch, else cpu)")
    opts = p.parse_args(argv)
    if opts.epochs < 1 or opts.batch_size < 1 or (opts.steps is not None and opts.steps < 0):
        p.error("--epochs and --batch-size must be positive, --steps non-negative")
    if opts.resume and not opts.checkpoint:
        p.error("--resume needs --checkpoint")
    if opts.slow_ms < 0:
        p.error("--slow-ms must be >= 0")
    return opts


def init_group(device):
    backend = "gloo" if device.type == "cpu" else "auto"
    if os.environ.get("WORLD_SIZE"):
        return pybridge.init(backend=backend)
    # Started without a launcher: a group of one.
    return pybridge.init(backend=backend, rank=0, world_size=1, master_addr="127.0.0.1",
                         master_port=netif.free_port())


def build_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(fmt.IMAGE_BYTES, fmt.HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(fmt.HIDDEN, fmt.NUM_CLASSES))


def params_of(model):
    """The four parameters in checkpoint order: w1, b1, w2, b2."""
    return [model[0].weight, model[0].bias, model[2].weight, model[2].bias]


def state_arrays(model, opt):
    out = {}
    for name, p in zip(fmt.TENSOR_NAMES[:4], params_of(model)):
        out[name] = p.detach().cpu().numpy()
        buf = opt.state.get(p, {}).get("momentum_buffer")
        out["m_" + name] = None if buf is None else buf.detach().cpu().numpy()
    return out


def load_into(model, opt, tensors, with_momentum):
    with torch.no_grad():
        for name, p in zip(fmt.TENSOR_NAMES[:4], params_of(model)):
            p.copy_(torch.from_numpy(tensors[name]))
            if with_momentum:
                opt.state[p]["momentum_buffer"] = torch.from_numpy(tensors["m_" + name]).to(p.device).clone()


def resume_state(opts, model, opt, group, device):
    """Rank 0 reads the checkpoint (if any) and broadcasts it; returns (epoch, step, found)."""
    head = torch.zeros(3, dtype=torch.int64, device=device)  # found, epoch, step
    if group.rank == 0 and os.path.exists(opts.checkpoint):
        epoch, step, tensors = fmt.read_checkpoint(opts.checkpoint)
        load_into(model, opt, tensors, with_momentum=True)
        head[:] = torch.tensor([1, epoch, step])
    pybridge.broadcast(head, 0)
    found, epoch, step = (int(v) for v in head.tolist())
    if found:
        for p in params_of(model):
            if group.rank != 0:
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
            pybridge.broadcast(p.data, 0)
            pybridge.broadcast(opt.state[p]["momentum_buffer"], 0)
    return epoch, step, bool(found)


def maybe_fail(step, rank):
    at = os.environ.get("PYBRIDGE_TEST_FAIL_AT_STEP")
    if at is None or step != int(at) or rank != int(os.environ.get("PYBRIDGE_TEST_FAIL_RANK", "1")):
        return
    marker = os.environ.get("PYBRIDGE_TEST_FAIL_MARKER")
    if marker:
        if os.path.exists(marker):
            return
        open(marker, "w").close()
    print(f"rank {rank}: failing on purpose before step {step} (PYBRIDGE_TEST_FAIL_AT_STEP)",
          file=sys.stderr, flush=True)
    os._exit(int(os.environ.get("PYBRIDGE_TEST_FAIL_CODE", "17")))


def to_inputs(batch, device):
    arrays = batch.decode(fmt.LAYOUT)
    x = torch.from_numpy(arrays["image"].reshape(len(batch), fmt.IMAGE_BYTES)).to(device)
    y = torch.from_numpy(arrays["label"].astype(np.int64)).to(device)
    return x.float().div_(255.0), y


def evaluate(model, test, device, group):
    """(correct, counted) over this rank's test records, padding excluded."""
    n, w = test.num_records, group.size
    share = -(-n // w)
    valid = max(0, min(share, n - group.rank * share))  # records past N are wrap-around padding
    correct = counted = 0
    with torch.no_grad():
        for batch in test:
            if counted >= valid:
                continue  # keep reading: the pass must end cleanly
            x, y = to_inputs(batch, device)
            take = min(len(y), valid - counted)
            pred = model(x[:take]).argmax(1)
            correct += int((pred == y[:take]).sum())
            counted += take
    return correct, counted


def train_step(ddp, opt, batch, device):
    """One SGD step on a batch through the DDP wrapper; the batch's loss."""
    x, y = to_inputs(batch, device)
    opt.zero_grad(set_to_none=False)
    loss = F.cross_entropy(ddp(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def global_accuracy(model, test, device, group):
    """The accuracy over the whole test set, every rank's share counted (a collective)."""
    correct, counted = evaluate(model, test, device, group)
    totals = torch.tensor([correct, counted], dtype=torch.float64, device=device)
    pybridge.all_reduce(totals)
    return totals[0].item() / max(totals[1].item(), 1)


def sync_after_join(model, opt, group, device, done):
    """After a dynamic epoch's join: every rank takes the momentum of the rank that trained
    longest (the largest such rank, whose parameters the join already gave everyone).
    Returns the steps this rank sat out, so every rank counts the group's steps."""
    longest = torch.tensor([done], dtype=torch.int64, device=device)
    pybridge.all_reduce(longest, pybridge.MAX)
    longest = int(longest.item())
    root = join.common_rank(group, done == longest)
    for p in params_of(model):
        buf = opt.state[p].get("momentum_buffer")
        if buf is None:  # this rank has not stepped yet
            buf = opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
        pybridge.broadcast(buf, root)
    return longest - done


def data_kind(folder):
    try:
        with open(os.path.join(folder, fmt.MANIFEST)) as f:
            kind = json.load(f).get("kind", "unknown")
    except (OSError, ValueError):
        return "unknown data (no manifest.json)"
    return {"synthetic": "synthetic digits (SYNTHETIC: not real MNIST)", "mnist": "real MNIST"}.get(kind, kind)


def make_ddp(opts, model, device):
    """pybridge's DDP wrapper, or torch's over the same default process group."""
    caps = {} if opts.bucket_cap_mb is None else {"bucket_cap_mb": opts.bucket_cap_mb}
    if opts.ddp == "torch":
        ids = [device.index or 0] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, **caps)
    return pybridge.DistributedDataParallel(model, **caps)


def main(argv=None):
    opts = parse_args(argv)
    device = torch.device(opts.device or os.environ.get("PYBRIDGE_DEVICE") or "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if opts.elastic:
        import train_elastic
        return train_elastic.run(opts, device, sys.modules[__name__])
    if opts.fail_at or opts.fail_rank >= 0:
        raise SystemExit("--fail-at and --fail-rank go with --elastic")
    group = init_group(device)
    rank, world = group.rank, group.size
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    if opts.batch_size % world:
        raise SystemExit(f"--batch-size {opts.batch_size} is the global batch and must be divisible "
                         f"by the world size {world}")
    per_rank = opts.batch_size // world

    model = build_model(opts.seed).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=opts.lr, momentum=opts.momentum)
    if opts.init_weights and rank == 0:
        load_into(model, opt, fmt.read_checkpoint(opts.init_weights)[2], with_momentum=False)
    start_epoch, step = 0, 0
    if opts.resume:
        start_epoch, step, found = resume_state(opts, model, opt, group, device)
        if found:
            say(f"resumed from {opts.checkpoint} after epoch {start_epoch} (step {step})")
        else:
            say(f"no checkpoint at {opts.checkpoint}: starting from scratch")
    ddp = make_ddp(opts, model, device)  # broadcasts rank 0's parameters

    dynamic = opts.partition == "dynamic"
    train = recordio.Loader(os.path.join(opts.data, fmt.TRAIN_GLOB), per_rank, partition=opts.partition,
                            shuffle=True, seed=opts.seed, drop_last=True)
    test = recordio.Loader(os.path.join(opts.data, fmt.TEST_GLOB), EVAL_BATCH, partition="static",
                           shuffle=False, drop_last=False)
    steps_per_epoch = train.num_records // opts.batch_size if dynamic else train.num_batches
    if steps_per_epoch == 0:
        raise SystemExit(f"{train.num_records} training records are too few for a global batch of "
                         f"{opts.batch_size}")
    say(f"data: {data_kind(opts.data)}, train {train.num_records}, test {test.num_records} | "
        f"{world} ranks, global batch {opts.batch_size} ({per_rank} per rank), "
        f"{'~' if dynamic else ''}{steps_per_epoch} steps/epoch, lr {opts.lr}, momentum {opts.momentum}")

    metrics = open(opts.metrics, "w", buffering=1) if opts.metrics and rank == 0 else None
    run_start = time.perf_counter()
    acc = None
    epoch = start_epoch
    while epoch < opts.epochs and (opts.steps is None or step < opts.steps):
        train.set_epoch(epoch)
        loss_sum, loss_n, done = 0.0, 0, 0
        t0 = time.perf_counter()
        with ddp.join() if dynamic else contextlib.nullcontext():
            for batch in train:
                if opts.steps is not None and step >= opts.steps:
                    if dynamic:
                        continue  # a dynamic pass must be read to its end on every rank
                    break
                maybe_fail(step, rank)
                if rank == opts.slow_rank:
                    time.sleep(opts.slow_ms / 1000)
                loss_sum += train_step(ddp, opt, batch, device)
                loss_n += 1
                done += 1
                step += 1
        if dynamic:
            step += sync_after_join(model, opt, group, device, done)
        train_time = time.perf_counter() - t0
        correct, counted = evaluate(model, test, device, group)
        totals = torch.zeros(4 + world, dtype=torch.float64, device=device)  # then each rank's steps
        totals[:4] = torch.tensor([loss_sum, loss_n, correct, counted], dtype=torch.float64)
        totals[4 + rank] = done
        pybridge.all_reduce(totals)
        loss_sum, loss_n, correct, counted = totals[:4].tolist()
        if dynamic:
            say(f"steps per rank: {[int(v) for v in totals[4:].tolist()]}")
        acc = correct / max(counted, 1)
        epoch += 1
        if rank == 0 and opts.checkpoint:
            fmt.write_checkpoint(opts.checkpoint, epoch, step, state_arrays(model, opt))
        loss, rate = loss_sum / max(loss_n, 1), loss_n * per_rank / max(train_time, 1e-9)
        say(f"epoch {epoch}/{opts.epochs}  loss {loss:.4f}  test-acc {acc:.4f}  "
            f"samples/s {rate:.0f}  (rank {rank} of {world})")
        if metrics:  # the same fields as the Go trainer's --metrics lines
            metrics.write(json.dumps({"epoch": epoch, "step": step, "loss": loss, "test_accuracy": acc,
                                      "samples_per_s": rate, "seconds": time.perf_counter() - run_start,
                                      "ranks": world}) + "\n")

    if acc is None:  # nothing left to train (resumed a finished run): just evaluate
        acc = global_accuracy(model, test, device, group)
    if rank == 0 and opts.save_weights:
        fmt.write_checkpoint(opts.save_weights, epoch, step, state_arrays(model, opt))
    say(f"final test accuracy: {acc:.4f}")
    if metrics:
        metrics.close()
    train.close()
    test.close()
    if opts.ddp == "pybridge":
        ddp.close()
    del ddp
    pybridge.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
