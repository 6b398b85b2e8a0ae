# SPDX-License-Identifier: MIT
"""Dynamic against classic placement for KGE on the same data, on 2 and 4 local nodes
(processes): runs train.py for each (nodes, placement) pair --reps times, one after the other
and in alternating order (so a change in the machine's load hits both alike), and writes one
JSON with every run and a plot of epoch times and MRR.

    compare.py --data wordnet --epochs 3 --out docs/python-kge   # -> .json and .png (or .txt)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(args, nodes, placement, extra):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, os.path.join(HERE, "train.py"), "--data", args.data, "--local",
           str(nodes), "--placement", placement, "--epochs", str(args.epochs), "--model",
           args.model, "--dim", str(args.dim), "--eval-triples", str(args.eval_triples),
           "--json", path] + extra
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
    if p.returncode:
        sys.exit("train.py failed (%d):\n%s" % (p.returncode, p.stderr))
    with open(path) as f:
        rep = json.load(f)
    os.unlink(path)
    return rep


# where rank 0's epoch went (train.py): these add up to its node_seconds
PARTS = ("pull_seconds", "push_seconds", "torch_seconds", "localize_post_seconds",
         "localize_wait_seconds", "other_seconds")


def summary(reps):
    # the first epoch also pays for first touches: the later ones count
    ep = [e["seconds"] for rep in reps for e in (rep["epochs"][1:] or rep["epochs"])]
    counted = [e for rep in reps for e in (rep["epochs"][1:] or rep["epochs"])]
    parts = {k: sum(e.get(k, 0.0) for e in counted) / len(counted)
             for k in PARTS + ("node_seconds", "torch_cpu_seconds")}
    return {"rank0_breakdown": parts,"epoch_seconds": sum(ep) / len(ep), "epoch_seconds_min": min(ep),
            "epoch_seconds_max": max(ep), "epochs_counted": len(ep),
            "mrr": sum(r["eval"]["mrr"] for r in reps) / len(reps),
            "hits10": sum(r["eval"]["hits10"] for r in reps) / len(reps),
            "pull_push_seconds": sum(e["pull_push_seconds"] for rep in reps
                                     for e in (rep["epochs"][1:] or rep["epochs"])) / len(ep),
            "cpu_seconds_all_nodes": sum(e.get("cpu_seconds_all_nodes", float("nan"))
                                         for rep in reps
                                         for e in (rep["epochs"][1:] or rep["epochs"])) / len(ep),
            "relocations_in": sum(e["relocations_in"] for rep in reps
                                  for e in (rep["epochs"][1:] or rep["epochs"])) / len(ep)}


def plot(res, out, title=""):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        with open(out + ".txt", "w") as f:
            for n, r in sorted(res.items()):
                for p in ("classic", "dynamic"):
                    s = r[p]
                    f.write("%d nodes %-8s %6.2f s/epoch %s MRR %.3f\n" % (
                        int(n), p, s["epoch_seconds"], "#" * int(10 * s["epoch_seconds"]),
                        s["mrr"]))
        return out + ".txt"
    fig, ax = plt.subplots(1, 4, figsize=(17, 3.5))
    ns = sorted(res, key=int)
    # rank 0's epoch, stacked by part: classic and dynamic side by side per node count
    colors = ("tab:blue", "tab:cyan", "tab:orange", "tab:purple", "tab:red", "tab:gray")
    for j, n in enumerate(ns):
        for i, p in enumerate(("classic", "dynamic")):
            bottom = 0.0
            for k, c in zip(PARTS, colors):
                v = res[n][p].get("rank0_breakdown", {}).get(k, 0.0)
                ax[3].bar(j + 0.4 * i, v, 0.38, bottom=bottom, color=c,
                          label=k.replace("_seconds", "") if j == 0 and i == 0 else None)
                bottom += v
            ax[3].text(j + 0.4 * i, bottom, p[0], ha="center", va="bottom")
    ax[3].set_xticks([j + 0.2 for j in range(len(ns))])
    ax[3].set_xticklabels(["%s nodes" % n for n in ns])
    ax[3].set_title("rank 0's epoch (s): c classic, d dynamic")
    ax[3].legend(fontsize=7)
    for i, p in enumerate(("classic", "dynamic")):
        ax[0].bar([j + 0.4 * i for j in range(len(ns))],
                  [res[n][p]["epoch_seconds"] for n in ns], 0.4, label=p)
        ax[1].bar([j + 0.4 * i for j in range(len(ns))],
                  [res[n][p]["cpu_seconds_all_nodes"] for n in ns], 0.4, label=p)
        ax[2].bar([j + 0.4 * i for j in range(len(ns))], [res[n][p]["mrr"] for n in ns], 0.4,
                  label=p)
    for a, t in ((ax[0], "wall seconds per epoch (mean)"),
                 (ax[1], "CPU seconds per epoch, all nodes"), (ax[2], "filtered MRR")):
        a.set_xticks([j + 0.2 for j in range(len(ns))])
        a.set_xticklabels(["%s nodes" % n for n in ns])
        a.set_title(t)
        a.legend()
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=100)
    return out + ".png"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="wordnet")
    ap.add_argument("--model", default="complex")
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--eval-triples", type=int, default=1000)
    ap.add_argument("--nodes", default="2,4")
    ap.add_argument("--reps", type=int, default=2, help="runs of each pair")
    ap.add_argument("--out", default="kge-compare")
    ap.add_argument("--title", default="", help="the plot's title")
    ap.add_argument("--replot", help="only redraw the plot of this JSON (to --out)")
    args, extra = ap.parse_known_args()
    if args.replot:
        with open(args.replot) as f:
            d = json.load(f)
            print("wrote", plot(d["summary"], args.out, d["args"].get("title", "")))
        return
    res, runs = {}, []
    k = 0
    for n in (int(x) for x in args.nodes.split(",")):
        got = {"classic": [], "dynamic": []}
        for _ in range(args.reps):
            for p in (("classic", "dynamic") if k % 2 == 0 else ("dynamic", "classic")):
                rep = run(args, n, p, extra)
                runs.append(rep)
                got[p].append(rep)
            k += 1
        res[str(n)] = {p: summary(got[p]) for p in got}
        r = res[str(n)]
        r["speedup_dynamic_over_classic"] = r["classic"]["epoch_seconds"] / \
            r["dynamic"]["epoch_seconds"]
        r["speedup_min_epochs"] = r["classic"]["epoch_seconds_min"] / \
            r["dynamic"]["epoch_seconds_min"]
        r["cpu_ratio_classic_over_dynamic"] = r["classic"]["cpu_seconds_all_nodes"] / \
            r["dynamic"]["cpu_seconds_all_nodes"]
        c, d = r["classic"], r["dynamic"]
        for p in ("classic", "dynamic"):
            print("  %s, rank 0 per epoch: %s" % (p, ", ".join(
                "%s %.2f" % (k.replace("_seconds", ""), v)
                for k, v in r[p]["rank0_breakdown"].items())), flush=True)
        print("%d nodes: classic %.2f s/epoch (%.2f-%.2f, cpu %.2f s) MRR %.3f, dynamic %.2f "
              "s/epoch (%.2f-%.2f, cpu %.2f s) MRR %.3f: dynamic x%.2f (best epochs x%.2f, "
              "cpu x%.2f)" % (n, c["epoch_seconds"], c["epoch_seconds_min"],
                              c["epoch_seconds_max"], c["cpu_seconds_all_nodes"], c["mrr"],
                              d["epoch_seconds"], d["epoch_seconds_min"], d["epoch_seconds_max"],
                              d["cpu_seconds_all_nodes"], d["mrr"],
                              r["speedup_dynamic_over_classic"], r["speedup_min_epochs"],
                              r["cpu_ratio_classic_over_dynamic"]), flush=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"summary": res, "args": vars(args), "extra": extra, "runs": runs}, f,
                  indent=1)
    print("wrote", args.out + ".json", plot(res, args.out, args.title))


if __name__ == "__main__":
    main()
