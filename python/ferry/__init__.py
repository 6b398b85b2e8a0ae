# SPDX-License-Identifier: MIT
"""Ferry from Python: an RDMA-native parameter store (libferry).

    import ferry, numpy as np
    with ferry.open() as node:                 # rank, world, rendezvous: FERRY_* or torchrun/MPI
        t = node.table(num_keys=1000, value_len=16)   # collective: every node, same order
        keys = np.array([3, 7], dtype=np.uint64)
        t.localize(keys)                       # move them here (dynamic placement)
        v = t.pull(keys)                       # (2, 16) float32; out= fills your array
        t.push(keys, np.ones_like(v))          # adds

Keys are uint64 or int64 arrays (numpy or CPU torch; lists are copied); values float32,
C-contiguous, shaped (n, value_len) or flat. Arrays are used in place: no copy. Every call
that waits releases the GIL. Each thread gets its own ferry worker on first use (destroyed
when the thread exits). Errors raise ferry.Error (an OSError: .errno, .strerror), or
TypeError / ValueError for arrays of the wrong type, shape or layout. See docs/python.md.
"""
from ._ferry import (  # noqa: F401
    E_BASE,
    E_CLOSED,
    E_MISMATCH,
    E_NODEV,
    E_NOJOIN,
    E_PEER,
    E_PROTO,
    Checkpoint,
    CollHandle,
    Error,
    Group,
    Handle,
    Node,
    Table,
    local_cluster,
    open,
    strerror,
    version,
)

__version__ = version
__all__ = [
    "open", "local_cluster", "strerror", "Error", "Node", "Table", "Handle", "CollHandle",
    "Group", "Checkpoint",
    "version", "E_BASE", "E_CLOSED", "E_MISMATCH", "E_PROTO", "E_PEER", "E_NOJOIN", "E_NODEV",
]
