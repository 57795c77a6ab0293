"""Server strategies and FedBuff through the C ABI (cffi ABI mode) on 3 gloo ranks: a C
server in mode PB_FED_FEDBUFF with FedAdam (its model checked against a float64 reference
written here from the order the results came in), a C server in mode PB_FED_ASYNC with
FedYogi and central DP (clip norm, noise multiplier and noise recorded per step), and
pb_fed_options misuse; Python workers with known updates."""

import os
import time

import numpy as np
import pytest

from capi_loader import LIB_PATH, init_world, last_error, load, np_tensor
from ranks import run_ranks

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")

WORLD = 3
V = np.arange(1, 6, dtype=np.float32)


def _header_defaults():
    """What pb_fed_options_init sets, read from its body in the header (a static inline
    function, which cffi's ABI mode cannot call)."""
    import re
    with open(os.path.join(os.path.dirname(LIB_PATH), "..", "capi", "pybridge.h")) as f:
        text = f.read()
    body = text[text.index("static inline void pb_fed_options_init"):]
    return dict(re.findall(r"options->(\w+) = ([^;]+);", body[:body.index("\n}")]))


def _options(ffi, lib, **fields):
    o = ffi.new("pb_fed_options *")
    for name, value in _header_defaults().items():
        if name == "size":
            o.size = ffi.sizeof("pb_fed_options")
        elif name == "strategy_name":
            o.strategy_name = ffi.NULL
        else:
            setattr(o, name, getattr(lib, value) if value.startswith("PB_") else float(value)
                    if name not in ("buffer_size", "max_staleness", "dp_seed") else int(value))
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def test_adapter_defaults_are_the_headers():
    from pybridge.capi import fed_strategies as adapter
    ffi, lib = load()
    header = _header_defaults()
    assert set(header) == {name for name, _ in ffi.typeof("pb_fed_options").fields}
    for name, value in header.items():
        if name == "strategy_name":  # a pointer: NULL
            assert value == "0" and adapter._DEFAULTS[name] is None
        elif name != "size":
            want = getattr(lib, value) if value.startswith("PB_") else float(value)
            assert adapter._DEFAULTS[name] == want, name


def _server(ffi, lib, g, mode):
    sp = ffi.new("pb_fed_server **")
    assert lib.pb_fed_server_new(g, mode, 60.0, 0, sp) == 0, last_error(ffi, lib)
    return sp[0]


def _pull(ffi, lib, s):
    """Every result of the round: (client, round, samples)."""
    info, has, got = ffi.new("pb_fed_result *"), ffi.new("int32_t *"), []
    while True:
        assert lib.pb_fed_server_next_result(s, info, has) == 0, last_error(ffi, lib)
        if not has[0]:
            return got
        got.append((info.client, info.round, info.samples))


def _last_step(ffi, lib, s):
    step, has, refused = ffi.new("pb_fed_step *"), ffi.new("int32_t *"), ffi.new("int64_t *")
    assert lib.pb_fed_server_last_step(s, step, has, refused) == 0, last_error(ffi, lib)
    return {f: getattr(step, f) for f, _ in ffi.typeof("pb_fed_step").fields} | {"has": has[0],
                                                                                  "refused": refused[0]}


def _fedbuff(ffi, lib, g):
    out = {}
    s = _server(ffi, lib, g, lib.PB_FED_FEDBUFF)
    for bad, words in (({"strategy": 9}, "strategy"), ({"size": 2}, "size"), ({"beta1": 1.5, "strategy": lib.PB_FED_STRATEGY_FEDADAM}, "beta1"),
                       ({"dp_noise_multiplier": 1.0}, "clip norm"), ({"staleness": 7}, "staleness"),
                       ({"buffer_size": -1}, "buffer_size")):
        assert lib.pb_fed_server_configure(s, _options(ffi, lib, **bad)) == lib.PB_ERR_INVALID_ARGUMENT, bad
        assert words in last_error(ffi, lib), (bad, last_error(ffi, lib))
    assert lib.pb_fed_server_configure(s, _options(ffi, lib, strategy=lib.PB_FED_STRATEGY_FEDADAM, eta=0.1,
                                                   buffer_size=2, staleness=lib.PB_FED_STALENESS_POLYNOMIAL,
                                                   staleness_a=0.5)) == 0, last_error(ffi, lib)
    out["before"] = _last_step(ffi, lib, s)
    model = np.zeros(5, np.float32)
    clients = ffi.new("int64_t[]", list(range(16)))
    assert lib.pb_fed_server_start_round(s, clients, 16, np_tensor(ffi, lib, model), lib.PB_FED_TRAIN) == 0
    out["results"] = _pull(ffi, lib, s)
    count = ffi.new("int32_t *")
    assert lib.pb_fed_server_aggregate(s, 0.0, np_tensor(ffi, lib, model), count) == 0, last_error(ffi, lib)
    out["aggregated"], out["model"], out["step"] = count[0], model.tolist(), _last_step(ffi, lib, s)
    assert lib.pb_fed_server_configure(s, ffi.NULL) == lib.PB_ERR_INVALID_ARGUMENT  # a round started
    assert lib.pb_fed_server_close(s) == 0, last_error(ffi, lib)
    return out


