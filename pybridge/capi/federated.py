"""C ABI functions for federated training (capi/pybridge.h, section "Federated training").

Conversion only: the protocol, the server's assignment, its model copy and FedAvg live in
pybridge/federated/ (FedAvgRounds). A server handle keeps the last result's payload (until
the next pull), a worker handle its open task. Caller memory is read or written during a
call only.
"""

from .. import abi, capi
from ..base import dtypes
from ..base.checks import integer
from ..errors import InvalidArgument, WorkerFailed
from ..federated import EVALUATE, TRAIN, FedAvgRounds, Server, Worker, modes, sample_clients
from . import flag, handles, live_group, tensor, text


def codes(prefix, names):
    """{C code: name} for the names of a core registry, each code the header's constant
    `prefix` + NAME (PB_FED_ + fedbuff: PB_FED_FEDBUFF). The registry is the one list of
    names, the header the one source of numbers; a name without a constant stops the
    library's start (tests/test_federated_registry.py says which)."""
    return {getattr(abi, prefix + name.upper()): name for name in names}


def choices(prefix, table):
    """The codes of `table` (from codes()) for an error message: "PB_X_A (0), PB_X_B (1) or ..."."""
    words = [f"{prefix}{name.upper()} ({code})" for code, name in sorted(table.items())]
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


MODES = codes("PB_FED_", modes.MODES)  # pb_fed_server_new's mode -> the Server's
COMMANDS = (TRAIN, EVALUATE)  # the header's PB_FED_TRAIN and PB_FED_EVALUATE


class FedServer:
    def __init__(self, rounds):
        self.rounds = rounds  # the core's FedAvgRounds: the server, its model copy, the round's FedAvg
        self.payload = None  # the last result's payload, until the next pull
        self.metrics = None  # the last result's metrics, until the next pull


class FedWorker:
    def __init__(self, worker):
        self.worker = worker
        self.task = None  # the open task


def _server(ptr):
    return handles.get(ptr, FedServer, "server")


def _worker(ptr):
    return handles.get(ptr, FedWorker, "worker")


def _not_null(*pairs):
    for ptr, what in pairs:
        if ptr == capi.ffi.NULL:
            raise InvalidArgument(f"{what} is NULL")


def _copy_out(source, out, what):
    """Copy `source` into the caller's descriptor `out`, which must match it exactly."""
    t = tensor(out, "out")
    if t.numel() != source.numel() or t.dtype != source.dtype:
        raise InvalidArgument(f"out must hold the {what}: {source.numel()} elements of {source.dtype}; "
                              f"got {t.numel()} of {t.dtype}")
    t.copy_(source.reshape(-1))


# ---- server ------------------------------------------------------------------------------

def pb_fed_server_new(group, mode, timeout, requeue, out):
    g = live_group(group)
    _not_null((out, "out (the pointer to store the server handle in)"))  # before the collective
    if mode not in MODES:
        raise InvalidArgument(f"mode must be {choices('PB_FED_', MODES)}, got {mode}")
    requeue = flag(requeue, "requeue")
    s = Server(g, mode=MODES[mode], timeout=None if timeout <= 0 else timeout, requeue=requeue)
    try:
        handles.add(FedServer(FedAvgRounds(s)), "pb_fed_server *", out)
    except BaseException:
        s.close()
        raise


def pb_fed_server_set_max_norm(server, max_norm):
    _server(server).rounds.server.set_max_norm(max_norm)


def pb_fed_server_set_max_samples(server, max_samples):
    _server(server).rounds.server.set_max_samples(max_samples)


def pb_fed_server_set_affinity(server, client, workers, n):
    s = _server(server)
    integer("n", n, low=0)
    if n and workers == capi.ffi.NULL:
        raise InvalidArgument(f"workers is NULL with n = {n}")
    s.rounds.server.set_affinity(client, [int(workers[i]) for i in range(n)])


def _no_round():
    return InvalidArgument("no round was started: call pb_fed_server_start_round first")


def pb_fed_server_start_round(server, clients, n, model, command):
    s = _server(server)
    if command not in COMMANDS:
        raise InvalidArgument(f"command must be PB_FED_TRAIN ({abi.PB_FED_TRAIN}) or PB_FED_EVALUATE "
                              f"({abi.PB_FED_EVALUATE}), got {command}")
    integer("n", n, low=0)
    if n and clients == capi.ffi.NULL:
        raise InvalidArgument(f"clients is NULL with n = {n}")
    m = tensor(model, "model")
    s.payload = s.metrics = None
    s.rounds.start([int(clients[i]) for i in range(n)], m, evaluate=command == abi.PB_FED_EVALUATE)


