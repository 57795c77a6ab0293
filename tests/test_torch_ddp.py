"""torch's own DDP tests, run with pybridge.DistributedDataParallel in place of torch's class.

The tests are the CPU-runnable DDP tests of torch's
`torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase` (shipped in
the wheel; pytorch's repository drives it from test/distributed/test_distributed_spawn.py with
BACKEND=gloo, WORLD_SIZE=2, TEMP_DIR and a file:// INIT_METHOD). A DDP test is one that builds
a DistributedDataParallel (directly or through a helper); a CPU-runnable one has no GPU gate
(skip_if_lt_x_gpu, skip_if_no_gpu, require_n_gpus_for_nccl_backend) and moves nothing to
CUDA: 11 of the file's 102 DDP tests in torch 2.13. The GPU-gated ones skip here.

Both `torch.nn.parallel.DistributedDataParallel` and distributed_test's module-level name are
replaced, as a user swapping the class would. The tests run in two rank processes (one
`run_ranks`), one after another, each with its own torch process group (init_process_group
with a fresh file, as torch's driver does), a 30 s group timeout, and the whole run bounded.

`python3 tests/test_torch_ddp.py` runs them with torch's class and with pybridge's and prints
both pass counts.
"""

import datetime
import os
import sys
import tempfile
import traceback

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import run_ranks  # noqa: E402

pytest.importorskip("expecttest")  # distributed_test imports it

# The CPU-runnable DDP tests of torch 2.13's _DistTestBase (see above). torch passes all here.
CPU_TESTS = (
    "test_DistributedDataParallelCPU",
    "test_DistributedDataParallelCPU_grad_is_view",
    "test_DistributedDataParallel_requires_grad",
    "test_ddp_create_graph",
    "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_grad_is_view",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_ddp_logging_data_cpu",
    "test_static_graph_api_cpu",
    "test_grads_same_across_ranks_with_no_sync",
)
# Those that cannot pass with pybridge's class, and why.
NOT_EXPECTED = {}
EXPECTED = tuple(t for t in CPU_TESTS if t not in NOT_EXPECTED)
WORLD = 2
GROUP_TIMEOUT = 30  # seconds; a test that hangs on a collective fails after this


def _suite(rank, world, which, names, root):
    """Run torch's tests `names` on this rank; {name: 'pass' | 'skip: why' | 'fail: ...'}."""
    os.environ.update({"BACKEND": "gloo", "WORLD_SIZE": str(world), "TEMP_DIR": root})
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed import distributed_test as dt
    if which == "pybridge":
        import pybridge
        torch.nn.parallel.DistributedDataParallel = pybridge.DistributedDataParallel
        dt.DistributedDataParallel = pybridge.DistributedDataParallel
    torch.set_num_threads(1)

    class TestDDP(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        pass

    results = {}
    for name in names:
        here = os.path.join(root, name)  # barrier files and init file of this test only
        os.environ["TEMP_DIR"] = here
        dt.Barrier.barrier_id = 0
        test = TestDDP(name)
        test.rank = rank
        test.file_name = os.path.join(here, "init")
        try:
            dist.init_process_group("gloo", init_method=f"file://{test.file_name}", world_size=world, rank=rank,
                                    timeout=datetime.timedelta(seconds=GROUP_TIMEOUT))
            try:
                test._barrier()
                getattr(test, name)()
                test._barrier()
                results[name] = "pass"
            finally:
                dist.destroy_process_group()
        except SystemExit as e:  # torch's GPU gates exit with a skip code
            results[name] = f"skip: exit code {e.code}"
        except Exception as e:  # noqa: BLE001 - unittest.SkipTest included
            kind = "skip" if type(e).__name__ == "SkipTest" else "fail"
            results[name] = f"{kind}: {traceback.format_exc()[-1500:]}"
    return results


def run(which, names=CPU_TESTS, timeout=240):
    """{name: result} of torch's tests on WORLD ranks with `which` class ('torch' or 'pybridge')."""
    with tempfile.TemporaryDirectory() as root:
        for name in names:
            os.makedirs(os.path.join(root, name, "barrier"))
            os.makedirs(os.path.join(root, name, "test_dir"))
        ranks = run_ranks(_suite, WORLD, which, list(names), root, timeout=timeout)
    merged = {}
    for name in names:
        got = [r[name] for r in ranks]
        merged[name] = next((g for g in got if g != "pass"), "pass")
    return merged


def test_torch_ddp_tests_pass_with_pybridge():
    results = run("pybridge", EXPECTED)
    failed = {n: r for n, r in results.items() if r != "pass"}
    assert not failed, "\n".join(f"--- {n}:\n{r}" for n, r in failed.items())


if __name__ == "__main__":
    for which in ("torch", "pybridge"):
        res = run(which)
        passed = [n for n, r in res.items() if r == "pass"]
        print(f"{which}: {len(passed)} of {len(res)} CPU DDP tests pass")
        for n, r in res.items():
            if r != "pass":
                print(f"  {n}: {r.splitlines()[-1] if r.strip() else r}")
