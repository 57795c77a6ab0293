"""ABI constants: generated from capi/pybridge.h by capi/gen_abi.py. Do not edit;
change the header and run `make setup` (or python capi/gen_abi.py)."""

PB_OK = 0
PB_ERR_INVALID_ARGUMENT = -1  # NULL pointer, bad count, unknown code, bad rank or handle
PB_ERR_NOT_INITIALIZED = -2  # the call needs a process group: call pb_init first
PB_ERR_ALREADY_INITIALIZED = -3  # pb_init called while a group is live
PB_ERR_TIMEOUT = -4  # a peer did not join or answer within the timeout
PB_ERR_COMM = -5  # a peer failed or a connection broke
PB_ERR_IO = -6  # a file could not be read or written
PB_ERR_CORRUPT = -7  # data failed a format or checksum check
PB_ERR_INTERNAL = -8  # a bug, or the embedded Python core failed to start
PB_ERR_CLOSED = -9  # the object was closed or finalized
PB_FLOAT32 = 0
PB_FLOAT64 = 1
PB_FLOAT16 = 2  # IEEE half: raw uint16 bits
PB_BFLOAT16 = 3  # bfloat16: raw uint16 bits
PB_INT8 = 4
PB_UINT8 = 5
PB_INT32 = 6
PB_INT64 = 7
PB_SUM = 0
PB_AVG = 1  # floating-point types only
PB_MIN = 2
PB_MAX = 3
PB_PRODUCT = 4
PB_CPU = -1  # host memory; a value >= 0 is a CUDA device index
PB_INIT_CHECKED = 1  # checked mode: before each collective the ranks compare its
PB_PARTITION_STATIC = 0  # fixed disjoint shares, equal batch counts on every rank
PB_PARTITION_DYNAMIC = 1  # ranks claim tasks through the group's store on demand
PB_REDUCER_ALLOW_UNUSED = 1  # pb_reducer_wait accepts unmarked gradients and sends
PB_REDUCER_NO_REBUILD = 2  # keep the initial bucket order (reverse parameter order)
PB_HOOK_ALLREDUCE = 0  # sum over the group (divided first for PB_AVG)
PB_HOOK_FP16 = 1  # float32 buckets travel as half, decompressed in place
PB_HOOK_BF16 = 2  # float32 buckets travel as bfloat16
PB_HOOK_POWERSGD = 3  # torch's PowerSGD low-rank compression (averages)
PB_HOOK_NO_WARM_START = 1  # hook_flags: PowerSGD redraws Q every step
PB_COMPRESS_NONE = 0
PB_COMPRESS_FP16 = 1
PB_COMPRESS_BF16 = 2
PB_GOSSIP_NONE = -1  # no gossip: buckets travel with the hook (the default)
PB_GOSSIP_CUBE = 0  # partner i XOR 2^k: symmetric pairs; N a power of two mixes exactly
PB_GOSSIP_DISSEMINATION = 1  # send to i + 2^k, receive from i - 2^k: every node, any N
PB_FED_ASYNC = 0  # a worker gets its next client as soon as it returns one
PB_FED_SYNC = 1  # waves of one client per worker, each wave waited for (FLUTE on gloo)
PB_FED_TRAIN = 2  # train the client; the result is its trained weights
PB_FED_EVALUATE = 3  # evaluate the client; the result is the worker's metrics
PB_FED_MAX_METRICS = 32  # metrics per result (pb_fed_worker_submit_metrics)
