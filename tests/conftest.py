"""Settings for the whole test session.

`make test` runs pytest on several workers (pytest-xdist, `--dist loadfile`): each file goes
whole to one worker, in collection order, as workers free up. A slow file that starts last
keeps its worker busy while the others sit idle, so the slowest files are collected first
(longest first: the usual greedy rule for spreading jobs over machines). Order inside a
file is kept. The list only orders: a file missing from it runs after these, as before.
"""

# The slowest files of a full run, slowest first: `make test` prints the slowest tests at
# the end; move a file up here when it grows.
SLOW_FILES = (
    "test_mnist.py",
    "test_cluster.py",
    "test_elastic_survive.py",
    "test_elastic_lost.py",
    "test_launch.py",
    "test_outside_install.py",
    "test_docs.py",
    "test_federated.py",
    "test_gotorch.py",
    "test_checkpoint.py",
    "test_gossip.py",
    "test_launch_failures.py",
    "test_reliability.py",
    "test_no_hangs.py",
    "test_capi_federated_faults.py",
    "test_mnist_federated_go.py",
    "test_capi.py",
    "test_join.py",
)


def pytest_collection_modifyitems(session, config, items):
    first = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(SLOW_FILES)))  # stable: keeps the rest in order
