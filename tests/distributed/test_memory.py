"""memory_per_rank from the ranks' claims (d500.distributed.figures.held_memory): the most one rank
holds, recorded only where the claims fit the judge's model; a rank that runs an entry's code and
claims to hold less than the parameters, or gradients that do not cover the model, is not
believed (the attack: an entry patching its scheme's memory() to look lean)."""

from __future__ import annotations

from d500.distributed.figures import RankStats, aggregate, held_memory

B = 1000  # the judge's model: parameter bytes


def ranks(*claims: tuple[float, float, float]) -> list[RankStats]:
    out = []
    for i, (p, g, o) in enumerate(claims):
        r = RankStats(i, "host", 100 + i, steps=1)
        r.scheme = {"param_bytes": p, "grad_bytes": g, "optimizer_bytes": o}
        out.append(r)
    return out


def test_the_most_any_rank_holds_where_the_claims_fit_the_model():
    replicated = ranks((B, B, 2 * B), (B, B, 2 * B))
    assert aggregate(replicated, B)["memory_per_rank"] == 4 * B
    zero2 = ranks((B, 600, 1200), (B, 400, 800))  # uneven whole-tensor blocks
    assert held_memory(zero2, B) == B + 600 + 1200


def test_claims_that_do_not_fit_the_model_are_not_recorded():
    assert held_memory(ranks((0, 0, 0), (0, 0, 0)), B) is None  # "we hold nothing"
    assert held_memory(ranks((B, 100, 0), (B, 100, 0)), B) is None  # gradients do not cover B
    assert held_memory(ranks((B, 2 * B, 0), (B, 0, 0)), B) is None  # more than one gradient
    assert held_memory(ranks((B, B, -5), (B, B, 0)), B) is None
    silent = ranks((B, B, 0), (B, B, 0))
    silent[1].scheme = {}  # a rank that said nothing (ddp)
    assert held_memory(silent, B) is None and "memory_per_rank" not in aggregate(silent, B)


def test_the_stalest_gradient_is_the_servers():
    served = ranks((B, B, 0), (B, B, 0))
    served[0].scheme["staleness_max"] = 2.0
    assert aggregate(served, B)["staleness_max"] == 2.0
    assert "staleness_max" not in aggregate(ranks((B, B, 0), (B, B, 0)), B)
