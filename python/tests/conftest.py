# SPDX-License-Identifier: MIT
"""Helpers for the ferry Python tests: run one function per node of a local cluster."""
import threading

import pytest

import ferry


def run_nodes(nodes, fn, timeout=60):
    """Runs fn(node) on a thread per node (collective calls need every node at once);
    returns the results in rank order and re-raises the first exception."""
    res = [None] * len(nodes)
    errs = []

    def body(i):
        try:
            res[i] = fn(nodes[i])
        except BaseException as e:  # noqa: B902 - handed to the main thread
            errs.append(e)

    ths = [threading.Thread(target=body, args=(i,)) for i in range(len(nodes))]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout)
        assert not t.is_alive(), "a node's thread did not finish in %d s" % timeout
    if errs:
        raise errs[0]
    return res


def cluster(n):
    """n nodes of a local cluster, closed after the test (the fixtures below)."""
    nodes = ferry.local_cluster(n, timeout_ms=20000)
    yield nodes
    for nd in nodes:
        nd.close()


@pytest.fixture
def cluster2():
    yield from cluster(2)


@pytest.fixture
def cluster3():
    yield from cluster(3)


@pytest.fixture
def node1():
    (n,) = ferry.local_cluster(1, timeout_ms=20000)
    yield n
    n.close()
