# SPDX-License-Identifier: MIT
"""The KGE example (python/examples/kge): data sources, and a short 2-process ComplEx run
whose filtered MRR beats a random ranking by a wide margin."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
KGE = os.path.join(HERE, "..", "examples", "kge")
sys.path.insert(0, KGE)
import kgedata  # noqa: E402


def test_tsv_roundtrip(tmp_path):
    kg = kgedata.synthetic(num_entities=50, num_relations=3, num_triples=400, clusters=5)
    kg.save_tsv(tmp_path)
    back = kgedata.load_tsv(str(tmp_path))
    for k in ("relations", "train", "valid", "test"):
        assert back.counts()[k] == kg.counts()[k]
    assert back.num_entities <= kg.num_entities  # entities in no triple are not in a TSV
    names = lambda g, a: {(g.entities[h], g.relations[r], g.entities[t]) for h, r, t in a}  # noqa
    assert names(back, back.test) == names(kg, kg.test)
    (tmp_path / "bad").mkdir()
    for n in ("train", "valid", "test"):
        (tmp_path / "bad" / (n + ".txt")).write_text("a\tb\n")
    with pytest.raises(ValueError, match="want head<TAB>relation<TAB>tail"):
        kgedata.load_tsv(str(tmp_path / "bad"))


def test_synthetic_is_power_law():
    kg = kgedata.synthetic(num_entities=1000, num_triples=10000, seed=1)
    deg = np.bincount(np.concatenate([kg.train[:, 0], kg.train[:, 2]]), minlength=1000)
    deg = np.sort(deg)[::-1]
    assert deg[:10].sum() > 10 * deg[500:510].sum()  # hubs and a long tail
    held = np.concatenate([kg.valid, kg.test])
    seen = set(kg.train[:, 0]) | set(kg.train[:, 2])
    assert all(h in seen and t in seen for h, _, t in held)


@pytest.mark.skipif(not os.path.exists("/usr/share/wordnet/data.noun"),
                    reason="wordnet-base not installed (bash ci/deps.sh python)")
def test_wordnet_has_wn18_relations():
    kg = kgedata.wordnet(max_triples=20000)
    assert kg.num_relations == 18
    assert set(kg.relations) == set(kgedata.WN18_POINTERS.values())


def test_kge_two_processes_beats_random(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "kge.json"
    cmd = [sys.executable, os.path.join(KGE, "train.py"), "--data", "synth", "--local", "2",
           "--synth-entities", "1000", "--synth-triples", "10000", "--epochs", "8",
           "--placement", "dynamic", "--json", str(out)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout
    rep = json.loads(out.read_text())
    ev = rep["eval"]
    assert ev["mrr"] > 10 * ev["random_mrr"], ev
    assert ev["hits10"] > 0.1, ev
    assert rep["epochs"][-1]["loss"] < 0.5 * rep["epochs"][0]["loss"]
    assert sum(e["relocations_in"] for e in rep["epochs"]) > 0  # dynamic: rows moved
    for e in rep["epochs"]:  # rank 0's epoch by part adds up, each part measured
        parts = ("pull_seconds", "push_seconds", "torch_seconds", "localize_post_seconds",
                 "localize_wait_seconds", "other_seconds")
        assert abs(sum(e[k] for k in parts) - e["node_seconds"]) < 1e-6, e
        assert all(e[k] > 0 for k in parts[:5]) and e["other_seconds"] >= -1e-6, e


def test_relation_partition_is_balanced():
    """--partition relation: every relation trained by one node, the shares balanced."""
    pytest.importorskip("torch")
    import train
    kg = kgedata.synthetic(num_entities=500, num_relations=12, num_triples=6000, seed=3)
    for world in (2, 3, 4):
        owner = train.relation_owners(kg.train, kg.num_relations, world)
        assert owner.shape == (kg.num_relations,) and set(owner) <= set(range(world))
        share = np.bincount(owner[kg.train[:, 1]], minlength=world)
        count = np.bincount(kg.train[:, 1], minlength=kg.num_relations)
        # greedy, largest first: no share above the ideal by more than the largest relation
        assert share.sum() == len(kg.train)
        assert share.max() <= len(kg.train) / world + count.max(), (share, count)
        assert share.min() > 0


@pytest.mark.parametrize("name", ["complex", "rescal"])
def test_model_scores_agree(name):
    """score() on (batch), on (batch, k) broadcasts, and score_tails / score_heads against
    every entity give the same numbers for the same triples."""
    torch = pytest.importorskip("torch")
    import train
    m = train.MODELS[name](4)
    g = torch.Generator().manual_seed(0)
    E = torch.randn(7, m.ent_len, generator=g)
    R = torch.randn(3, m.rel_len, generator=g)
    h, r, t = torch.tensor([0, 5]), torch.tensor([2, 1]), torch.tensor([3, 6])
    s = m.score(E[h], R[r], E[t])
    assert s.shape == (2,)
    tails = m.score_tails(E[h], R[r], E)
    heads = m.score_heads(E[t], R[r], E)
    torch.testing.assert_close(tails[torch.arange(2), t], s)
    torch.testing.assert_close(heads[torch.arange(2), h], s)
    k = torch.tensor([[1, 2, 3], [4, 5, 6]])  # corrupted tails, broadcast over k
    nt = m.score(E[h].unsqueeze(1), R[r].unsqueeze(1), E[k])
    assert nt.shape == (2, 3)
    torch.testing.assert_close(nt, tails.gather(1, k))
    nh = m.score(E[k], R[r].unsqueeze(1), E[t].unsqueeze(1))
    torch.testing.assert_close(nh, heads.gather(1, k))
