# SPDX-License-Identifier: MIT
"""The ferry package on a local cluster of threads: values, zero copy, async, collectives."""
import errno
import threading

import numpy as np
import pytest
from conftest import run_nodes

import ferry


def test_import_and_version():
    assert ferry.version == ferry.__version__
    assert ferry.version.count(".") == 2
    assert issubclass(ferry.Error, OSError)


def test_push_pull_set_two_nodes(cluster2):
    vl = 8

    def body(n):
        t = n.table(num_keys=1000, value_len=vl)
        keys = np.arange(n.rank, 1000, 2, dtype=np.uint64)  # half the keys each
        t.set(keys, np.full((len(keys), vl), 1.0, np.float32))
        n.barrier()
        every = np.arange(1000, dtype=np.uint64)
        t.push(every, np.full((1000, vl), 0.5, np.float32))  # both nodes add to every key
        n.barrier()
        v = t.pull(every)
        n.barrier()
        t.destroy()
        return v

    for v in run_nodes(cluster2, body):
        assert v.shape == (1000, vl) and v.dtype == np.float32
        np.testing.assert_array_equal(v, np.full((1000, vl), 2.0, np.float32))


def test_localize_moves_keys_and_stats(cluster2):
    def body(n):
        t = n.table(num_keys=200, value_len=4)
        mine = np.arange(100 * n.rank, 100 * n.rank + 100, dtype=np.uint64)
        other = np.arange(100 * (1 - n.rank), 100 * (1 - n.rank) + 100, dtype=np.uint64)
        n.barrier()
        t.localize(other)  # each node takes the other's range
        n.barrier()
        before = n.stats()["local_ops"]
        t.pull(other)
        after = n.stats()
        ts = t.stats()
        n.barrier()
        t.destroy()
        return after["local_ops"] - before, after["relocations_in"], ts["keys_owned"], len(mine)

    for local, rin, owned, _ in run_nodes(cluster2, body):
        assert local == 100  # served in place after the localize
        assert rin == 100
        assert owned == 100


def test_classic_mode_localize_does_nothing(cluster2):
    def body(n):
        t = n.table(num_keys=100, value_len=2, mode="classic")
        t.localize(np.arange(100, dtype=np.uint64))
        n.barrier()
        s = n.stats()
        n.barrier()
        t.destroy()
        return s["relocations_in"]

    assert run_nodes(cluster2, body) == [0, 0]


def test_sparse_table_any_uint64_key(cluster2):
    big = np.array([2**63 + 12345, 17, 2**64 - 1], dtype=np.uint64)

    def body(n):
        t = n.table(sparse=True, value_len=3, placement="hash", init="normal",
                    init_a=0.0, init_b=1.0, init_seed=7)
        first = t.pull(big)  # the initial value, the same on every node
        n.barrier()
        if n.rank == 0:
            t.push(big, np.ones((3, 3), np.float32))
        n.barrier()
        v = t.pull(big)
        n.barrier()
        t.destroy()
        return first, v

    (f0, v0), (f1, v1) = run_nodes(cluster2, body)
    np.testing.assert_array_equal(f0, f1)
    assert np.abs(f0).sum() > 0
    np.testing.assert_allclose(v0, f0 + 1, rtol=1e-6)
    np.testing.assert_array_equal(v0, v1)


def test_value_lens_per_key(node1):
    lens = np.array([1, 2, 3, 4], dtype=np.uint32)
    t = node1.table(num_keys=4, value_lens=lens)
    keys = np.array([3, 0], dtype=np.uint64)
    t.set(keys, np.arange(5, dtype=np.float32))
    v = t.pull(keys)
    assert v.shape == (5,)
    np.testing.assert_array_equal(v, np.arange(5, dtype=np.float32))
    assert t.value_len_of(2) == 3
    with pytest.raises(ValueError, match="holds 4 floats"):
        t.set(keys, np.zeros(4, np.float32))
    with pytest.raises(ferry.Error, match="key 4 ") as ei:
        t.pull(np.array([4], np.uint64))
    assert ei.value.errno == errno.ERANGE
    t.destroy()


