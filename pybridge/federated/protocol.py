"""The federated wire protocol: a fixed int64 header per message, then at most one flat
payload. Tensors only (no pickling), so a C or Go peer can speak it.

Rank 0 of the federated group is the server; the others are workers. Two directions:
  down: server -> worker: task headers; the model. Two links (subgroups of the same
        members): headers on a gloo control link, the model after its header on a data
        link of the group's backend (on NCCL the model moves GPU to GPU).
  up:   worker -> server: result headers, payloads, metrics, acknowledgements. One TCP
        stream per worker that the server reads with its own framing (uplink.py): the server
        never posts a receive a worker could overrun (a gloo receive overrun aborts the
        process), and checks every header against what it expects before reading or
        allocating anything more.
The control link is gloo on the CPU whatever the group's backend: a worker reads each
header on the host to decide what comes next.

Header fields, in order (int64 each):
  command  one of the commands below
  round    the server's round number (the model's version)
  client   client id (-1 for none)
  samples  the client's sample count (results of TRAIN), else 0
  length   elements in the payload that follows (0: none)
  dtype    the payload's element type (pybridge dtype code, as PB_FLOAT32 ...)
  seq      per-worker task number: a result carries its task's seq
  metrics  bytes of the result's metrics text (metrics.py) that follow the payload (0: none)
"""

import datetime
from dataclasses import dataclass
from typing import Optional

import torch

from .. import abi
from ..comm import collectives, subgroups
from ..comm.collectives import Work
from ..comm.group import Group
from ..base import dtypes
from ..errors import CorruptData, InvalidArgument
from .metrics import MAX_BYTES as MAX_METRICS_BYTES

# Commands.
UPDATE = 1     # server: the model for `round`; its `length` elements follow
TRAIN = abi.PB_FED_TRAIN        # 2, server: train `client` on the current model; worker: its result (pseudo-gradient)
EVALUATE = abi.PB_FED_EVALUATE  # 3, server: evaluate `client`; worker: its metrics
TERMINATE = 4  # server: stop; worker: acknowledgement, its last message
FAILED = 5     # worker: the task raised; the payload is the message (UTF-8 bytes, uint8)

NAMES = {UPDATE: "update", TRAIN: "train", EVALUATE: "evaluate", TERMINATE: "terminate", FAILED: "failed"}
FIELDS = ("command", "round", "client", "samples", "length", "dtype", "seq", "metrics")
HEADER_LEN = len(FIELDS)
NO_CLIENT = -1
MAX_LENGTH = 1 << 40  # elements; a header beyond this is corrupt, not an allocation to try
MAX_MESSAGE = 1 << 16  # bytes of a FAILED message's text (a longer one is cut)
MIN_EVALUATE_BYTES = 1 << 20  # an EVALUATE payload may be as large as the model, or this
DEFAULT_MAX_SAMPLES = 1 << 31  # the server's default bound on a result's sample count

# Tags: a header and its payload travel on the same link, the payload after its header.
TAG_HEADER = 1
TAG_PAYLOAD = 2
TAG_CUT = 4  # never sent: a receive on it that times out closes a link (Links.cut)

SERVER = 0  # the server's rank in the federated group

DEFAULT_LINK_TIMEOUT = 86400.0  # seconds a link may stay silent (see open_links)


@dataclass(frozen=True)
class Header:
    command: int
    round: int = 0
    client: int = NO_CLIENT
    samples: int = 0
    length: int = 0
    dtype: int = dtypes.FLOAT32
    seq: int = 0
    metrics: int = 0

    def tensor(self) -> torch.Tensor:
        return torch.tensor([getattr(self, f) for f in FIELDS], dtype=torch.int64)

    @classmethod
    def parse(cls, t: torch.Tensor) -> "Header":
        """A header from a received tensor; CorruptData if it cannot be one."""
        h = cls(*(int(v) for v in t.tolist()))
        if h.command not in NAMES:
            raise CorruptData(f"federated header has unknown command {h.command}")
        if not 0 <= h.length <= MAX_LENGTH or h.dtype not in dtypes.BY_CODE:
            raise CorruptData(f"federated header has a bad payload (length {h.length}, dtype code {h.dtype})")
        if h.samples < 0:
            raise CorruptData(f"federated header has a negative sample count {h.samples}")
        if not 0 <= h.metrics <= MAX_METRICS_BYTES:
            raise CorruptData(f"federated header announces {h.metrics} bytes of metrics "
                              f"(at most {MAX_METRICS_BYTES})")
        return h

    @property
    def name(self) -> str:
        return NAMES[self.command]


