# SPDX-License-Identifier: MIT
"""Knowledge-graph data for the KGE example: a triple-TSV loader, a WordNet 3.0 converter
(Debian's wordnet-base, the source WN18 was built from), and a power-law synthetic graph.

Every source gives a KG: entity and relation names, and int64 arrays of shape (n, 3) with
(head, relation, tail) ids for train, valid and test.
"""
import os
import random
from dataclasses import dataclass, field

import numpy as np


@dataclass
class KG:
    entities: list
    relations: list
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    source: str = ""
    notes: dict = field(default_factory=dict)

    @property
    def num_entities(self):
        return len(self.entities)

    @property
    def num_relations(self):
        return len(self.relations)

    def counts(self):
        return {"entities": self.num_entities, "relations": self.num_relations,
                "train": len(self.train), "valid": len(self.valid), "test": len(self.test),
                "triples": len(self.train) + len(self.valid) + len(self.test)}

    def save_tsv(self, folder):
        """Writes train.txt, valid.txt, test.txt as head<TAB>relation<TAB>tail."""
        os.makedirs(folder, exist_ok=True)
        for name, arr in (("train", self.train), ("valid", self.valid), ("test", self.test)):
            with open(os.path.join(folder, name + ".txt"), "w") as f:
                for h, r, t in arr:
                    f.write("%s\t%s\t%s\n" % (self.entities[h], self.relations[r],
                                              self.entities[t]))


def _split(triples, n_valid, n_test, seed):
    """Shuffles and splits; held-out triples whose entities never occur in train are moved
    back into train (a model cannot rank an entity it never trained)."""
    rng = np.random.default_rng(seed)
    triples = triples[rng.permutation(len(triples))]
    held = triples[: n_valid + n_test]
    train = triples[n_valid + n_test:]
    seen = np.zeros(triples[:, [0, 2]].max() + 1, bool)
    seen[train[:, 0]] = True
    seen[train[:, 2]] = True
    ok = seen[held[:, 0]] & seen[held[:, 2]]
    train = np.concatenate([train, held[~ok]])
    held = held[ok]
    return train, held[:n_valid], held[n_valid:n_valid + n_test]


def load_tsv(folder):
    """Reads train.txt, valid.txt, test.txt (head<TAB>relation<TAB>tail, as FB15k, WN18 and
    WN18RR ship) from folder; names get ids in order of first appearance."""
    ents, rels = {}, {}
    out = {}
    for name in ("train", "valid", "test"):
        rows = []
        path = os.path.join(folder, name + ".txt")
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line:
                    continue
                parts = line.split("\t")
                if len(parts) != 3:
                    raise ValueError("%s:%d: want head<TAB>relation<TAB>tail, got %d fields"
                                     % (path, lineno, len(parts)))
                h, r, t = parts
                rows.append((ents.setdefault(h, len(ents)), rels.setdefault(r, len(rels)),
                             ents.setdefault(t, len(ents))))
        out[name] = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return KG(list(ents), list(rels), out["train"], out["valid"], out["test"],
              source="tsv:" + folder)


# The 18 relations of WN18 (Bordes et al., 2013) as WordNet 3.0 pointer symbols
WN18_POINTERS = {
    "@": "_hypernym", "~": "_hyponym", "@i": "_instance_hypernym", "~i": "_instance_hyponym",
    "#m": "_member_holonym", "%m": "_member_meronym", "#p": "_part_of", "%p": "_has_part",
    ";c": "_synset_domain_topic_of", "-c": "_member_of_domain_topic",
    ";u": "_synset_domain_usage_of", "-u": "_member_of_domain_usage",
    ";r": "_synset_domain_region_of", "-r": "_member_of_domain_region",
    "+": "_derivationally_related_form", "&": "_similar_to", "$": "_verb_group",
    "^": "_also_see",
}
WN18_COUNTS = {"entities": 40943, "relations": 18, "train": 141442, "valid": 5000,
               "test": 5000, "triples": 151442}


