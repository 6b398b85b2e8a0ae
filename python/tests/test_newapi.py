# SPDX-License-Identifier: MIT
"""The newer C API from Python: the cluster token, etcd membership, groups, checkpoints,
consistency models and replicas, each with its bad arguments refused clearly."""
import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import numpy as np
import pytest
from conftest import run_nodes

import ferry


# ---- the cluster token ------------------------------------------------------------------

def form(tokens, timeout_ms):
    """len(tokens) nodes meet at a fresh rendezvous through ferry.open, node r with
    tokens[r]; returns each node's result: its rank after a barrier, or the exception."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    rdv = "127.0.0.1:%d" % ls.getsockname()[1]
    res = [None] * len(tokens)

    def body(r):
        try:
            with ferry.open(rank=r, world=len(tokens), rendezvous=rdv,
                            rendezvous_fd=ls.fileno() if r == 0 else -1,
                            bind_addr="127.0.0.1", transport="tcp", timeout_ms=timeout_ms,
                            token=tokens[r]) as n:
                n.barrier()
                res[r] = n.rank
        except ferry.Error as e:
            res[r] = e

    ths = [threading.Thread(target=body, args=(r,)) for r in range(len(tokens))]
    for t in ths:
        t.start()
    for t in ths:
        t.join(60)
    ls.close()
    return res


def test_token_same_forms_other_refused(monkeypatch):
    monkeypatch.delenv("FERRY_TOKEN", raising=False)
    monkeypatch.delenv("FERRY_TOKEN_FILE", raising=False)
    assert form(["s3cret", "s3cret", "s3cret"], 10000) == [0, 1, 2]
    t0 = time.monotonic()
    res = form(["s3cret", "s3cret", "other"], 3000)
    assert isinstance(res[2], ferry.Error) and res[2].errno == errno.EACCES, res
    assert "ferry_open" in res[2].strerror
    assert time.monotonic() - t0 < 30
    # the others never see rank 2: they fail at their timeout, not later
    assert all(isinstance(r, ferry.Error) for r in res[:2]), res
    # a local cluster shares its token
    nodes = ferry.local_cluster(2, token="s3cret", timeout_ms=10000)
    assert run_nodes(nodes, lambda n: n.barrier()) == [None, None]
    for n in nodes:
        n.close()


def test_open_parameters_refused():
    with pytest.raises(ValueError, match="token is empty"):
        ferry.open(token="")
    with pytest.raises(ValueError, match="token is empty"):
        ferry.local_cluster(2, token="")
    with pytest.raises(TypeError):
        ferry.open(token=5)
    with pytest.raises(ValueError, match="etcd_ttl is seconds"):
        ferry.open(etcd_ttl=-1)
    with pytest.raises(ValueError, match="heartbeat_ms is milliseconds"):
        ferry.local_cluster(1, heartbeat_ms=-2)
    with pytest.raises(TypeError):
        ferry.open(etcd_endpoints=["http://a:1"])
    with pytest.raises(TypeError):
        ferry.open(tokens="x")  # misspelt: refused, not ignored


def test_rejoin_is_refused_at_once():
    # a replacement node cannot rejoin a running cluster yet (docs/faults.md)
    with pytest.raises(ferry.Error) as e:
        ferry.open(rank=0, world=1, rejoin=1)
    assert e.value.errno == errno.EINVAL
    t0 = time.monotonic()
    with pytest.raises(ferry.Error) as e:  # no cluster there: at once
        ferry.open(rank=2, world=3, rendezvous="127.0.0.1:1", rejoin=1, timeout_ms=20000)
    assert e.value.errno == ferry.E_NOJOIN, e.value.errno
    assert time.monotonic() - t0 < 5


def test_heartbeat_off_and_on():
    for hb in (-1, 200):
        nodes = ferry.local_cluster(2, heartbeat_ms=hb, timeout_ms=10000)
        assert run_nodes(nodes, lambda n: n.barrier()) == [None, None]
        for n in nodes:
            n.close()


# ---- etcd membership --------------------------------------------------------------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def die_with_parent():
    """In the etcd child: SIGKILL when the test process ends (a crash included, which
    runs no fixture teardown), as test_etcd.c does with prctl(PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@pytest.fixture(scope="module")
def etcd():
    """A real etcd (Debian's etcd-server) on loopback, with a temporary data folder."""
    exe = shutil.which("etcd")
    if not exe:
        pytest.skip("no etcd binary (Debian: etcd-server)")
    d = tempfile.mkdtemp(prefix="ferry-py-etcd-")
    url = "http://127.0.0.1:%d" % free_port()
    purl = "http://127.0.0.1:%d" % free_port()
    with open(os.path.join(d, "etcd.log"), "w") as log:
        p = subprocess.Popen([exe, "--name", "ferrypy", "--data-dir", d,
                              "--listen-client-urls", url, "--advertise-client-urls", url,
                              "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                              "--initial-cluster", "ferrypy=" + purl],
                             stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    try:
        deadline = time.monotonic() + 15
        while True:
            assert p.poll() is None, "etcd exited (see %s/etcd.log)" % d
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if json.load(r).get("health") == "true":
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "etcd did not come up in 15 s"
            time.sleep(0.1)
        yield url
    finally:
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


def test_etcd_membership(etcd):
    try:
        nodes = ferry.local_cluster(2, etcd_endpoints=etcd, etcd_ttl=2, timeout_ms=15000)
    except ferry.Error as e:
        # a libferry built without libcurl has no etcd manager, and says so
        assert e.errno == errno.EOPNOTSUPP, e
        pytest.skip("libferry without the etcd manager (no libcurl)")
    epochs = run_nodes(nodes, lambda n: (n.barrier(), n.epoch)[1])
    assert epochs[0] > 0 and epochs[0] == epochs[1]  # both saw the same registrations
    for n in nodes:
        n.close()


def test_etcd_bad_endpoints():
    with pytest.raises(ferry.Error) as ei:
        ferry.local_cluster(1, etcd_endpoints="ftp://127.0.0.1:1", timeout_ms=3000)
    assert ei.value.errno in (errno.EINVAL, errno.EOPNOTSUPP)
    with pytest.raises(ferry.Error) as ei:  # nobody listens there
        ferry.local_cluster(1, etcd_endpoints="http://127.0.0.1:%d" % free_port(),
                            etcd_ttl=2, timeout_ms=3000)
    assert ei.value.errno != 0


def test_embedded_epoch_is_zero(node1):
    assert node1.epoch == 0


# ---- groups -----------------------------------------------------------------------------

def test_group_collectives(cluster3):
    def body(n):
        if n.rank == 1:
            return None  # not a member: creates nothing, takes part in nothing
        with n.group([2, 0]) as g:
            assert g.ranks == (2, 0) and g.rank == (0 if n.rank == 2 else 1)
            x = np.array([n.rank + 1.0, 10 * n.rank], np.float64)
            g.allreduce(x)
            m = g.allreduce(np.array([n.rank], np.int64), np.zeros(1, np.int64), op="max")
            r = np.zeros(1, np.float32)
            g.reduce(np.array([1.5], np.float32), r, root=1)  # root: member index 1 = rank 0
            b = np.array([7.0 if g.rank == 0 else 0.0], np.float32)
            g.broadcast(b, root=0)
            h = g.allreduce_async(np.ones(4, np.float32))
            a = h.wait()
            return x.tolist(), int(m[0]), float(r[0]), float(b[0]), a.tolist()

    res = run_nodes(cluster3, body)
    assert res[1] is None
    for rank in (0, 2):
        x, m, r, b, a = res[rank]
        assert x == [4.0, 20.0] and m == 2 and b == 7.0 and a == [2.0] * 4
        assert r == (3.0 if rank == 0 else 0.0)  # only the root receives


def test_group_bad_arguments(cluster3):
    n = cluster3[0]
    with pytest.raises(ValueError, match="not in the group"):
        n.group([1, 2])
    with pytest.raises(ValueError, match="twice"):
        n.group([0, 1, 0])
    with pytest.raises(ValueError, match=r"ranks are ints 0 \.\. 2"):
        n.group([0, 3])
    with pytest.raises(ValueError, match=r"ranks are ints 0 \.\. 2"):
        n.group([0, "1"])
    with pytest.raises(ValueError, match="1 to 3"):
        n.group([])
    with pytest.raises(TypeError, match="sequence of ints"):
        n.group(5)
    g = n.group([0])  # a group of one: its collectives are local
    with pytest.raises(ferry.Error) as ei:
        n.group([0])
    assert ei.value.errno == errno.EEXIST and "already" in ei.value.strerror
    x = np.array([3.0], np.float32)
    assert g.allreduce(x) is x and x[0] == 3.0
    with pytest.raises(ValueError, match="op must be 'sum', 'max' or 'min'"):
        g.allreduce(x, op="prod")
    with pytest.raises(ferry.Error) as ei:
        g.broadcast(x, root=1)  # member indices are 0 .. 0
    assert ei.value.errno == errno.EINVAL
    g.destroy()
    g.destroy()  # twice is fine
    with pytest.raises(ValueError, match="group was destroyed"):
        g.allreduce(x)
    n.group([0]).destroy()  # the list is free again


def test_group_after_close():
    (n,) = ferry.local_cluster(1)
    g = n.group([0])
    n.close()  # frees the groups left
    with pytest.raises(ferry.Error) as ei:
        g.allreduce(np.zeros(1, np.float32))
    assert ei.value.errno == ferry.E_CLOSED
    g.destroy()  # only forgets the handle
    del g


# ---- checkpoints ------------------------------------------------------------------------

def test_checkpoint_and_restore(cluster2, tmp_path):
    d = str(tmp_path / "ck")
    keys = np.arange(100, dtype=np.uint64)

    def body(n):
        t = n.table(num_keys=100, value_len=3)
        if n.rank == 0:
            t.set(keys, np.arange(300, dtype=np.float32))
        n.barrier()
        t.checkpoint(d)
        n.barrier()
        t.push(keys, np.ones((100, 3), np.float32))  # both nodes: +2
        n.barrier()
        changed = t.pull(keys).copy()
        n.barrier()
        t.restore(tmp_path / "ck")  # os.PathLike as well
        back = t.pull(keys)
        n.barrier()
        ck = t.checkpoint_async(d + "2")  # marked; training could go on here
        assert not ck.done
        assert ck.wait() is None and ck.done
        n.barrier()
        t.destroy()
        return changed, back

    for changed, back in run_nodes(cluster2, body):
        np.testing.assert_array_equal(changed.ravel(), np.arange(300, dtype=np.float32) + 2)
        np.testing.assert_array_equal(back.ravel(), np.arange(300, dtype=np.float32))
    man = json.load(open(os.path.join(d, "manifest.json")))
    assert man  # rank 0 wrote the manifest last
    assert os.path.exists(os.path.join(d + "2", "manifest.json"))


def test_checkpoint_bad_arguments(cluster2, tmp_path):
    def body(n):
        t = n.table(num_keys=10, value_len=2)
        other = n.table(num_keys=10, value_len=4)
        errs = {}
        try:
            t.restore(str(tmp_path / "none"))
        except ferry.Error as e:
            errs["missing"] = e.errno
        n.barrier()
        t.checkpoint(str(tmp_path / "ck"))
        try:
            other.restore(str(tmp_path / "ck"))  # another value_len
        except ferry.Error as e:
            errs["kind"] = e.errno
        n.barrier()
        with pytest.raises(TypeError):
            t.checkpoint(5)
        with pytest.raises(TypeError):
            t.checkpoint()
        h = t.pull_async(np.arange(2, dtype=np.uint64))
        with pytest.raises(RuntimeError, match="not waited for"):
            t.checkpoint(str(tmp_path / "ck3"))
        h.wait()
        n.barrier()
        ck = t.checkpoint_async(str(tmp_path / "ck4"))
        with pytest.raises(RuntimeError, match="not waited for"):
            t.destroy()
        ck.wait()
        n.barrier()
        other.destroy()
        t.destroy()
        return errs

    for errs in run_nodes(cluster2, body):
        assert errs["missing"] == errno.ENOENT
        assert errs["kind"] == ferry.E_MISMATCH


def test_checkpoint_wait_from_another_thread(node1, tmp_path):
    t = node1.table(num_keys=4, value_len=1)
    ck = t.checkpoint_async(str(tmp_path / "ck"))
    got = []

    def other():
        try:
            ck.wait()
        except RuntimeError as e:
            got.append(str(e))

    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert got and "thread that started it" in got[0]
    ck.wait()
    t.destroy()


# ---- consistency models -----------------------------------------------------------------

@pytest.mark.parametrize("model", ["eventual", "ssp", "essp"])
def test_consistency_push_clock_flush(cluster2, model):
    keys = np.arange(20, dtype=np.uint64)

    def body(n):
        t = n.table(num_keys=20, value_len=2, consistency=model,
                    staleness=0 if model == "eventual" else 1)
        assert t.consistency == {"eventual": 1, "ssp": 2, "essp": 3}[model]
        c0 = n.clock_get()
        t.push(keys, np.ones((20, 2), np.float32))
        n.clock()
        assert n.clock_get() == c0 + 1
        t.flush()
        n.barrier()
        v = t.pull(keys)
        with pytest.raises(ferry.Error) as ei:
            t.pull_async(keys)  # not with a model: the C library says so
        assert ei.value.errno == errno.EOPNOTSUPP
        h = t.localize_async(keys[:2])  # localize works
        h.wait()
        n.barrier()
        s = n.stats()
        t.flush()
        n.barrier()
        t.destroy()
        return v, s

    for v, s in run_nodes(cluster2, body):
        np.testing.assert_array_equal(v, np.full((20, 2), 2.0, np.float32))
        assert s["cons_hits"] + s["cons_misses"] >= 20
        assert len(s["staleness"]) == 17


def test_consistency_bad_arguments(cluster2, node1):
    with pytest.raises(ValueError, match="'sequential', 'eventual', 'ssp' or 'essp'"):
        node1.table(num_keys=4, value_len=1, consistency="strong")
    with pytest.raises(ValueError, match=r"staleness must be 0 \.\. 4294967295, not -1"):
        node1.table(num_keys=4, value_len=1, staleness=-1)
    with pytest.raises(ValueError, match="cons_bytes must be 0 .. 18446744073709551615"):
        node1.table(num_keys=4, value_len=1, cons_bytes=2**64)
    with pytest.raises(TypeError, match="replicas must be an int, not str"):
        node1.table(num_keys=4, value_len=1, replicas="1")
    with pytest.raises(ValueError, match="num_keys must be"):
        node1.table(num_keys=-4, value_len=1)
    with pytest.raises(ValueError, match="mem_limit must be"):
        ferry.local_cluster(1, mem_limit=-1)
    with pytest.raises(ferry.Error) as ei:  # a bound only SSP and ESSP have
        node1.table(num_keys=4, value_len=1, consistency="eventual", staleness=3)
    assert ei.value.errno == errno.EINVAL

    def body(n):  # nodes that disagree on the bound
        try:
            n.table(num_keys=4, value_len=1, consistency="ssp", staleness=1 + n.rank)
        except ferry.Error as e:
            return e.errno

    assert run_nodes(cluster2, body) == [ferry.E_MISMATCH] * 2


def test_sequential_flush_and_clock_do_nothing(node1):
    t = node1.table(num_keys=4, value_len=1)
    assert t.consistency == 0
    t.flush()
    node1.clock()
    t.destroy()


# ---- compressed pushes ------------------------------------------------------------------

@pytest.mark.parametrize("codec", ["bf16", "fp16"])
def test_push_codec_sums_are_exact_after_flush(cluster2, codec):
    keys = np.arange(16, dtype=np.uint64)
    # 1 + 1e-4 rounds to 1 in both codes: only the residuals keep the rest
    d = np.full((16, 2), 1.0001, np.float32)

    def body(n):
        t = n.table(num_keys=16, value_len=2, mode="classic", push_codec=codec, codec_keys=8)
        for _ in range(50):
            t.push(keys, d)
        with pytest.raises(ferry.Error) as ei:
            t.push_async(keys, d)
        assert ei.value.errno == errno.EOPNOTSUPP
        t.flush()
        n.barrier()
        v = t.pull(keys)
        n.barrier()
        t.destroy()
        return v

    for v in run_nodes(cluster2, body):
        np.testing.assert_allclose(v, np.full((16, 2), 2 * 50 * 1.0001), rtol=1e-6)


def test_push_codec_bad_arguments(node1):
    with pytest.raises(ValueError, match="'none', 'bf16' or 'fp16'"):
        node1.table(num_keys=4, value_len=1, push_codec="int8")
    with pytest.raises(ValueError, match="codec_keys must be"):
        node1.table(num_keys=4, value_len=1, codec_keys=-1)
    with pytest.raises(ferry.Error) as ei:  # a codec with a consistency model: not yet
        node1.table(num_keys=4, value_len=1, consistency="eventual", push_codec="bf16")
    assert ei.value.errno == errno.EINVAL


# ---- replicas ---------------------------------------------------------------------------

def test_replicas(cluster2):
    keys = np.arange(50, dtype=np.uint64)

    def body(n):
        t = n.table(num_keys=50, value_len=2, replicas=1)
        t.push(keys, np.ones((50, 2), np.float32))
        n.barrier()
        v = t.pull(keys)
        ts = t.stats()
        n.barrier()
        t.destroy()
        return v, ts

    res = run_nodes(cluster2, body)
    for v, ts in res:
        np.testing.assert_array_equal(v, np.full((50, 2), 2.0, np.float32))
    # each node keeps a backup of the other's keys
    assert [ts["backups"] for _, ts in res] == [25, 25]
    assert all(ts["backup_bytes"] > 0 for _, ts in res)


def test_replicas_bad_arguments(node1):
    with pytest.raises(ferry.Error) as ei:
        node1.table(sparse=True, value_len=1, replicas=1)  # not with sparse
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(ferry.Error) as ei:
        node1.table(num_keys=4, value_len=1, replicas=2)
    assert ei.value.errno == errno.EINVAL


def test_coll_algo(cluster2):
    def body(n):
        n.coll_algo("ring")
        x = np.arange(8, dtype=np.float32)
        n.allreduce(x)
        n.coll_algo("auto")
        return x.tolist()

    assert run_nodes(cluster2, body) == [list(np.arange(8, dtype=np.float32) * 2)] * 2
    with pytest.raises(ValueError, match="'auto', 'doubling' or 'ring'"):
        cluster2[0].coll_algo("tree")
    with pytest.raises(TypeError, match="is a str"):
        cluster2[0].coll_algo(1)


# ---- a worker outlived by its handles -----------------------------------------------------

def test_handle_outlives_its_thread(cluster2):
    """A thread starts an operation and ends without its wait(); the handle lives on in
    another thread. The worker must go with its thread (an RCU registration left behind
    by a dead thread crashed the next synchronize_rcu: every table destroy), and the
    handle then reports its operation as cancelled."""
    keys = np.arange(10, dtype=np.uint64)
    kept = []

    def body(n):
        t = n.table(num_keys=10, value_len=2)
        if n.rank == 0:
            th = threading.Thread(target=lambda: kept.append(
                t.push_async(keys, np.ones((10, 2), np.float32))))
            th.start()
            th.join()
        n.barrier()
        return t

    tabs = run_nodes(cluster2, body)
    (h,) = kept
    # join() returns once Python is done with the thread; its thread-local destructors
    # (which destroy the worker) run a moment later, as the OS thread exits
    deadline = time.monotonic() + 10
    while True:
        try:
            h.wait()
        except RuntimeError as e:  # the thread is still exiting: not ours to wait for
            assert "thread that started it" in str(e)
            assert time.monotonic() < deadline, "the worker outlived its thread by 10 s"
            time.sleep(0.01)
            continue
        except ferry.Error as e:
            ei = e
            break
        raise AssertionError("wait() on a handle whose thread ended returned")
    assert ei.errno == errno.ECANCELED and "its worker is gone" in ei.strerror
    assert h.done
    del h, kept[:]

    def again(n):  # tables come and go, each destroy a synchronize_rcu: no crash
        for _ in range(3):
            t = n.table(num_keys=10, value_len=2)
            t.push(keys, np.ones((10, 2), np.float32))
            n.barrier()
            t.destroy()
        tabs[n.rank].destroy()

    run_nodes(cluster2, again)


# ---- hot keys (docs/consistency.md, "Hot keys") ------------------------------------------

@pytest.mark.parametrize("model", ["sequential", "essp"])
def test_hot_keys_sum_exactly_after_flush_and_barrier(cluster2, model):
    keys = np.arange(16, dtype=np.uint64)

    def body(n):
        t = n.table(num_keys=16, value_len=2, consistency=model,
                    staleness=1 if model == "essp" else 0,
                    hot_keys=[1, 3, 5, 7], hot_sync_ms=5)
        for _ in range(3):
            t.push(keys, np.ones((16, 2), np.float32))
            n.clock()
        own = t.pull(np.array([1, 3], np.uint64))  # its own pushes at once
        t.flush()
        n.barrier()
        v = t.pull(keys)
        with pytest.raises(ferry.Error) as ei:
            t.set(np.array([3], np.uint64), np.zeros((1, 2), np.float32))
        assert ei.value.errno == errno.EINVAL  # a hot key cannot be set
        s = n.stats()
        n.barrier()
        t.destroy()
        return own, v, s

    for own, v, s in run_nodes(cluster2, body):
        assert (own >= 3.0).all()
        np.testing.assert_array_equal(v, np.full((16, 2), 6.0, np.float32))
        assert set(["essp_subscribed", "essp_pushed", "essp_taken", "essp_refused",
                    "tp_buffer_bytes"]) <= set(s)


def test_hot_auto_chooses_the_keys_used_most_and_keeps_every_push(cluster2):
    keys = np.arange(32, dtype=np.uint64)
    busy = np.array([4, 9, 17], np.uint64)

    def body(n):
        t = n.table(num_keys=32, value_len=2, hot_auto=3, hot_sync_ms=5)
        before = t.hot_keys()
        for _ in range(64):  # counted one call in 8: 8 times each
            t.push(busy, np.ones((3, 2), np.float32))
        t.push(keys, np.ones((32, 2), np.float32))
        n.barrier()
        t.hot_update()
        chosen = t.hot_keys()
        v = t.pull(keys)
        n.barrier()  # read before the other node pushes again
        t.push(busy, np.ones((3, 2), np.float32))  # now to the replicas
        t.flush()
        n.barrier()
        after = t.pull(keys)
        n.barrier()
        t.destroy()
        return before, chosen, v, after

    for before, chosen, v, after in run_nodes(cluster2, body):
        assert before.dtype == np.uint64 and len(before) == 0
        np.testing.assert_array_equal(chosen, busy)
        want = np.full((32, 2), 2.0, np.float32)
        want[busy.astype(np.int64)] = 2 * 64 + 2
        np.testing.assert_array_equal(v, want)
        want[busy.astype(np.int64)] += 2
        np.testing.assert_array_equal(after, want)


def test_hot_auto_bad_arguments(cluster2, node1):
    with pytest.raises(ferry.Error) as ei:
        node1.table(num_keys=4, value_len=1, hot_auto=2, hot_keys=[1])
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(ferry.Error) as ei:
        node1.table(num_keys=4, value_len=1, hot_auto=2, consistency="ssp", staleness=1)
    assert ei.value.errno == errno.EINVAL
    t = node1.table(num_keys=4, value_len=1)
    with pytest.raises(ferry.Error) as ei:
        t.hot_update()  # no hot_auto
    assert ei.value.errno == errno.EINVAL
    assert len(t.hot_keys()) == 0
    t.destroy()


def test_hot_keys_bad_arguments(cluster2, node1):
    with pytest.raises(ValueError, match="hot_keys must be uint64 keys"):
        node1.table(num_keys=4, value_len=1, hot_keys=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="hot_keys must be uint64 keys"):
        node1.table(num_keys=4, value_len=1, hot_keys=np.array([], np.uint64))
    with pytest.raises(ferry.Error) as ei:
        node1.table(num_keys=4, value_len=1, hot_keys=[1, 1])  # a key twice
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(ferry.Error) as ei:
        node1.table(num_keys=4, value_len=1, hot_keys=[9])  # past num_keys
    assert ei.value.errno == errno.EINVAL
