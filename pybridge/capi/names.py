"""What C calls the Python names in the core's messages.

The core's messages speak to Python callers: `call finalize() first`, `got torch.int32`,
`between wait() calls`. A message that leaves through the C ABI (`capi._fail`) is
translated here, once, to the names a C caller uses: `pb_finalize`, `PB_INT32`,
`pb_reducer_wait`, and starts with the C function that failed, once. Go translates
these C names to its own where its error is built (`goNames` in go/errors.go). Nothing
else in pybridge/capi rewrites a message.
"""

import re

from ..base import dtypes

# The core's spelling -> the C ABI's. Where one Python spelling is reached from several C
# functions (a tuple), the failing function is named if it is one of them, else the first.
# A spelling that could mean something else elsewhere is given with its context.
WORDS = {
    "pybridge.init()": "pb_init",
    "finalize()": "pb_finalize",
    "pybridge.finalize()": "pb_finalize",
    "broadcast_parameters": "pb_broadcast_params",
    "between wait() calls": "between pb_reducer_wait calls",
    "join()": "pb_reducer_join",
    "join=True": "PB_REDUCER_JOIN",
    "divide_by_initial_world_size=False": "PB_REDUCER_JOIN_DIVIDE_BY_ACTIVE",
    "allow_unused=True (find_unused_parameters=True in the DDP wrapper)": "PB_REDUCER_ALLOW_UNUSED",
    "bind_grads()": "pb_reducer_bind_grads",
    "set_shapes()": "pb_reducer_set_shapes",
    "register_comm_hook()": ("pb_reducer_set_hook", "pb_reducer_set_gossip"),
    "load_state_dict()": ("pb_checkpoint_restore", "pb_state_restore", "pb_state_sync", "pb_state_reset"),
    "partition='static'": "PB_PARTITION_STATIC",
    "elastic.reset()": "pb_state_reset",
    "a MembershipChanged": "PB_ERR_MEMBERSHIP",
    "submit() or fail() it": "pb_fed_worker_submit or pb_fed_worker_fail it",
    "start()": "pb_observe_start",
    # torch.float32 -> PB_FLOAT32, for the eight dtypes that cross the ABI
    **{str(dt): f"PB_{name.upper()}" for name, dt in dtypes.NAMES.items()},
}

# The classes the handle table holds (capi.Handles), by name -> the C handle type.
HANDLE_TYPES = {
    "Group": "pb_group", "Buffer": "pb_buffer", "Work": "pb_work", "LoaderHandle": "pb_loader",
    "CReducer": "pb_reducer", "PeriodicModelAverager": "pb_averager", "CState": "pb_state",
    "FedServer": "pb_fed_server", "FedWorker": "pb_fed_worker", "DiLoCo": "pb_diloco",
}

# Whole spellings only (not `finalize()` inside `pybridge.finalize()`), the longest first.
_PATTERN = re.compile(r"(?<![\w.])(?:" + "|".join(map(re.escape, sorted(WORDS, key=len, reverse=True)))
                      + r")(?!\w)")


def c_message(function, message):
    """What C reads after `function` failed with `message`: `function: message`, with the
    core's Python names replaced by C's (`function` picks among the C functions one Python
    function stands for), and the function named once where the message names it first
    (`broadcast_parameters: ...` from pb_broadcast_params)."""
    def pick(match):
        c = WORDS[match.group(0)]
        if isinstance(c, tuple):
            return function if function in c else c[0]
        return c
    text = _PATTERN.sub(pick, message)
    return text if text.startswith(f"{function}: ") else f"{function}: {text}"


def handle_type(kind):
    """The C type of a handle table's class (its Python name if it has none)."""
    return HANDLE_TYPES.get(kind.__name__, kind.__name__)
