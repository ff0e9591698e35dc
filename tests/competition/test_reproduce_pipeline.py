"""`d500 reproduce` rebuilds a pipeline run's recipe from its record: the pipeline's schedule
(gpipe, 1f1b) is recorded under its own key, never over the recipe's learning-rate schedule,
whose name it then took (every pipeline run's reproduction failed: "unknown schedule '1f1b'")."""

from __future__ import annotations

from types import SimpleNamespace

from d500.competition.reproduce_prepare import rebuild
from d500.distributed import workloads
from d500.distributed.judge import hyperparameters
from d500.distributed.spec import parse
from d500.paths import examples, rulebook
from d500.training import submission


def record(entry, world: int) -> dict:
    """A run's hyperparameters as the level-3 judge records them."""
    spec = parse(entry.distributed, entry.path)
    order = SimpleNamespace(entry=entry, global_batch=entry.recipe.batch_size, spec=spec,
                            world_size=world)
    return hyperparameters(order)


def test_a_pipeline_runs_recipe_is_rebuilt_with_its_learning_rate_schedule():
    entry = submission.load(examples() / "pipeline-1f1b")
    wl = workloads.load(rulebook() / "3-distributed" / "digits-mlp.yaml")
    hyper = record(entry, 2)
    assert (hyper["schedule"], hyper["pipeline_schedule"]) == ("cosine", "1f1b")
    params = rebuild(entry, wl, SimpleNamespace(hyperparameters=hyper, world_size=2, level=3))
    assert entry.recipe_with(params).hyperparameters_logged()["schedule"] == "cosine"
    # a run recorded before the key: `schedule` held 1f1b over cosine; it still reproduces
    older = {k: v for k, v in hyper.items() if k != "pipeline_schedule"} | {"schedule": "1f1b"}
    params = rebuild(entry, wl, SimpleNamespace(hyperparameters=older, world_size=2, level=3))
    assert params["schedule.name"] == "cosine"
