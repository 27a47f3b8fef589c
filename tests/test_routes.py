"""reasonrl.routes is what dvc.yaml spells out: final_eval evaluates each route's model under the route's name, each
trained route's stage writes that model and its reports, starts from the model its ``init_model`` names and is
evaluated with its prompt."""

from pathlib import Path

import pytest
import yaml

from reasonrl.config import Params, from_dict
from reasonrl.pipeline import read_pipeline
from reasonrl.routes import ROUTE, ROUTES, TRAINED_ROUTES, evaluation_prompt, prompt_param, start_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stages(full_scale_params):
    return read_pipeline(REPO / "dvc.yaml", yaml.safe_load(full_scale_params))


def test_final_eval_evaluates_each_routes_model_under_its_name(stages):
    words = stages["final_eval"].cmd.split()
    models = [words[i + 1] for i, word in enumerate(words) if word == "--model"]
    assert models == [f"{name}={route.model_dir}" for name, route in ROUTE.items()]
    assert [name for name, route in ROUTE.items() if route.stage is None] == ["base"]
    assert TRAINED_ROUTES == ("sft", "ei", "grpo") and ROUTES == ("base", *TRAINED_ROUTES)


@pytest.mark.parametrize("name", TRAINED_ROUTES)
def test_each_trained_routes_stage_writes_its_model_and_reports(stages, name):
    route = ROUTE[name]
    stage = stages[route.stage]
    assert any(route.model_dir == out or route.model_dir.startswith(f"{out}/") for out in stage.outs), stage.outs
    assert f"reports/{route.reports_dir}/metrics.json" in stage.outs
    assert f"reports/{route.reports_dir}/live" in stage.outs
    assert name in stage.params  # its params section, which its model card lists


def test_each_trained_route_starts_from_the_model_its_stage_depends_on(full_scale_params):
    raw = yaml.safe_load(full_scale_params)
    raw["ei"]["init_model"], raw["grpo"]["init_model"] = "sft", "ei"
    params = from_dict(Params, raw)
    starts = {name: start_model(params, name) for name in TRAINED_ROUTES}
    assert starts == {"sft": "base", "ei": "sft", "grpo": "ei"}
    stages = read_pipeline(REPO / "dvc.yaml", raw)
    for name, start in starts.items():
        assert ROUTE[start].model_dir.startswith(f"models/{start}")
        assert f"models/{start}" in stages[ROUTE[name].stage].deps


def test_each_route_is_evaluated_with_its_prompt(stages):
    params = from_dict(Params, {"sft": {"prompt": "r1_zero_chat"}, "grpo": {"prompt": "question_only"}})
    prompts = {name: evaluation_prompt(params, name) for name in ROUTES}
    assert prompts == {"base": "r1_zero_chat", "sft": "r1_zero_chat", "ei": "r1_zero", "grpo": "question_only"}
    assert [prompt_param(name) for name in ROUTES] == ["sft.prompt", "sft.prompt", "ei.prompt", "grpo.prompt"]
    assert {prompt_param(name) for name in ROUTES} <= set(stages["final_eval"].params)
