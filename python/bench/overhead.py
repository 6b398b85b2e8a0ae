# SPDX-License-Identifier: MIT
"""Per-call cost of ferry's Python binding against C, in the same run (docs/python.md).

For each case the same table, keys and output buffer are pulled N times
  c        ferry_pull in a C loop (Table._c_pull_loop: the same process, worker and memory)
  py       t.pull(keys, out=out) from a Python loop (the binding: argument parsing, buffer
           checks, GIL release and reacquire)
  py-new   t.pull(keys), a new numpy array each call
  torch    t.pull(keys_t, out=out_t) with torch tensors, read each of the binding's ways
           (TORCH_PATHS: one call into ferry._torchview reading the at::Tensor, the
           default where it is built; the attributes by interned name; one DLPack export;
           the attributes by C string, as the first version did)
and the script prints us per call, the difference (added per call) and the ratio py / c.
Cases: 1 key and 1000 keys, owned here (the local fast path: the binding's cost stands
alone) and owned by the other node of a 2-node cluster of threads (over the transport).
The three run interleaved, --reps times; each figure is the best of its repetitions (the
least disturbed by other processes).
"""
import argparse
import json
import threading
import time

import numpy as np

import ferry

# how the binding reads a torch tensor (arrays.c, enum tensor_path): the default first;
# "aten" (ferry._torchview) only where it was built (main() drops it otherwise)
TORCH_PATHS = ("aten", "attrs", "dlpack", "strings")
DEFAULT_PATH = "attrs"


def measure(t, keys, iters, reps, vl):
    out = np.empty((len(keys), vl), np.float32)
    t.pull(keys, out=out)

    def py():
        t0 = time.perf_counter()
        for _ in range(iters):
            t.pull(keys, out=out)
        return time.perf_counter() - t0

    def py_new():
        t0 = time.perf_counter()
        for _ in range(iters):
            t.pull(keys)
        return time.perf_counter() - t0

    try:
        import torch
        keys_t = torch.from_numpy(keys.astype(np.int64))
        out_t = torch.from_numpy(out.copy())

        def py_torch(path):
            ferry._ferry._tensor_path(path)
            t0 = time.perf_counter()
            for _ in range(iters):
                t.pull(keys_t, out=out_t)
            dt = time.perf_counter() - t0
            ferry._ferry._tensor_path(DEFAULT_PATH)
            return dt
    except ImportError:
        def py_torch(path):
            return float("nan")

    # interleaved, so a disturbance from other processes hits all of them alike
    runs = [(t._c_pull_loop(keys, out, iters), py(), py_new()) +
            tuple(py_torch(p) for p in TORCH_PATHS) for _ in range(reps)]
    c, p, pn, *pt = (min(r[i] for r in runs) / iters * 1e6 for i in range(3 + len(TORCH_PATHS)))
    res = {"c_us": c, "py_us": p, "py_new_us": pn, "added_us": p - c, "added_new_us": pn - c,
           "ratio": p / c}
    for path, v in zip(TORCH_PATHS, pt):
        res.update({"torch_%s_us" % path: v, "added_torch_%s_us" % path: v - c,
                    "ratio_torch_%s" % path: v / c})
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--value-len", type=int, default=16)
    ap.add_argument("--iters", type=int, default=20000, help="calls per repetition, 1 key")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--where", choices=("local", "remote", "both"), default="both")
    args = ap.parse_args()
    global TORCH_PATHS, DEFAULT_PATH
    try:
        import torch  # noqa: F401
        DEFAULT_PATH = ferry._ferry._tensor_path("attrs")
        ferry._ferry._tensor_path(DEFAULT_PATH)
        if DEFAULT_PATH != "aten":
            TORCH_PATHS = tuple(p for p in TORCH_PATHS if p != "aten")
    except ImportError:
        pass
    vl = args.value_len
    res = {"value_len": vl, "reps": args.reps, "torch_paths": TORCH_PATHS, "cases": []}
    nodes = ferry.local_cluster(2)
    tabs = [None, None]

    def make(i):
        tabs[i] = nodes[i].table(num_keys=4000, value_len=vl)
    ths = [threading.Thread(target=make, args=(i,)) for i in range(2)]
    [x.start() for x in ths]
    [x.join() for x in ths]
    t = tabs[0]
    for where in ("local", "remote") if args.where == "both" else (args.where,):
        for n in (1, 1000):
            # range placement: keys 0..1999 are rank 0's, 2000..3999 rank 1's
            base = 0 if where == "local" else 2000
            keys = np.arange(base, base + n, dtype=np.uint64)
            iters = max(20, args.iters // n) if where == "local" else max(20, args.iters // 10
                                                                             // max(1, n // 10))
            r = measure(t, keys, iters, args.reps, vl)
            r.update({"where": where, "keys": n, "iters": iters})
            res["cases"].append(r)
            print("%-6s %4d keys: C %8.3f us  Python %8.3f us (+%.3f, x%.3f)  "
                  "new array %8.3f us (+%.3f)"
                  % (where, n, r["c_us"], r["py_us"], r["added_us"], r["ratio"],
                     r["py_new_us"], r["added_new_us"]), flush=True)
            for path in TORCH_PATHS:
                print("              torch %-7s %8.3f us (+%.3f, x%.3f)"
                      % (path, r["torch_%s_us" % path], r["added_torch_%s_us" % path],
                         r["ratio_torch_%s" % path]), flush=True)
    done = threading.Event()

    def fin(i):
        nodes[i].barrier()
        tabs[i].destroy()
        if i == 1:
            done.set()
    ths = [threading.Thread(target=fin, args=(i,)) for i in range(2)]
    [x.start() for x in ths]
    [x.join() for x in ths]
    for nd in nodes:
        nd.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