def test_zero_copy_numpy_out(node1):
    t = node1.table(num_keys=10, value_len=4)
    keys = np.arange(10, dtype=np.uint64)
    t.set(keys, np.arange(40, dtype=np.float32).reshape(10, 4))
    out = np.zeros((10, 4), np.float32)
    addr = out.__array_interface__["data"][0]
    r = t.pull(keys, out=out)
    assert r is out  # the very array, filled in place
    assert out.__array_interface__["data"][0] == addr
    np.testing.assert_array_equal(out.ravel(), np.arange(40, dtype=np.float32))
    # a view into a bigger buffer: only its bytes are written
    big = np.zeros((12, 4), np.float32)
    t.pull(keys, out=big[1:11])
    assert big[0].sum() == 0 and big[11].sum() == 0
    np.testing.assert_array_equal(big[1:11].ravel(), np.arange(40, dtype=np.float32))
    t.destroy()


def torchview_built():
    """_ferry was built with ferry._torchview (python/CMakeLists.txt, FERRY_TORCHVIEW)"""
    return bool(ferry._ferry._TORCHVIEW)


@pytest.fixture(params=["aten", "attrs", "dlpack", "strings"])
def tensor_path(request):
    """Every way the binding reads a torch tensor (arrays.c); the default is restored."""
    pytest.importorskip("torch")
    if request.param == "aten" and not torchview_built():
        pytest.skip("ferry._torchview not built (no libtorch-dev, or FERRY_PYTHON_TORCHVIEW=OFF)")
    old = ferry._ferry._tensor_path(request.param)
    yield request.param
    ferry._ferry._tensor_path(old)


def test_torchview_is_the_default():
    """Built, ferry._torchview reads every plain tensor: the default path is "aten"."""
    pytest.importorskip("torch")
    if not torchview_built():
        pytest.skip("ferry._torchview not built (no libtorch-dev, or FERRY_PYTHON_TORCHVIEW=OFF)")
    old = ferry._ferry._tensor_path("attrs")
    ferry._ferry._tensor_path(old)
    assert old == "aten"


