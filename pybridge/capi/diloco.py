"""C ABI functions for DiLoCo and Streaming DiLoCo (pybridge.algorithms.diloco). Conversion
only: the schedule, the checks of every setting, the quantized average and the outer step
live in the core."""

from .. import abi, capi
from ..algorithms import diloco as _diloco
from ..algorithms.quantize import FORMATS
from ..errors import InvalidArgument
from . import flag, handles, live_group, options, put, tensor_array
from .federated import choices, codes

# pb_diloco_options: each field and the default pb_diloco_options_init gives it, in struct order.
_DEFAULTS = {"fragments": 1, "delay": 0, "alpha": 0.0, "outer_lr": _diloco.OUTER_LR,
             "outer_momentum": _diloco.OUTER_MOMENTUM, "outer_nesterov": 1, "quantization": abi.PB_QUANT_FP32,
             "block_size": 128, "error_feedback": 0}
QUANTIZATIONS = codes("PB_QUANT_", FORMATS)  # pb_diloco_options.quantization -> the core's format name


def _get(ptr):
    return handles.get(ptr, _diloco.DiLoCo, "diloco")


def pb_diloco_create(group, n, params, sync_every, opts, out):
    g = live_group(group)
    o = options.read(opts, "pb_diloco_options", _DEFAULTS)
    quantization = QUANTIZATIONS.get(o["quantization"])
    if quantization is None:
        raise InvalidArgument(f"pb_diloco_options.quantization must be {choices('PB_QUANT_', QUANTIZATIONS)}, "
                              f"got {o['quantization']}")
    if out == capi.ffi.NULL:
        raise InvalidArgument("out (the pointer to store the handle in) is NULL")
    # Copies: the core keeps the tensors it was made with (their shapes), and the caller's
    # memory is only lent for this call; every pb_diloco_step passes it again.
    tensors = [t.clone() for t in tensor_array(n, params, "params")]
    outer = _diloco.outer_sgd(o["outer_lr"], o["outer_momentum"],
                              flag(o["outer_nesterov"], "pb_diloco_options.outer_nesterov"))
    d = _diloco.DiLoCo(tensors, sync_every, outer_optimizer=outer, fragments=o["fragments"], delay=o["delay"],
                       alpha=o["alpha"], quantization=quantization, block_size=o["block_size"],
                       error_feedback=flag(o["error_feedback"], "pb_diloco_options.error_feedback"), group=g)
    handles.add(d, "pb_diloco *", out)


def pb_diloco_step(diloco, n, params, synced):
    did = _get(diloco).step(tensor_array(n, params, "params"))
    if synced != capi.ffi.NULL:
        synced[0] = int(did)


def pb_diloco_counts(diloco, steps, syncs, bytes_sent):
    d = _get(diloco)
    for out, value in ((steps, d.step_count), (syncs, d.syncs), (bytes_sent, d.bytes_sent)):
        if out != capi.ffi.NULL:
            put(out, value)


def pb_diloco_close(diloco):
    handles.remove(diloco, _diloco.DiLoCo, "diloco").close()
