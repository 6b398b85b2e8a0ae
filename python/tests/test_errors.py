# SPDX-License-Identifier: MIT
"""Bad input is refused with a clear exception, never a crash."""
import errno

import numpy as np
import pytest

import ferry


@pytest.fixture
def table(node1):
    t = node1.table(num_keys=10, value_len=4)
    yield t
    t.destroy()


K = np.arange(3, dtype=np.uint64)


def test_key_dtypes(table):
    with pytest.raises(TypeError, match="keys must be uint64 or int64"):
        table.pull(np.arange(3, dtype=np.int32))
    with pytest.raises(TypeError, match="keys must be uint64 or int64"):
        table.pull(np.arange(3, dtype=np.float64))
    with pytest.raises(ValueError, match="one-dimensional"):
        table.pull(np.zeros((2, 2), np.uint64))
    with pytest.raises(TypeError, match="numpy array or a CPU torch tensor"):
        table.push(K, "abc")
    # lists and ints are copied into uint64 keys
    assert table.pull([0, 1]).shape == (2, 4)
    assert table.pull(5).shape == (1, 4)
    with pytest.raises(ferry.Error) as ei:
        table.pull([10**6])
    assert ei.value.errno == errno.ERANGE


def test_value_dtype_shape_layout(table):
    with pytest.raises(TypeError, match="float32"):
        table.push(K, np.zeros((3, 4), np.float64))
    with pytest.raises(ValueError, match="3 keys need 12"):
        table.push(K, np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError, match="3 keys need 12"):
        table.push(K, np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        table.push(K, np.zeros((4, 3), np.float32).T)
    with pytest.raises(ValueError, match="C-contiguous"):
        table.pull(np.arange(6, dtype=np.uint64)[::2])
    ro = np.zeros((3, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        table.pull(K, out=ro)
    table.push(K, ro)  # read-only is fine for what is only read
    table.push(K, np.zeros(12, np.float32))  # flat is fine


def test_operation_arguments(table):
    with pytest.raises(TypeError, match=r"pull\(\) missing argument 'keys'"):
        table.pull()
    with pytest.raises(TypeError, match=r"push\(\) missing argument 'deltas'"):
        table.push(K)
    with pytest.raises(TypeError, match="unexpected keyword argument 'outt'"):
        table.pull(K, outt=np.zeros((3, 4), np.float32))
    with pytest.raises(TypeError, match="a second keyword argument 'keys'"):
        table.pull(K, keys=K)
    with pytest.raises(TypeError, match=r"localize_async\(\) takes at most 1 arguments"):
        table.localize_async(K, K)
    out = np.zeros((3, 4), np.float32)
    assert table.pull(out=out, keys=K) is out  # by keyword, in any order
    table.set(values=np.ones(12, np.float32), keys=K)
    assert table.pull(K).sum() == 12
    with pytest.raises(ValueError, match="tensor path is"):
        ferry._ferry._tensor_path("numpy")


def test_errors_carry_errno_and_message(table):
    with pytest.raises(ferry.Error) as ei:
        table.pull(np.array([10], np.uint64))
    assert ei.value.errno == errno.ERANGE
    assert "ferry_pull" in ei.value.strerror
    assert isinstance(ei.value, OSError)


def test_bad_parameters(node1):
    with pytest.raises(ValueError, match="placement must be"):
        node1.table(num_keys=1, value_len=1, placement="round")
    with pytest.raises(ferry.Error) as ei:
        node1.table(num_keys=0, value_len=1)  # dense with no keys
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(ValueError, match="transport must be"):
        ferry.open(transport="carrier-pigeon")
    with pytest.raises(TypeError):
        ferry.open(rank="zero")
    with pytest.raises(ValueError, match="1 to 64"):
        ferry.local_cluster(0)


def test_closed_node():
    (n,) = ferry.local_cluster(1)
    t = n.table(num_keys=4, value_len=1)
    n.close()
    assert n.closed
    with pytest.raises(ferry.Error) as ei:
        t.pull(K)
    assert ei.value.errno == ferry.E_CLOSED
    with pytest.raises(ferry.Error):
        n.barrier()
    n.close()  # twice is fine
    t.destroy()


def test_collective_bad_input(node1):
    with pytest.raises(TypeError, match="float32, float64 or int64"):
        node1.allreduce(np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="op must be"):
        node1.allreduce(np.zeros(3, np.float32), op="avg")
    with pytest.raises(ValueError, match="type and size"):
        node1.allreduce(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ferry.Error) as ei:
        node1.broadcast(np.zeros(3, np.float32), root=5)
    assert ei.value.errno == errno.EINVAL