def test_zero_copy_torch(tensor_path):
    torch = pytest.importorskip("torch")
    (n,) = ferry.local_cluster(1)
    t = n.table(num_keys=10, value_len=4)
    keys = torch.arange(10, dtype=torch.int64)
    t.set(keys, torch.ones(10, 4))
    out = torch.zeros(10, 4)
    ptr = out.data_ptr()
    r = t.pull(keys, out=out)
    assert r is out and out.data_ptr() == ptr
    assert float(out.sum()) == 40.0
    v = t.pull(keys)  # torch keys: a torch tensor comes back
    assert isinstance(v, torch.Tensor) and v.shape == (10, 4)
    # a parameter that requires grad is refused, with torch's own message
    w = torch.zeros(10, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        t.pull(keys, out=w)
    t.pull(keys, out=w.data)  # .data is the same memory, without autograd
    assert float(w.sum()) == 40.0
    with pytest.raises(ValueError, match="C-contiguous"):
        t.pull(keys, out=torch.zeros(4, 10).t())
    with pytest.raises(TypeError, match="keys must be uint64 or int64"):
        t.pull(keys.int())
    with pytest.raises(TypeError, match="must be float32"):
        t.push(keys, torch.zeros(10, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="10 keys need 40"):
        t.push(keys, torch.zeros(10, 3))
    t.push(keys, torch.ones(10, 4, requires_grad=True))  # only read: allowed
    assert float(t.pull(keys).sum()) == 80.0
    # a view at an offset into a bigger tensor: only its bytes are written
    big = torch.zeros(12, 4)
    t.pull(keys, out=big[1:11])
    assert float(big[0].sum()) == 0 and float(big[11].sum()) == 0
    assert float(big[1:11].sum()) == 80.0
    col = torch.zeros(10, 1)  # a dimension of 1: contiguous whatever its stride
    t2 = n.table(num_keys=10, value_len=1)
    t2.set(keys, torch.arange(10, dtype=torch.float32).reshape(10, 1))
    t2.pull(keys, out=col)
    assert col.ravel().tolist() == list(range(10))
    with pytest.raises(ValueError, match="C-contiguous"):
        t2.pull(keys[::2].contiguous(), out=torch.zeros(5, 2)[:, :1])
    with pytest.raises(ValueError, match="C-contiguous"):
        t.pull(torch.arange(20, dtype=torch.int64)[::2])
    with pytest.raises(TypeError, match="keys must be uint64 or int64"):
        t.pull(torch.arange(3, dtype=torch.bfloat16))
    g = torch.full((3,), 2.0, dtype=torch.float64)
    assert n.allreduce(g) is g and float(g.sum()) == 6.0  # one node: the sum is itself
    # nothing is kept between calls: a tensor resized (new memory) is read anew
    grow = torch.zeros(2, 4)
    t.pull(keys[:2], out=grow)
    grow.resize_(10, 4)
    grow.zero_()
    t.pull(keys, out=grow)
    assert float(grow.sum()) == 80.0
    with pytest.raises(TypeError, match="on a device"):
        t.pull(keys, out=torch.zeros(10, 4, device="meta"))
    # a Parameter: read as deltas, refused as out (it requires grad)
    p = torch.nn.Parameter(torch.ones(10, 4))
    t.push(keys, p)
    with pytest.raises(RuntimeError, match="requires grad"):
        t.pull(keys, out=p)
    t.pull(keys, out=p.data)
    assert float(p.data.sum()) == 120.0

    class Sub(torch.Tensor):  # a subclass: read through its attributes on every path
        pass
    sub = torch.zeros(10, 4).as_subclass(Sub)
    assert t.pull(keys, out=sub) is sub and float(sub.sum()) == 120.0
    if tensor_path == "aten":  # what only the at::Tensor reader tells apart
        with pytest.raises(TypeError, match="sparse"):
            t.push(keys, torch.ones(10, 4).to_sparse())
        with pytest.raises(ValueError, match="negative or conjugate view"):
            t.push(keys, torch.ones(10, 4)._neg_view())
    t2.destroy()
    t.destroy()
    n.close()


def test_async_forms(node1):
    t = node1.table(num_keys=100, value_len=2)
    keys = np.arange(100, dtype=np.uint64)
    hs = [t.set_async(keys, np.ones((100, 2), np.float32)),
          t.push_async(keys, np.ones((100, 2), np.float32)),
          t.localize_async(keys)]
    for h in hs:
        assert h.wait() is None
        assert h.done
    h = t.pull_async(keys)
    while not h.test():
        pass
    v = h.wait()
    np.testing.assert_array_equal(v, np.full((100, 2), 2.0, np.float32))
    # a handle dropped before wait() is waited for (the buffers outlive the operation)
    t.push_async(keys, np.ones((100, 2), np.float32))
    np.testing.assert_array_equal(t.pull(keys), np.full((100, 2), 3.0, np.float32))
    t.destroy()


def test_async_wait_on_another_thread_is_refused(node1):
    t = node1.table(num_keys=10, value_len=1)
    h = t.pull_async(np.arange(10, dtype=np.uint64))
    errs = []
    th = threading.Thread(target=lambda: errs.append(pytest.raises(RuntimeError, h.wait)))
    th.start()
    th.join()
    assert "thread that started it" in str(errs[0].value)
    h.wait()
    with pytest.raises(RuntimeError, match="not waited"):
        h2 = t.pull_async(np.arange(10, dtype=np.uint64))
        t.destroy()
    h2.wait()
    t.destroy()


def test_threads_get_their_own_workers(node1):
    t = node1.table(num_keys=64, value_len=1)

    def adder():
        for _ in range(50):
            t.push(np.arange(64, dtype=np.uint64), np.ones(64, np.float32))

    ths = [threading.Thread(target=adder) for _ in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    np.testing.assert_array_equal(t.pull(np.arange(64, dtype=np.uint64)),
                                  np.full((64, 1), 200.0, np.float32))
    t.destroy()


def test_collectives(cluster2):
    def body(n):
        r = n.rank
        a = np.array([r + 1.0, -r], np.float64)
        n.allreduce(a)  # in place
        m = np.array([r, 10 - r], np.int64)
        mx = n.allreduce(m, np.zeros(2, np.int64), op="max")
        s = np.full(4, r + 1.0, np.float32)
        red = n.reduce(s, np.zeros(4, np.float32), root=1)
        b = np.full(3, float(r), np.float32)
        n.broadcast(b, root=1)
        c = np.full(5, 1.0, np.float32)
        h = n.allreduce_async(c)
        assert h.wait() is c
        return a, mx, red, b, c

    (a0, mx0, red0, b0, c0), (a1, mx1, red1, b1, c1) = run_nodes(cluster2, body)
    np.testing.assert_array_equal(a0, [3.0, -1.0])
    np.testing.assert_array_equal(a1, a0)
    np.testing.assert_array_equal(mx0, [1, 10])
    np.testing.assert_array_equal(red1, np.full(4, 3.0, np.float32))
    np.testing.assert_array_equal(b0, np.ones(3, np.float32))
    np.testing.assert_array_equal(c1, np.full(5, 2.0, np.float32))