def pb_fed_server_next_result(server, out, has_result):
    s = _server(server)
    _not_null((out, "out"), (has_result, "has_result"))
    has_result[0] = 0
    out.command, out.worker, out.round, out.client = 0, -1, 0, -1
    out.samples, out.length, out.dtype, out.reserved, out.seconds = 0, 0, 0, 0, 0.0
    s.payload = s.metrics = None
    if not s.rounds.started:
        raise _no_round()
    try:
        r = s.rounds.next_result()
    except WorkerFailed as exc:
        out.round = s.rounds.server.round if exc.round is None else exc.round
        out.worker = -1 if exc.worker is None else exc.worker
        out.client = -1 if exc.client is None else exc.client
        raise
    if r is None:
        return
    out.command, out.worker, out.round, out.client = r.command, r.worker, r.round, r.client
    out.samples, out.length, out.dtype, out.seconds = r.samples, r.payload.numel(), dtypes.code(r.payload.dtype), \
        r.seconds
    s.payload, s.metrics = r.payload, r.metrics
    has_result[0] = 1


def pb_fed_server_result_payload(server, out):
    s = _server(server)
    if s.payload is None:
        raise InvalidArgument("no result to copy: pb_fed_server_next_result returned none since the last call")
    _copy_out(s.payload, out, "result's payload")


def _metric(metrics, name, value, found):
    _not_null((value, "value"), (found, "found"))
    key = text(name)
    if not key:
        raise InvalidArgument("name is NULL or empty")
    found[0] = int(key in metrics)
    value[0] = metrics.get(key, 0.0)


def pb_fed_server_result_metric(server, name, value, found):
    s = _server(server)
    if s.metrics is None:
        raise InvalidArgument("no result: pb_fed_server_next_result returned none since the last call")
    _metric(s.metrics, name, value, found)


def pb_fed_server_round_metric(server, name, value, found):
    s = _server(server)
    if s.rounds.server.current is None:
        raise _no_round()
    _metric(s.rounds.server.current.metrics, name, value, found)


def pb_fed_server_aggregate(server, lr, model, clients):
    s = _server(server)
    if not s.rounds.started:
        raise _no_round()
    if s.rounds.buffered and lr <= 0:
        lr = None  # FedBuff / FedAsync: keep the configured eta (fed_strategies.py)
    count = s.rounds.aggregate(lr, out=tensor(model, "model"))
    if clients != capi.ffi.NULL:
        clients[0] = count


def pb_fed_server_close(server):
    s = handles.remove(server, FedServer, "server")
    s.payload = None
    s.rounds.close()


# ---- worker ------------------------------------------------------------------------------

def pb_fed_worker_new(group, out):
    g = live_group(group)
    _not_null((out, "out (the pointer to store the worker handle in)"))  # before the collective
    w = Worker(g)
    try:
        handles.add(FedWorker(w), "pb_fed_worker *", out)
    except BaseException:
        w.close()
        raise


def pb_fed_worker_next_task(worker, task, has_task):
    c = _worker(worker)
    _not_null((task, "task"), (has_task, "has_task"))
    has_task[0] = 0
    t = c.worker.next_task()
    if t is None:
        c.task = None
        return
    c.task = t
    task.command, task.dtype, task.round = t.command, dtypes.code(t.model.dtype), t.round
    task.client, task.length = t.client, t.model.numel()
    has_task[0] = 1


def _open_task(c):
    if c.task is None:
        raise InvalidArgument("no task is open: call pb_fed_worker_next_task first")
    return c.task


def pb_fed_worker_task_model(worker, out):
    c = _worker(worker)
    _copy_out(_open_task(c).model, out, "task's model")


def pb_fed_worker_submit(worker, result, samples):
    c = _worker(worker)
    c.worker.submit(_open_task(c), tensor(result, "result"), samples)
    c.task = None


def pb_fed_worker_submit_metrics(worker, result, samples, n, names, values):
    c = _worker(worker)
    integer("n", n, low=0, high=abi.PB_FED_MAX_METRICS)
    if n and (names == capi.ffi.NULL or values == capi.ffi.NULL):
        raise InvalidArgument(f"{'names' if names == capi.ffi.NULL else 'values'} is NULL with n = {n}")
    metrics = {}
    for i in range(n):
        name = text(names[i])
        if not name or name in metrics:
            raise InvalidArgument(f"names[{i}] is NULL, empty or repeated ({name!r})")
        metrics[name] = float(values[i])
    c.worker.submit(_open_task(c), tensor(result, "result"), samples, metrics)
    c.task = None


def pb_fed_worker_fail(worker, message):
    c = _worker(worker)
    text = "" if message == capi.ffi.NULL else capi.ffi.string(message).decode("utf-8", "replace")
    c.worker.fail(_open_task(c), text)
    c.task = None


def pb_fed_worker_close(worker):
    c = handles.remove(worker, FedWorker, "worker")
    c.task = None
    c.worker.close()


pb_fed_worker_free = pb_fed_worker_close  # deprecated name (pybridge.h), the same function



def pb_fed_sample_clients(num_clients, per_round, seed, round, out):
    _not_null((out, "out"))
    for i, c in enumerate(sample_clients(num_clients, per_round, seed, round)):
        out[i] = c
