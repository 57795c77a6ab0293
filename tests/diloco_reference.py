"""A plain single-process transcription of (Streaming) DiLoCo, for the tests to compare with.

All replicas live in one process; the pseudo-gradients are averaged with a Python sum in
rank order (or, for a quantized run, through the same chunked two-stage exchange the
ranks do, written out here with the codec's encode and decode); the outer optimizer is
Nesterov SGD written out (torch.optim.SGD's update). Nothing from pybridge.algorithms.diloco
is used: only the codec, whose bounds tests/test_diloco_quantize.py checks on its own.
"""

import torch
import torch.nn.functional as F

IN, HIDDEN, OUT = 7, 5, 3  # odd sizes: tensors of 35, 5, 15 and 3 elements


def model():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def inner_optimizer(net):
    return torch.optim.AdamW(net.parameters(), lr=0.02, weight_decay=0.01)


def batch(rank, step):
    """Rank `rank`'s batch for inner step `step` (from 1): each rank its own data."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(6, IN, generator=g), torch.randn(6, OUT, generator=g)


def inner_step(net, opt, rank, step):
    x, y = batch(rank, step)
    opt.zero_grad()
    F.mse_loss(net(x), y).backward()
    opt.step()


def _exchange(deltas, codec):
    """The mean of the replicas' flat deltas as the ranks compute it (quantized_average's
    steps, spelled out): chunks of whole blocks, each rank's chunk decoded and summed in
    rank order, divided, encoded again and decoded."""
    p, n = len(deltas), deltas[0].numel()
    if p == 1:
        return deltas[0].clone()
    c = -(-n // p)
    if codec.scaled:
        c = -(-c // codec.block) * codec.block
    out = torch.zeros(p * c)
    for r in range(p):
        total = torch.zeros(c)
        for d in deltas:
            chunk = torch.zeros(p * c)
            chunk[:n] = d
            piece = chunk[r * c:(r + 1) * c]
            total += codec.decode(codec.encode(piece), c)
        total /= p
        out[r * c:(r + 1) * c] = codec.decode(codec.encode(total), c)
    return out[:n]


def run(world, steps, sync_every, *, fragments=((0, 1, 2, 3),), delay=0, alpha=0.0, lr=0.7, momentum=0.9,
        codec=None, error_feedback=False, lost=None):
    """Every replica's flat parameters after `steps` inner steps. fragments: tensor indices.
    lost: (rank, step): that replica stops after that inner step (and that step's sync); later
    syncs average the others."""
    nets = [model() for _ in range(world)]
    opts = [inner_optimizer(n) for n in nets]
    params = [list(n.parameters()) for n in nets]
    anchor = [p.detach().clone() for p in params[0]]
    buf = [None] * len(anchor)
    residual = [[torch.zeros(sum(anchor[i].numel() for i in f)) for f in fragments] for _ in range(world)]
    interval = sync_every // len(fragments)
    pending = {}
    alive = list(range(world))
    for t in range(1, steps + 1):
        for r in alive:
            inner_step(nets[r], opts[r], r, t)
        if (t + delay) % interval == 0:
            k = (t + delay) // interval - 1
            fi = k % len(fragments)
            f = fragments[fi]
            flats = [torch.cat([(anchor[i] - params[r][i].detach()).reshape(-1) for i in f]) for r in alive]
            if codec is None:
                total = torch.zeros_like(flats[0])
                for d in flats:
                    total += d
                mean = total / len(alive)
            else:
                ins = [d + residual[r][fi] if error_feedback else d for r, d in zip(alive, flats)]
                mean = _exchange(ins, codec)
                if error_feedback:
                    for r, x in zip(alive, ins):
                        residual[r][fi] = x - _own(x, codec, len(alive))
            pending[t + delay] = (f, mean)
        if t % interval == 0 and t in pending:
            f, mean = pending.pop(t)
            at = 0
            for i in f:
                n = anchor[i].numel()
                g = mean[at:at + n].view_as(anchor[i])
                at += n
                buf[i] = g.clone() if buf[i] is None else buf[i] * momentum + g
                anchor[i] = anchor[i] - lr * (g + momentum * buf[i])
                for r in alive:
                    with torch.no_grad():
                        local = params[r][i].detach().clone()
                        params[r][i].copy_(torch.lerp(anchor[i], local, alpha))
        if lost is not None and t == lost[1]:
            alive.remove(lost[0])
    return [torch.cat([p.detach().reshape(-1) for p in ps]) for ps in params]


def _own(x, codec, p):
    """What a rank's own quantized contribution decodes to (error feedback's `sent`)."""
    n = x.numel()
    c = -(-n // p)
    if codec.scaled:
        c = -(-c // codec.block) * codec.block
    padded = torch.zeros(p * c)
    padded[:n] = x
    return torch.cat([codec.decode(codec.encode(padded[r * c:(r + 1) * c]), c) for r in range(p)])[:n]


def diloco_kwargs(how):
    """A test's settings as DiLoCo's keywords: fragments as lists, a Codec as its format and
    block size."""
    how = dict(how)
    if "fragments" in how:
        how["fragments"] = [list(f) for f in how["fragments"]]
    codec = how.pop("codec", None)
    if codec is not None:
        how.update(quantization=codec.name, block_size=codec.block)
    return how
