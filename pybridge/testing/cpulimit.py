"""A CPU budget for a group of processes: a cgroup v1 cpu quota, with the group's CPU time
read back from the cpuacct controller, for the emulated cluster's nodes (cluster.py), the
straggler tests and benchmarks (a rank throttled as on a shared node).

    with CpuBudget(0.2) as b:                     # 0.2 of one CPU
        subprocess.run(b.wrap(["python3", "train.py"]))
        print(b.report())                         # what was set, what was used

A process joins the group before it runs the command (`wrap`), so everything it starts is
in the group too. Needs root and cgroup v1's cpu controller (`available()` says why not).
"""

import os
import time
import uuid
from typing import Dict, List, Optional, Tuple

from ..errors import InvalidArgument, PyBridgeError

CPU_ROOT = "/sys/fs/cgroup/cpu"
ACCT_ROOT = "/sys/fs/cgroup/cpuacct"
MIN_QUOTA_US = 1000  # the kernel's least quota


class CpuLimitError(PyBridgeError):
    """The budget could not be set (not root, no cgroup v1 cpu controller, a write failed)."""


def available() -> Tuple[bool, str]:
    """(True, "") when budgets can be set here, else (False, why not)."""
    if not os.access(os.path.join(CPU_ROOT, "cpu.cfs_quota_us"), os.W_OK):
        return False, f"needs cgroup v1's cpu controller writable at {CPU_ROOT} (root)"
    return True, ""


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


class CpuBudget:
    """`cpus` CPUs (0.2: a fifth of one) for the processes put in it, enforced every
    `period_us` (the kernel's CFS bandwidth control). `name` names the cgroup (default: a
    fresh pybridge-... name)."""

    def __init__(self, cpus: float, *, name: Optional[str] = None, period_us: int = 100_000):
        if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not cpus > 0:
            raise InvalidArgument(f"cpus must be a positive number of CPUs, got {cpus!r}")
        if isinstance(period_us, bool) or not isinstance(period_us, int) or not 1000 <= period_us <= 1_000_000:
            raise InvalidArgument(f"period_us must be 1000..1000000 µs, got {period_us!r}")
        ok, why = available()
        if not ok:
            raise CpuLimitError(f"cannot set a CPU budget: {why}")
        self.cpus, self.period_us = float(cpus), period_us
        self.quota_us = max(MIN_QUOTA_US, round(cpus * period_us))
        self.name = name or f"pybridge-{uuid.uuid4().hex[:10]}"
        self.dirs: List[str] = []
        try:
            cpu_dir = os.path.join(CPU_ROOT, self.name)
            os.mkdir(cpu_dir)
            self.dirs.append(cpu_dir)
            _write(os.path.join(cpu_dir, "cpu.cfs_period_us"), str(period_us))
            _write(os.path.join(cpu_dir, "cpu.cfs_quota_us"), str(self.quota_us))
            # cpuacct may be mounted with cpu (one folder) or apart: usage is read where it is
            if os.path.exists(os.path.join(cpu_dir, "cpuacct.usage")):
                self._acct = cpu_dir
            elif os.path.isdir(ACCT_ROOT):
                acct = os.path.join(ACCT_ROOT, self.name)
                os.mkdir(acct)
                self.dirs.append(acct)
                self._acct = acct
            else:
                self._acct = None
        except OSError as exc:
            self.close()
            raise CpuLimitError(f"cannot set a CPU budget of {cpus} CPUs: {exc}") from None

    def add(self, pid: int) -> None:
        """Put process `pid` (and what it starts from now on) in the budget."""
        for d in self.dirs:
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    def wrap(self, argv: List[str]) -> List[str]:
        """argv run inside the budget: a shell joins the group, then execs argv."""
        procs = [os.path.join(d, "cgroup.procs") for d in self.dirs]
        script = 'for f in ' + " ".join(f"'{p}'" for p in procs) + '; do echo $$ > "$f" || exit 125; done; exec "$@"'
        return ["sh", "-c", script, "pybridge-cpu-budget", *argv]

    def used_seconds(self) -> Optional[float]:
        """CPU seconds the group's processes used so far (None without cpuacct)."""
        if self._acct is None:
            return None
        return int(_read(os.path.join(self._acct, "cpuacct.usage"))) / 1e9

    def throttling(self) -> Dict[str, float]:
        """The kernel's count: periods with work, periods throttled, seconds throttled."""
        stat = dict(line.split() for line in _read(os.path.join(self.dirs[0], "cpu.stat")).splitlines() if line)
        return {"periods": int(stat.get("nr_periods", 0)), "throttled_periods": int(stat.get("nr_throttled", 0)),
                "throttled_s": int(stat.get("throttled_time", 0)) / 1e9}

    def report(self) -> Dict[str, object]:
        """What was set and what was used."""
        return {"cpus": self.cpus, "quota_us": self.quota_us, "period_us": self.period_us,
                "used_s": self.used_seconds(), **self.throttling()}

    def close(self, wait: float = 5.0) -> None:
        """Remove the group once its processes have left it (they must be ending)."""
        deadline = time.monotonic() + wait
        for d in reversed(self.dirs):
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        break  # left for a later look; harmless once its processes are gone
                    time.sleep(0.05)
        self.dirs = []

    def __enter__(self) -> "CpuBudget":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["CpuBudget", "CpuLimitError", "available"]
