# SPDX-License-Identifier: MIT
"""Knowledge-graph embeddings (ComplEx, RESCAL) trained in PyTorch with negative sampling and
AdaGrad, the embeddings in Ferry tables: Lapse's task (docs/python.md).

    train.py --data synth --local 2 --placement dynamic        # 2 processes on this machine
    torchrun --nproc_per_node 2 train.py --data wordnet ...     # or any launcher ferry reads

Each node trains on its share of the training triples. A table row holds an embedding and
its AdaGrad accumulator side by side, so they move together. Per batch a node needs the
rows of the batch's entities and relations:
  classic   pulls them from where the static placement put them, computes, pushes the update;
  dynamic   localizes the rows of the next batch while it computes this one (latency hiding)
            and then pulls and pushes in place (Lapse's dynamic parameter allocation).
Negatives corrupt heads and tails with other entities of the same batch, so a batch needs no
rows beyond its own. Rank 0 evaluates filtered MRR and Hits@10 on held-out triples at the end.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kgedata  # noqa: E402

import ferry  # noqa: E402


# ---- models --------------------------------------------------------------------------------
class ComplEx:
    """score(h, r, t) = Re(<h, r, conj(t)>); embeddings of 2*dim floats (real, imaginary)."""

    def __init__(self, dim):
        self.dim = dim
        self.ent_len = 2 * dim
        self.rel_len = 2 * dim

    def score(self, h, r, t):
        d = self.dim
        hr, hi, rr, ri, tr, ti = h[..., :d], h[..., d:], r[..., :d], r[..., d:], t[..., :d], \
            t[..., d:]
        return (hr * rr * tr + hi * rr * ti + hr * ri * ti - hi * ri * tr).sum(-1)

    def score_tails(self, h, r, E):
        """h, r: (b, 2d); E: (n, 2d) -> (b, n) scores of every entity as the tail"""
        d = self.dim
        qr = h[:, :d] * r[:, :d] - h[:, d:] * r[:, d:]
        qi = h[:, :d] * r[:, d:] + h[:, d:] * r[:, :d]
        return qr @ E[:, :d].T + qi @ E[:, d:].T

    def score_heads(self, t, r, E):
        d = self.dim
        qr = t[:, :d] * r[:, :d] + t[:, d:] * r[:, d:]
        qi = t[:, d:] * r[:, :d] - t[:, :d] * r[:, d:]
        return qr @ E[:, :d].T + qi @ E[:, d:].T


class RESCAL:
    """score(h, r, t) = h^T R_r t; entities dim floats, relations a dim x dim matrix."""

    def __init__(self, dim):
        self.dim = dim
        self.ent_len = dim
        self.rel_len = dim * dim

    def score(self, h, r, t):
        """h, r, t broadcast against each other; with negatives one of h and t has a
        dimension of k where r has 1: the product with R is taken on the other side first,
        so R is never expanded k times (b x k x dim x dim floats)."""
        R = r.reshape(*r.shape[:-1], self.dim, self.dim)
        if h.dim() >= 2 and t.dim() >= 2 and h.shape[-2] > t.shape[-2]:
            return (h * (R @ t.unsqueeze(-1)).squeeze(-1)).sum(-1)
        return ((h.unsqueeze(-2) @ R).squeeze(-2) * t).sum(-1)

    def score_tails(self, h, r, E):
        R = r.reshape(-1, self.dim, self.dim)
        return (h.unsqueeze(1) @ R).squeeze(1) @ E.T

    def score_heads(self, t, r, E):
        R = r.reshape(-1, self.dim, self.dim)
        return (R @ t.unsqueeze(-1)).squeeze(-1) @ E.T


MODELS = {"complex": ComplEx, "rescal": RESCAL}


# ---- training on one node ------------------------------------------------------------------
def make_batches(triples, batch, rng):
    idx = rng.permutation(len(triples))
    return [triples[idx[i:i + batch]] for i in range(0, len(idx), batch)]


def batch_keys(b):
    ents, inv = np.unique(b[:, [0, 2]], return_inverse=True)
    rels, rinv = np.unique(b[:, 1], return_inverse=True)
    return ents.astype(np.uint64), inv.reshape(-1, 2), rels.astype(np.uint64), rinv


def train_batch(model, args, ent_t, rel_t, b, keys, rng, clock):
    """One step on batch b: pull the rows, autograd the loss, push AdaGrad's update;
    clock gathers the seconds spent in pull, in torch (the loss, its gradient and the
    update) and in push."""
    ents, inv, rels, rinv = keys
    c0 = time.perf_counter()
    E = torch.from_numpy(ent_t.pull(ents))  # (n, 2*ent_len): embedding | accumulator
    R = torch.from_numpy(rel_t.pull(rels))
    c1 = time.perf_counter()
    clock["pull"] += c1 - c0
    u0 = time.thread_time()
    el, rl = model.ent_len, model.rel_len
    e = E[:, :el].clone().requires_grad_()
    r = R[:, :rl].clone().requires_grad_()
    hi = torch.from_numpy(inv[:, 0])
    ti = torch.from_numpy(inv[:, 1])
    ri = torch.from_numpy(rinv)
    pos = model.score(e[hi], r[ri], e[ti])
    # negatives: k corrupted tails and k corrupted heads, drawn from the batch's entities
    k = args.negatives
    n = len(ents)
    ct = torch.from_numpy(rng.integers(0, n, (len(b), k)))
    ch = torch.from_numpy(rng.integers(0, n, (len(b), k)))
    neg_t = model.score(e[hi].unsqueeze(1), r[ri].unsqueeze(1), e[ct])
    neg_h = model.score(e[ch], r[ri].unsqueeze(1), e[ti].unsqueeze(1))
    loss = (torch.nn.functional.softplus(-pos).mean()
            + torch.nn.functional.softplus(neg_t).mean()
            + torch.nn.functional.softplus(neg_h).mean()
            + args.reg * ((e ** 2).sum() + (r ** 2).sum()) / len(b))
    loss.backward()
    out = []
    for P, g, t, keys_ in ((E, e.grad, ent_t, ents), (R, r.grad, rel_t, rels)):
        L = g.shape[1]
        acc = P[:, L:] + g * g
        delta = torch.empty_like(P)
        delta[:, :L] = -args.lr * g / (acc.sqrt() + 1e-10)
        delta[:, L:] = g * g
        out.append((t, keys_, delta.numpy()))
    loss = float(loss)
    c0 = time.perf_counter()
    clock["torch"] += c0 - c1
    clock["torch_cpu"] += time.thread_time() - u0
    for t, keys_, d in out:
        t.push(keys_, d)
    c1 = time.perf_counter()
    clock["push"] += c1 - c0
    return loss


def relation_owners(train, num_relations, world):
    """Lapse's data clustering for KGE: the node that trains each relation's triples. The
    relations go, largest first, to the node with the fewest triples so far (balanced shares;
    a split the store's placement does not know)."""
    count = np.bincount(train[:, 1], minlength=num_relations)
    load, owner = np.zeros(world, np.int64), np.empty(num_relations, np.int64)
    for r in np.argsort(-count, kind="stable"):
        owner[r] = int(np.argmin(load))
        load[owner[r]] += count[r]
    return owner


def run_node(node, kg, args):
    """Trains on this node's share; returns the report (rank 0 adds the evaluation)."""
    model = MODELS[args.model](args.dim)
    mode = "classic" if args.placement == "classic" else "dynamic"
    # capacity: the default (every key + 64) ran out under steady localizes (-ENOSPC): a
    # slot a key left is reused only later, so leave room for the rows in transit
    ent_t = node.table(num_keys=kg.num_entities, value_len=2 * model.ent_len, mode=mode,
                       capacity=2 * kg.num_entities + 4096, placement=args.table_placement)
    rel_t = node.table(num_keys=kg.num_relations, value_len=2 * model.rel_len, mode=mode,
                       capacity=2 * kg.num_relations + 4096, placement=args.table_placement)
    rank, world = node.rank, node.world
    if rank == 0:  # initial values: uniform embeddings, accumulators at args.acc0
        g = np.random.default_rng(args.seed)
        for t, nk, L in ((ent_t, kg.num_entities, model.ent_len),
                         (rel_t, kg.num_relations, model.rel_len)):
            for s in range(0, nk, 4096):
                keys = np.arange(s, min(nk, s + 4096), dtype=np.uint64)
                v = np.empty((len(keys), 2 * L), np.float32)
                v[:, :L] = g.uniform(-args.init, args.init, (len(keys), L))
                v[:, L:] = args.acc0
                t.set(keys, v)
    node.barrier()
    # this node's share of the training triples: the same for both placements
    rng = np.random.default_rng(args.seed + 1)
    if args.partition == "relation":
        part = kg.train[relation_owners(kg.train, kg.num_relations, world)[kg.train[:, 1]]
                        == rank]
        part = part[rng.permutation(len(part))]
    elif args.partition == "head":
        # data clustering: a node trains the triples whose head falls in its block of entity
        # ids (the converters number entities in file order, which keeps related ones close)
        part = kg.train[kg.train[:, 0] * world // kg.num_entities == rank]
        part = part[rng.permutation(len(part))]
    else:
        part = kg.train[rng.permutation(len(kg.train))][rank::world]
    if args.max_train:
        part = part[: args.max_train // world]
    rng = np.random.default_rng(args.seed + 100 + rank)
    epochs = []
    for ep in range(args.epochs):
        batches = make_batches(part, args.batch, rng)
        keys = [batch_keys(b) for b in batches]
        node.barrier()
        s0 = node.stats()
        t0 = time.perf_counter()
        cpu0 = time.process_time()  # this process, every thread (progress thread too)
        loss = 0.0
        waited = 0.0
        clock = {"pull": 0.0, "torch": 0.0, "torch_cpu": 0.0, "push": 0.0,
                 "localize_post": 0.0}
        ahead = []  # localizes under way, oldest first: batches i .. i + args.ahead - 1
        for i, b in enumerate(batches):
            if mode == "dynamic":
                w0 = time.perf_counter()
                while len(ahead) < args.ahead and i + len(ahead) < len(batches):
                    k = keys[i + len(ahead)]
                    ahead.append((ent_t.localize_async(k[0]), rel_t.localize_async(k[2])))
                clock["localize_post"] += time.perf_counter() - w0
                w0 = time.perf_counter()
                for h in ahead.pop(0):
                    h.wait()
                waited += time.perf_counter() - w0
            loss += train_batch(model, args, ent_t, rel_t, b, keys[i], rng, clock)
        mine = time.perf_counter() - t0
        node.barrier()
        wall = time.perf_counter() - t0
        s1 = node.stats()
        times = np.array([mine], np.float64)
        node.allreduce(times, op="max")
        # the CPU the epoch cost, summed over the nodes: on a shared machine a steadier
        # measure of the work than wall time, which other jobs' load stretches
        cpu = np.array([time.process_time() - cpu0], np.float64)
        node.allreduce(cpu)
        epochs.append({"epoch": ep + 1, "seconds": wall, "slowest_node_seconds": float(times[0]),
                       "loss": loss / max(1, len(batches)), "localize_wait_seconds": waited,
                       "pull_push_seconds": clock["pull"] + clock["push"], "node_seconds": mine,
                       # where this rank's epoch went: these plus other_seconds (Python:
                       # batches, keys, the loop) make node_seconds
                       "pull_seconds": clock["pull"], "push_seconds": clock["push"],
                       "torch_seconds": clock["torch"], "torch_cpu_seconds": clock["torch_cpu"],
                       "localize_post_seconds": clock["localize_post"],
                       "other_seconds": mine - clock["pull"] - clock["push"] - clock["torch"]
                       - clock["localize_post"] - waited,
                       "batches": len(batches),
                       "cpu_seconds_all_nodes": float(cpu[0]),
                       "local_ops": s1["local_ops"] - s0["local_ops"],
                       "remote_ops": s1["remote_ops"] - s0["remote_ops"],
                       "relocations_in": s1["relocations_in"] - s0["relocations_in"]})
        if rank == 0:
            e = epochs[-1]
            print("epoch %d: %.2f s (cpu %.2f s, all nodes), loss %.4f; rank 0 (%.2f s): pull "
                  "%.2f push %.2f torch %.2f localize post %.2f wait %.2f other %.2f s; local %d "
                  "remote %d relocated-in %d"
                  % (ep + 1, wall, cpu[0], e["loss"], mine, clock["pull"], clock["push"],
                     clock["torch"], clock["localize_post"], waited, e["other_seconds"],
                     e["local_ops"], e["remote_ops"], e["relocations_in"]), flush=True)
    rep = {"rank": rank, "world": world, "epochs": epochs}
    if rank == 0:  # the trained model, to evaluate once the cluster is left
        rep["model"] = (ent_t.pull(np.arange(kg.num_entities, dtype=np.uint64)),
                        rel_t.pull(np.arange(kg.num_relations, dtype=np.uint64)))
    node.barrier()
    ent_t.destroy()
    rel_t.destroy()
    return rep


def evaluate(model, kg, ent, rel, args):
    """Filtered ranks of the true tail and the true head among every entity (Bordes et al.):
    the other known true triples are left out of the ranking. ent, rel: every row pulled."""
    E = torch.from_numpy(ent)[:, :model.ent_len]
    R = torch.from_numpy(rel)[:, :model.rel_len]
    test = kg.test[: args.eval_triples] if args.eval_triples else kg.test
    known_t, known_h = {}, {}
    for h, r, t in np.concatenate([kg.train, kg.valid, kg.test]):
        known_t.setdefault((h, r), []).append(t)
        known_h.setdefault((t, r), []).append(h)
    ranks = []
    with torch.no_grad():
        for s in range(0, len(test), 256):
            b = test[s:s + 256]
            h, r, t = (torch.from_numpy(b[:, i]) for i in range(3))
            for sc, true, known in ((model.score_tails(E[h], R[r], E), t, known_t),
                                    (model.score_heads(E[t], R[r], E), h, known_h)):
                for j in range(len(b)):
                    key = (int(b[j, 0]), int(b[j, 1])) if known is known_t else \
                        (int(b[j, 2]), int(b[j, 1]))
                    target = float(sc[j, true[j]])
                    row = sc[j].clone()
                    row[known[key]] = -float("inf")
                    ranks.append(1 + int((row > target).sum()))
    ranks = np.array(ranks, np.float64)
    n = kg.num_entities
    return {"mrr": float((1 / ranks).mean()), "hits10": float((ranks <= 10).mean()),
            "hits1": float((ranks <= 1).mean()), "triples": len(test),
            "random_mrr": float((1 / np.arange(1, n + 1)).sum() / n)}


# ---- data and launch -----------------------------------------------------------------------
def load(args):
    if args.data == "synth":
        return kgedata.synthetic(num_entities=args.synth_entities, num_triples=args.synth_triples,
                                 seed=args.seed)
    if args.data == "wordnet":
        return kgedata.wordnet(min_degree=args.min_degree, seed=args.seed)
    return kgedata.load_tsv(args.data)


def launch_local(args):
    """Starts args.local copies of this script as ranks 0..n-1 (FERRY_* variables; rank 0
    gets the rendezvous socket bound here) and returns rank 0's report."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    port = ls.getsockname()[1]
    argv = [a for a in sys.argv[1:]]
    i = argv.index("--local")
    del argv[i:i + 2]
    procs = []
    for r in range(args.local):
        env = dict(os.environ, FERRY_RANK=str(r), FERRY_WORLD=str(args.local),
                   FERRY_RENDEZVOUS="127.0.0.1:%d" % port, OMP_NUM_THREADS=str(args.threads))
        fds = ()
        if r == 0:
            env["KGE_RDV_FD"] = str(ls.fileno())
            fds = (ls.fileno(),)
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv,
                                      env=env, pass_fds=fds))
    ls.close()
    rc = 0
    for p in procs:
        rc |= p.wait()
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="synth",
                    help="synth, wordnet, or a folder with train/valid/test.txt (TSV)")
    ap.add_argument("--model", default="complex", choices=sorted(MODELS))
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--negatives", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--reg", type=float, default=1e-4)
    ap.add_argument("--init", type=float, default=0.1)
    ap.add_argument("--acc0", type=float, default=0.0, help="AdaGrad's initial accumulator")
    ap.add_argument("--placement", default="dynamic", choices=["dynamic", "classic"])
    ap.add_argument("--ahead", type=int, default=2,
                    help="dynamic: batches whose rows are localized ahead of use")
    ap.add_argument("--partition", default="random", choices=["random", "head", "relation"],
                    help="triples per node: a random share, by block of head entity ids, or "
                    "by relation (balanced by triple counts)")
    ap.add_argument("--table-placement", default="range", choices=["range", "hash"],
                    help="where keys start (classic: where they stay)")
    ap.add_argument("--local", type=int, default=0,
                    help="start this many ranks as processes here (else: the launcher's)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--max-train", type=int, default=0, help="train on a subset (all ranks)")
    ap.add_argument("--eval-triples", type=int, default=0, help="evaluate on a subset")
    ap.add_argument("--min-degree", type=int, default=5,
                    help="wordnet: keep synsets in at least this many triples (5: WN18's size)")
    ap.add_argument("--synth-entities", type=int, default=2000)
    ap.add_argument("--synth-triples", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="rank 0 writes its report here")
    args = ap.parse_args()
    if args.local:
        sys.exit(launch_local(args))
    torch.set_num_threads(args.threads)
    kg = load(args)
    kw = {}
    if os.environ.get("KGE_RDV_FD"):
        kw["rendezvous_fd"] = int(os.environ["KGE_RDV_FD"])
    with ferry.open(**kw) as node:
        if node.rank == 0:
            print("data %s: %s; %s dim %d, %s placement, %d nodes"
                  % (kg.source, kg.counts(), args.model, args.dim, args.placement, node.world),
                  flush=True)
        rep = run_node(node, kg, args)
    if rep["rank"] != 0:
        return
    rep["eval"] = evaluate(MODELS[args.model](args.dim), kg, *rep.pop("model"), args)
    print("filtered MRR %.4f Hits@10 %.4f on %d test triples (random ranking: MRR %.4f)"
          % (rep["eval"]["mrr"], rep["eval"]["hits10"], rep["eval"]["triples"],
             rep["eval"]["random_mrr"]), flush=True)
    if args.json:
        rep.update({"data": kg.source, "counts": kg.counts(), "args": vars(args)})
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