def _dp_rounds(ffi, lib, g):
    out = {}
    s = _server(ffi, lib, g, lib.PB_FED_ASYNC)
    assert lib.pb_fed_server_configure(s, _options(ffi, lib, buffer_size=3)) == lib.PB_ERR_INVALID_ARGUMENT
    out["buffered_refused"] = last_error(ffi, lib)
    assert lib.pb_fed_server_configure(s, _options(ffi, lib, strategy=lib.PB_FED_STRATEGY_FEDYOGI, eta=0.05,
                                                   dp_clip_norm=2.0, dp_noise_multiplier=0.5, dp_seed=3)) == 0
    model = np.zeros(5, np.float32)
    clients = ffi.new("int64_t[]", list(range(4)))
    assert lib.pb_fed_server_start_round(s, clients, 4, np_tensor(ffi, lib, model), lib.PB_FED_TRAIN) == 0
    out["results"] = _pull(ffi, lib, s)
    count = ffi.new("int32_t *")
    assert lib.pb_fed_server_aggregate(s, 0.05, np_tensor(ffi, lib, model), count) == 0, last_error(ffi, lib)
    out["model"], out["step"] = model.tolist(), _last_step(ffi, lib, s)
    assert lib.pb_fed_server_close(s) == 0, last_error(ffi, lib)
    return out


def _worker(rank):
    import torch
    from pybridge.federated import Worker

    def train(model, client):
        # Worker 1 is slow: its results come in stale. The other answers about 3 clients (a
        # FedBuff step) while it trains one, and the 16 clients take it longer than one of the
        # slow worker's, so that the slow results arrive within the round, loaded machine or not.
        time.sleep(0.1 if rank == 1 else 0.03)
        return model + (client + 1) * torch.from_numpy(V), client + 1
    Worker().serve(train)


def federated(rank, world):
    ffi, lib = load()
    g = init_world(ffi, lib, timeout=60.0)
    out = {}
    for name, fn in (("fedbuff", _fedbuff), ("dp", _dp_rounds)):
        if rank == 0:
            out[name] = fn(ffi, lib, g)
        else:
            _worker(rank)
    assert lib.pb_finalize(g) == 0
    return out


@pytest.fixture(scope="module")
def result():
    return run_ranks(federated, WORLD, timeout=120)


def test_a_c_fedbuff_server_with_fedadam_steps_every_two_results(result):
    b = result[0]["fedbuff"]
    assert b["before"]["has"] == 0
    got = b["results"]
    steps = len(got) // 2
    assert b["aggregated"] == 2 * steps and b["step"]["version"] == 1 + steps and b["step"]["clients"] == 2
    # Reddi et al.'s FedAdam over FedBuff's staleness-weighted steps, in float64.
    x, m, v = np.zeros(5), np.zeros(5), np.full(5, 1e-6)
    taus = []
    for k in range(steps):
        pair = got[2 * k:2 * k + 2]
        tau = [1 + k - rnd for _, rnd, _ in pair]
        taus += tau
        n = [c + 1 for c, _, _ in pair]
        g = sum((1 + t) ** -0.5 * ni * -(c + 1) * V.astype(np.float64) for (c, _, _), t, ni in zip(pair, tau, n)) \
            / sum(n)
        d = -g
        m = 0.9 * m + 0.1 * d
        v = 0.99 * v + 0.01 * d * d
        x = (x + 0.1 * m / (np.sqrt(v) + 1e-3)).astype(np.float32).astype(np.float64)
    assert any(t > 0 for t in taus)
    np.testing.assert_allclose(b["model"], x, rtol=1e-6)
    assert b["step"]["max_staleness"] == max(taus[-2:]) and b["step"]["lr"] == 0.1


def test_a_c_server_records_central_dp_per_step(result):
    d = result[0]["dp"]
    assert "are for the fedbuff and fedasync modes" in d["buffered_refused"]
    st = d["step"]
    assert st["has"] == 1 and st["clients"] == 4 and st["clip_norm"] == 2.0 and st["noise_multiplier"] == 0.5
    assert st["noise_std"] == 0.5 * 2.0 / 4 and st["clipped"] == 4  # every delta, (c+1)|V| > 2, was clipped
    assert st["lr"] == 0.05 and st["max_staleness"] == 0 and st["version"] == 1
    assert np.all(np.isfinite(d["model"])) and np.any(np.array(d["model"]) != 0)