class Links:
    """The down direction's two subgroups of a federated group (see the module docstring);
    the up direction is uplink.py's streams."""

    def __init__(self, group: Group, timeout: float) -> None:
        # Collectives over `group`: the server and every worker create them in this order.
        # Their timeout is long because a gloo operation that times out closes its
        # connection for good; a dead peer is noticed at once anyway (its connection
        # closes) and a slow client is the server's own `timeout`.
        self.group = group
        self.down = _link(group, timeout, "gloo")
        self.data_down = _link(group, timeout)
        self.device = self.data_down.device  # where payloads live
        self.store = self.down.store  # this federation's own key namespace (the up link's setup)

    def send_header(self, header: Header, dst: int, link: Group) -> None:
        collectives.send(header.tensor(), dst, TAG_HEADER, group=link)

    def isend_header(self, header: Header, dst: int, link: Group) -> Work:
        return collectives.isend(header.tensor(), dst, TAG_HEADER, group=link)

    def recv_header(self, src: int, link: Group) -> Header:
        t = torch.empty(HEADER_LEN, dtype=torch.int64)
        collectives.recv(t, src, TAG_HEADER, group=link)
        return Header.parse(t)

    def data(self, link: Group) -> Group:
        """The data link beside control link `link`."""
        return self.data_down

    def send_payload(self, payload: torch.Tensor, dst: int, link: Group) -> None:
        collectives.send(payload, dst, TAG_PAYLOAD, group=self.data(link))

    def isend_payload(self, payload: torch.Tensor, dst: int, link: Group) -> Work:
        return collectives.isend(payload, dst, TAG_PAYLOAD, group=self.data(link))

    def recv_payload(self, header: Header, src: int, link: Group, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        t = torch.empty(header.length, dtype=dtypes.BY_CODE[header.dtype], device=self.device) \
            if out is None else out
        collectives.recv(t, src, TAG_PAYLOAD, group=self.data(link))
        return t

    def cut(self, peer: int) -> None:
        """Fail every receive and send still waiting on the gloo links: gloo cannot cancel a
        receive, but one that times out makes it close all the connections of its link
        (measured: the others fail with "Application timeout caused pair closure" at once).
        `peer` must still be connected (a receive from a closed pair fails without the
        timeout). For close() only: the links are of no use afterwards."""
        for link in (self.down, self.data_down):
            if link.closed or link.backend != "gloo":
                continue  # an NCCL data link: nothing waits on it unless a worker died mid-message
            try:
                link.pg.recv([torch.empty(1)], peer, TAG_CUT).wait(datetime.timedelta(milliseconds=1))
            except RuntimeError:
                pass  # the timeout that closes the link, or the pair was closed already

    def close(self) -> None:
        for g in (self.down, self.data_down):
            if not g.closed:
                g.close()


def _link(group: Group, timeout: float, backend: Optional[str] = None) -> Group:
    """A link: split(0) over `group` (color 0 on every member, so never None)."""
    link = subgroups.split(0, group=group, timeout=timeout, backend=backend)
    assert link is not None  # every member has color 0
    return link


def flat(t: object, what: str = "payload") -> torch.Tensor:
    """`t` as a contiguous 1-D tensor (a view where possible)."""
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(f"{what} must be a torch tensor, got {type(t).__name__}")
    dtypes.torch_dtype(t.dtype)  # raises for an element type the protocol cannot name
    return t.detach().reshape(-1).contiguous()


def encode_message(text: Optional[str]) -> torch.Tensor:
    data = (text or "(no message)").encode("utf-8", "replace")[:MAX_MESSAGE]
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def decode_message(t: torch.Tensor) -> str:
    return bytes(t.cpu().numpy().tobytes()).decode("utf-8", "replace")
