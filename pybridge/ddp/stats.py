"""What DistributedDataParallel._get_ddp_logging_data() returns: the keys torch's DDP logger
fills (constructor settings, the environment, bucket sizes, sampled runtime timings, the
last error), with torch's names and formats, so tools and tests written for torch read it.

Runtime timings are sampled as torch samples them: every iteration of the first ten, then
one in `sample_rate` (default 100). Times are nanoseconds; the *_start/_end ones are host
clock readings (time.time_ns)."""

import os
import time

import torch

_DTYPE_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
                torch.bfloat16: "c10::BFloat16"}
_ENV = ("master_port", "master_addr", "torch_distributed_debug", "cuda_visible_devices")
_GLOO_ENV = ("gloo_socket_ifname", "gloo_device_transport")
_NCCL_ENV = ("nccl_socket_ifname", "nccl_blocking_wait", "nccl_async_error_handling", "nccl_debug",
             "nccl_nthreads", "nccl_ib_timeout")
_TIMES = ("forward_compute_time", "backward_compute_time", "backward_comm_time",
          "backward_compute_comm_overlap_time")
_WARMUP = 10  # iterations always sampled, as torch's kDDPRuntimeLoggingSampleRate rule
DEFAULT_SAMPLE_RATE = 100


def _sizes(reducer):
    return ", ".join(str(sum(reducer.specs[i].nbytes for i in b)) for b in reducer.bucket_indices)


class Stats:
    """The logging data of one wrapper. `on` says whether this iteration is sampled; the
    wrapper calls the mark_* methods only then, so unsampled iterations cost one test."""

    def __init__(self, ddp, module, params, group):
        self.sample_rate = DEFAULT_SAMPLE_RATE
        self.iterations = 0  # synchronized forward passes started
        self.sampled = 0
        self.on = False
        self._sums = dict.fromkeys(_TIMES, 0)
        self._t = {}
        self.order = []
        backend = group.backend
        d = self.data = {
            "world_size": group.size, "rank": group.rank, "module_name": type(module).__name__,
            "device_ids": ", ".join(map(str, ddp.device_ids or [])),
            "output_device": -1 if ddp.output_device is None else ddp.output_device,
            "broadcast_buffers": int(ddp.forward_sync_buffers),
            "bucket_cap_bytes": ddp.reducer.bucket_cap,
            "find_unused_parameters": int(ddp.find_unused_parameters),
            # The argument as given, as torch logs it: pybridge's default (None) is a bucket view too.
            "gradient_as_bucket_view": int(bool(ddp.gradient_as_bucket_view)),
            "static_graph": int(ddp.static_graph), "backend_name": backend,
            "dtypes": ", ".join(sorted({_DTYPE_NAMES.get(p.dtype, str(p.dtype)) for p in params})),
            "total_parameter_size_bytes": sum(p.numel() * p.element_size() for p in params),
            "num_parameter_tensors": len(params), "bucket_sizes": _sizes(ddp.reducer),
            "has_error": 0, "iteration": 0,
        }
        env = _ENV + (_GLOO_ENV if backend == "gloo" else _NCCL_ENV if backend == "nccl" else ())
        for key in env:
            d[key] = os.environ.get(key.upper(), "N/A")
        if backend == "gloo":
            d["gloo_num_threads"] = 2  # torch's default for a gloo group; pybridge's groups use it

    # ---- per iteration -------------------------------------------------------------------

    def forward_start(self):
        """A synchronized forward pass begins: decide whether this iteration is sampled."""
        n = self.iterations
        self.iterations += 1
        self.on = n < _WARMUP or n % self.sample_rate == 0
        if self.on:
            self._t = {"forward_compute_time_start": time.time_ns()}
            self.order = []
            self._current = n

    def forward_end(self):
        if self.on:
            self._t["forward_compute_time_end"] = time.time_ns()

    def grad_ready(self, k, launched):
        t = time.time_ns()
        self._t.setdefault("backward_compute_time_start", t)
        if launched:
            self._t.setdefault("backward_comm_time_start", t)
        self.order.append(k)

    def backward_computed(self):
        t = time.time_ns()
        self._t["backward_compute_time_end"] = t
        self._t.setdefault("backward_compute_time_start", t)
        self._t.setdefault("backward_comm_time_start", t)

    def backward_end(self, reducer, unused_bytes):
        """The reduction finished: record this sampled iteration."""
        self.on = False
        t = self._t
        if "backward_compute_time_end" not in t or "forward_compute_time_end" not in t:
            return
        t["backward_comm_time_end"] = time.time_ns()
        cs, ce = t["backward_compute_time_start"], t["backward_compute_time_end"]
        ms, me = t["backward_comm_time_start"], t["backward_comm_time_end"]
        now = {"forward_compute_time": t["forward_compute_time_end"] - t["forward_compute_time_start"],
               "backward_compute_time": ce - cs, "backward_comm_time": me - ms,
               "backward_compute_comm_overlap_time": max(0, min(ce, me) - max(cs, ms))}
        self.sampled += 1
        d = self.data
        for key, v in now.items():
            d[key] = v
            self._sums[key] += v
            d["avg_" + key] = self._sums[key] // self.sampled
        for key in ("forward_compute_time_start", "backward_compute_time_start", "backward_compute_time_end",
                    "backward_comm_time_start", "backward_comm_time_end"):
            d[key] = t[key]
        d["iteration"] = self._current
        d["prev_iteration_grad_ready_order_indices"] = ", ".join(map(str, self.order))
        if unused_bytes:
            d["unused_parameter_size"] = unused_bytes

    def rebuilt(self, reducer):
        self.data["has_rebuilt_buckets"] = 1
        self.data["rebuilt_bucket_sizes"] = _sizes(reducer)
        self.data["rebuilt_per_bucket_param_indices"] = ", ".join(" ".join(map(str, b))
                                                                  for b in reducer.bucket_indices)

    # ---- settings and errors -------------------------------------------------------------

    def set(self, key, value):
        self.data[key] = value

    def error(self, message):
        self.data["has_error"] = 1
        self.data["error"] = str(message)
