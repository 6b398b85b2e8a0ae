# SPDX-License-Identifier: MIT
"""One rank of a cluster that a launcher started (test_launch.py): ferry.open() with no
arguments, so rank, world and rendezvous come from the environment (FERRY_*, or torchrun's
RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT). Prints one line "ok RANK WORLD SUM"."""
import os
import sys

import numpy as np

import ferry

kw = {}
if os.environ.get("TEST_RDV_FD"):
    kw["rendezvous_fd"] = int(os.environ["TEST_RDV_FD"])
with ferry.open(timeout_ms=20000, **kw) as n:
    t = n.table(num_keys=64, value_len=2)
    keys = np.arange(64, dtype=np.uint64)
    t.push(keys, np.full((64, 2), n.rank + 1.0, np.float32))
    n.barrier()
    t.localize(np.ascontiguousarray(keys[n.rank::n.world]))
    v = t.pull(keys)
    expect = n.world * (n.world + 1) / 2
    if not np.all(v == expect):
        sys.exit("rank %d: pulled %s, want %s everywhere" % (n.rank, v[:2], expect))
    s = np.array([float(n.rank)], np.float64)
    n.allreduce(s)
    n.barrier()
    t.destroy()
    # one write of the whole line: print() writes its pieces one by one, and mpirun's
    # forwarding interleaved two ranks' pieces ("okok  1 2 1")
    sys.stdout.write("ok %d %d %d\n" % (n.rank, n.world, int(s[0])))
    sys.stdout.flush()
