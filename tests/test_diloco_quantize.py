"""The outer-gradient quantizers (pybridge/algorithms/quantize.py): each format's stated error
bound on tensors of odd shapes and sizes (0-d, empty, sizes that are not whole blocks),
exact round trips of values a format represents, payload sizes, non-finite blocks, error
feedback; and the Streaming DiLoCo schedule against torchft's rule, written out."""

import math

import pytest
import torch

from pybridge.algorithms import diloco_schedule
from pybridge.algorithms.quantize import FORMATS, Codec, ErrorFeedback, dequantize, quantize
from pybridge.errors import InvalidArgument

SHAPES = [(), (0,), (1,), (2,), (7,), (3, 5, 7), (2, 0, 3), (129,), (4097,)]
BLOCKS = [1, 16, 64, 128]


def _values(shape, seed):
    """Magnitudes over 6 decades, signs mixed, some exact zeros."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    x = torch.randn(n, generator=g) * torch.logspace(-3, 3, max(n, 1))[:n]
    x[::11] = 0.0
    return x.view(shape)


def _slack(x):
    return x.abs().reshape(-1) * 2.0 ** -22  # float32 rounding of x/s and q*s (the module's note)


@pytest.mark.parametrize("name", FORMATS)
def test_error_within_the_stated_bound_on_odd_shapes(name):
    worst = 0.0
    for block in BLOCKS if name in ("fp8", "int8", "int4") else [128]:
        c = Codec(name, block)
        for i, shape in enumerate(SHAPES):
            x = _values(shape, 17 * i + block)
            payload = quantize(x, name, block)
            assert payload.dtype == torch.uint8 and payload.numel() == c.nbytes(x.numel())
            y = dequantize(payload, x.shape, name, block)
            assert y.shape == x.shape and y.dtype == torch.float32
            err = (x - y).abs().reshape(-1)
            bound = c.bound(x)
            assert (err <= bound + _slack(x)).all(), (name, block, shape, (err - bound).max())
            if bound.numel():
                worst = max(worst, (err / bound.clamp_min(1e-30)).max().item())
    if name == "fp32":
        assert worst == 0.0
    else:  # the bound is approached: it says what the format loses, not something far looser
        assert worst > 0.4, worst


@pytest.mark.parametrize("name,values", [
    ("int8", torch.arange(-127, 128) * 0.5),                 # scale 0.5: every q * s exact
    ("int4", torch.arange(-7, 8) * 0.25),
    ("fp8", torch.tensor([448.0, -448.0, 1.0, 0.5, -0.1015625, 2.0 ** -9, 0.0, 3.5])),  # e4m3 numbers, s = 1
    ("bf16", torch.tensor([1.0, -2.0, 1.0078125, 2.0 ** 127 * 1.5, 2.0 ** -133, 0.0])),
    ("fp32", torch.tensor([math.pi, -1e-38, 1e38, 0.0])),
])
def test_values_a_format_represents_round_trip_exactly(name, values):
    c = Codec(name, values.numel())
    assert torch.equal(c.decode(c.encode(values), values.numel()), values)


@pytest.mark.parametrize("name", ["fp8", "int8", "int4"])
def test_a_non_finite_block_decodes_as_nan_and_no_other(name):
    c = Codec(name, 4)
    x = torch.tensor([1.0, float("inf"), 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, float("nan"), 1.0])
    y = c.decode(c.encode(x), x.numel())
    assert torch.isnan(y[:4]).all() and torch.isnan(y[8:]).all()
    assert torch.isfinite(y[4:8]).all() and (y[4:8] - x[4:8]).abs().max() <= c.bound(x[4:8]).max()


def test_payload_sizes():
    assert Codec("int4", 128).nbytes(1001) == 504 + 4 * 8  # 501 bytes of nibbles, padded to 504; 8 scales
    assert Codec("int8", 64).nbytes(1) == 4 + 4
    assert Codec("bf16").nbytes(3) == 8 and Codec("fp32").nbytes(3) == 12
    assert Codec("int4", 128).bytes_per_element() == 0.5 + 4 / 128
    for name in FORMATS:
        assert Codec(name).nbytes(0) == 0


def test_error_feedback_keeps_the_running_sum_within_one_bound():
    """Quantizing the same x K times: with error feedback the decoded values sum to K x
    within one quantization's error; without it the error grows K-fold."""
    c = Codec("int4", 64)
    x = _values((300,), 5)
    fb = ErrorFeedback(x.numel())
    total, plain = torch.zeros(300), torch.zeros(300)
    K = 50
    for _ in range(K):
        x_in = fb.add(x)
        sent = c.decode(c.encode(x_in), 300)
        fb.commit(x_in, sent)
        total += sent
        plain += c.decode(c.encode(x), 300)
    one = c.bound(x)
    assert ((total - K * x).abs() <= 2 * one + 1e-3).all()
    assert (plain - K * x).abs().max() > 5 * (total - K * x).abs().max()  # without: K times one error
    assert [v.shape for v in fb.views([(10, 10), (200,)])] == [(10, 10), (200,)]
    with pytest.raises(InvalidArgument, match="this one holds 300"):
        fb.load_state_dict({"residual": torch.zeros(3)})


def test_bad_arguments_are_named():
    with pytest.raises(InvalidArgument, match="quantization 'int2' is unknown"):
        Codec("int2")
    with pytest.raises(InvalidArgument, match="block size must be"):
        Codec("int8", 0)
    with pytest.raises(InvalidArgument, match="only floating-point tensors"):
        quantize(torch.arange(3), "int8")
    with pytest.raises(InvalidArgument, match="a int8 payload of 5 elements is 12 uint8"):
        Codec("int8").decode(torch.zeros(3, dtype=torch.uint8), 5)


def _torchft_schedule(sync_every, fragments, delay, steps):
    """torchft.local_sgd.DiLoCo's rule, transcribed: a local step counter reset at each sync;
    prepare fragment (manager step mod F) at H/F - tau, perform at H/F; each commit moves
    the manager step."""
    h, local, manager, out, prepared = sync_every // fragments, 0, 0, [], None
    for step in range(1, steps + 1):
        local += 1
        if local == h - delay:
            prepared = (manager % fragments, step)
        if local == h:
            out.append((prepared[0], prepared[1], step))
            manager += 1
            local = 0
    return out


@pytest.mark.parametrize("sync_every,fragments,delay", [(5, 1, 0), (6, 2, 1), (12, 3, 3), (8, 4, 1), (9, 3, 0)])
def test_schedule_is_torchfts(sync_every, fragments, delay):
    s = diloco_schedule.Schedule(sync_every, fragments, delay)
    got = [(p.fragment, p.launch, p.apply) for p in s.syncs(40)]
    assert got == _torchft_schedule(sync_every, fragments, delay, 40)
    for p in s.syncs(40):
        assert s.launched_after(p.launch) == p and s.applied_after(p.apply) == p
    launches = {p.launch for p in s.syncs(40)}
    assert all(s.launched_after(t) is None for t in range(1, 38) if t not in launches)


def test_fragments_cut_in_order():
    assert diloco_schedule.split([10] * 8, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert diloco_schedule.split([35, 5, 15, 3], 2) == [[0], [1, 2, 3]]
    assert diloco_schedule.split([1, 1, 100], 3) == [[0], [1], [2]]
    assert diloco_schedule.split([5], 1) == [[0]]