def wordnet(dict_dir="/usr/share/wordnet", min_degree=0, n_valid=5000, n_test=5000, seed=0,
            max_triples=0):
    """WordNet 3.0 as a KG: synsets ("offset.pos") are entities, the 18 pointer symbols WN18
    kept are relations (lexical pointers, between words, count between their synsets).
    min_degree > 0 keeps the triples whose two synsets are each in at least that many
    triples (one pass, degrees counted over every triple);
    max_triples > 0 keeps a random subset of that size (small runs)."""
    triples = set()
    for pos in ("noun", "verb", "adj", "adv"):
        path = os.path.join(dict_dir, "data." + pos)
        if not os.path.exists(path):
            raise FileNotFoundError("%s missing: install Debian's wordnet-base "
                                    "(bash ci/deps.sh python)" % path)
        with open(path, encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):
                    continue  # the license header
                fields = line.split(" | ")[0].split()
                src = fields[0] + "." + ("a" if fields[2] == "s" else fields[2])
                w = int(fields[3], 16)
                i = 4 + 2 * w
                for _ in range(int(fields[i])):
                    sym, off, p = fields[i + 1], fields[i + 2], fields[i + 3]
                    i += 4
                    rel = WN18_POINTERS.get(sym)
                    if rel:
                        dst = off + "." + ("a" if p == "s" else p)
                        if dst != src:
                            triples.add((src, rel, dst))
    triples = sorted(triples)
    if min_degree > 0:
        deg = {}
        for h, _, t in triples:
            deg[h] = deg.get(h, 0) + 1
            deg[t] = deg.get(t, 0) + 1
        triples = [x for x in triples if deg[x[0]] >= min_degree and deg[x[2]] >= min_degree]
    if max_triples and len(triples) > max_triples:
        triples = random.Random(seed).sample(triples, max_triples)
    ents, rels = {}, {}
    arr = np.array([(ents.setdefault(h, len(ents)), rels.setdefault(r, len(rels)),
                     ents.setdefault(t, len(ents))) for h, r, t in triples], dtype=np.int64)
    scale = len(arr) / WN18_COUNTS["triples"]
    nv = min(n_valid, int(n_valid * scale) + 1)
    nt = min(n_test, int(n_test * scale) + 1)
    train, valid, test = _split(arr, nv, nt, seed)
    return KG(list(ents), list(rels), train, valid, test, source="wordnet-3.0:" + dict_dir,
              notes={"min_degree": min_degree, "max_triples": max_triples})


def synthetic(num_entities=2000, num_relations=8, num_triples=20000, clusters=20, alpha=1.2,
              seed=0, held_out=0.05):
    """A graph with power-law degrees and structure to learn: entities fall into clusters,
    relation r sends cluster c to cluster perm_r(c), and inside a cluster entities are drawn
    with Zipf(alpha) popularity (a few hubs, a long tail)."""
    rng = np.random.default_rng(seed)
    cl = rng.integers(0, clusters, num_entities)
    members = [np.flatnonzero(cl == c) for c in range(clusters)]
    members = [m if len(m) else np.array([c % num_entities]) for c, m in enumerate(members)]
    pop = [1.0 / np.arange(1, len(m) + 1) ** alpha for m in members]
    pop = [p / p.sum() for p in pop]
    perms = [rng.permutation(clusters) for _ in range(num_relations)]
    r = rng.integers(0, num_relations, num_triples)
    h = np.empty(num_triples, np.int64)
    t = np.empty(num_triples, np.int64)
    hc = rng.integers(0, clusters, num_triples)
    for i in range(num_triples):
        c = hc[i]
        h[i] = rng.choice(members[c], p=pop[c])
        d = perms[r[i]][c]
        t[i] = rng.choice(members[d], p=pop[d])
    arr = np.unique(np.stack([h, r, t], 1), axis=0)
    n = max(1, int(len(arr) * held_out))
    train, valid, test = _split(arr, n, n, seed)
    return KG(["e%d" % i for i in range(num_entities)], ["r%d" % i for i in range(num_relations)],
              train, valid, test, source="synthetic",
              notes={"clusters": clusters, "alpha": alpha, "seed": seed})
