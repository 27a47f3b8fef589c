"""Issue 33, named protocols: final_eval runs every held-out set under the unnamed protocol of ``eval.*`` and under
each of ``eval.protocols``, and files each result by protocol in ``reports/final/metrics.json``."""

import json
from types import SimpleNamespace

import pytest
import yaml

from reasonrl.config import ConfigError, load_params
from reasonrl.cost import Tokens
from reasonrl.data import GSM8KExample
from reasonrl.evaluation import EvalResult, evaluate_checkpoints
from reasonrl.prompts import BOXED, answer_text_fn, vote_answer_fn
from reasonrl.protocols import (
    BENCHMARK_SETS,
    TEST,
    TEST_SETS,
    Slot,
    add_all_paired_comparisons,
    final_tasks,
    protocol_summaries,
    route_summaries,
)
from reasonrl.rewards import MATH_VERIFY
from reasonrl.rollouts.types import Sample

PROTOCOLS = {"greedy": {"temperature": 0}, "avg4": {"temperature": 0.6, "top_p": 0.95, "samples": 4}}
RIGHT, WRONG = "ok </think> <answer> 3 </answer>", "hm </think> <answer> 4 </answer>"


def load(tmp_path, full_scale_params, **eval_params):
    tree = yaml.safe_load(full_scale_params)
    tree["eval"] |= eval_params
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return load_params(path)


def example(answer: str = "3") -> GSM8KExample:
    return GSM8KExample("What is 1 + 2?", "", answer)


def test_every_set_is_a_task_under_each_protocol_with_its_sampling(tmp_path, full_scale_params):
    params = load(tmp_path, full_scale_params, protocols=PROTOCOLS, benchmarks=["aime24", "math500"])
    tasks = final_tasks(params, [example()], {}, {"aime24": [example()], "math500": [example()]})
    assert list(tasks) == [
        Slot(protocol, kind, name)
        for protocol in (None, "greedy", "avg4")
        for kind, name in ((TEST, None), (BENCHMARK_SETS, "aime24"), (BENCHMARK_SETS, "math500"))
    ]
    unnamed, greedy, avg4 = (tasks[Slot(p, TEST)].config for p in (None, "greedy", "avg4"))
    assert (unnamed.temperature, unnamed.top_p, unnamed.samples_per_question) == (1.0, 1.0, 1)  # eval.*
    assert (greedy.temperature, greedy.top_p, greedy.samples_per_question) == (0.0, 1.0, 1)
    assert (avg4.temperature, avg4.top_p, avg4.samples_per_question) == (0.6, 0.95, 4)
    assert avg4.max_tokens == unnamed.max_tokens and avg4.stop == unnamed.stop  # the rest is eval.*'s
    # MATH-500's LaTeX answers are graded by math-verify, AIME's numbers by the prompt's own reward
    assert tasks[Slot("greedy", BENCHMARK_SETS, "math500")].rewards["r1_zero"] == MATH_VERIFY
    assert tasks[Slot("greedy", BENCHMARK_SETS, "aime24")].rewards["r1_zero"] == "r1_zero"
    assert Slot("avg4", BENCHMARK_SETS, "math500").directory == "protocols/avg4/benchmarks/math500"
    assert Slot(None, TEST_SETS, "shifted").directory == "test_sets/shifted" and Slot(None, TEST).directory == ""


@pytest.mark.parametrize(
    ("protocols", "message"),
    [
        ({"avg16": {"temperature": 0, "samples": 16}}, "eval.protocols.avg16.samples: 16 samples at temperature 0"),
        ({"hot": {"temperature": -0.5}}, "eval.protocols.hot.temperature: must be ≥ 0"),
        ({"narrow": {"top_p": 0}}, r"eval.protocols.narrow.top_p: must be in \(0, 1\]"),
        ({"none": {"samples": 0}}, "eval.protocols.none.samples: must be ≥ 1"),
        ({"a b": {}}, "eval.protocols.a b: a protocol's name must be letters"),
        ({"greedy": {"temprature": 0}}, "eval.protocols.greedy.temprature: unknown parameter"),
        ({"greedy": 0}, "eval.protocols.greedy: must be a mapping"),
    ],
)
def test_a_bad_protocol_is_refused_naming_its_param(tmp_path, full_scale_params, protocols, message):
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, full_scale_params, protocols=protocols)


class Engine:
    """Answers right at temperature 0 and wrong otherwise, so that each protocol's sampling shows in its results."""

    def __init__(self):
        self.calls = []
        self.config = SimpleNamespace(dtype="float32")

    def policy_device(self):
        return "cpu"

    def sync_weights(self, model):
        self.calls.append("load")

    def tokenizer(self):
        return None

    def generate(self, prompts, n, temperature, top_p, seed, **sampling):
        self.calls.append((len(prompts), n, temperature, top_p, seed))
        text = RIGHT if temperature == 0 else WRONG
        return [[Sample(text, [1], None, prompt_token_ids=[2], finish="stop_string")] * n for _ in prompts]


def test_each_model_is_loaded_once_and_each_protocol_samples_as_it_says(tmp_path, full_scale_params, tiny_model_dir):
    params = load(tmp_path, full_scale_params, protocols=PROTOCOLS, benchmarks=["aime24"])
    tasks = final_tasks(params, [example(), example()], {}, {"aime24": [example()]})
    engine = Engine()
    models = {"base": tiny_model_dir, "sft": tiny_model_dir}
    results = evaluate_checkpoints(engine, models, tasks, {"base": "r1_zero", "sft": "r1_zero"}, seed=7)
    assert engine.calls.count("load") == 2  # not once per task
    assert [call for call in engine.calls if call != "load"][:6] == [
        (2, 1, 1.0, 1.0, 7), (1, 1, 1.0, 1.0, 7), (2, 1, 0.0, 1.0, 7), (1, 1, 0.0, 1.0, 7),
        (2, 4, 0.6, 0.95, 7), (1, 4, 0.6, 0.95, 7),
    ]  # fmt: skip
    assert results[Slot("greedy", TEST)]["sft"].metrics["accuracy"] == 1.0
    avg4 = results[Slot("avg4", BENCHMARK_SETS, "aime24")]["sft"].metrics
    assert avg4["accuracy"] == 0.0 and avg4["n"] == 4 and avg4["samples_per_question"] == 4
    assert set(avg4["pass_at_k"]) == {"1", "2", "4"} and avg4["majority_accuracy"] == 0.0
    assert avg4["accuracy_interval"]["method"] == "wilson_clustered_by_question"


def summary(rewards: list[float], samples: int = 1) -> EvalResult:
    records = [{"question_index": i // samples, "reward": r} for i, r in enumerate(rewards)]
    return EvalResult({"accuracy": sum(rewards) / len(rewards)}, records, Tokens())


def test_results_are_filed_by_protocol_and_paired_in_each(tmp_path, full_scale_params):
    params = load(tmp_path, full_scale_params, protocols={"greedy": {"temperature": 0}}, benchmarks=["svamp"])
    results = {
        Slot(protocol, kind, name): {"base": summary([0, 0, 1, 0]), "sft": summary([1, 1, 1, 0])}
        for protocol in (None, "greedy")
        for kind, name in ((TEST, None), (BENCHMARK_SETS, "svamp"))
    }
    add_all_paired_comparisons(results, {"sft": "base"})
    final = json.loads(json.dumps(route_summaries(results, params)))  # as the stage writes it
    sft = final["sft"]
    assert sft["accuracy"] == 0.75 and sft["paired"]["reference"] == "base"
    assert sft["benchmarks"]["svamp"]["paired"]["only_this_right"] == 2
    greedy = sft["protocols"]["greedy"]
    assert greedy["protocol"] == {"temperature": 0.0, "top_p": 1.0, "samples": 1}
    assert greedy["accuracy"] == 0.75 and greedy["paired"]["p_value"] == 0.5
    assert greedy["benchmarks"]["svamp"]["paired"]["only_reference_right"] == 0
    by_protocol = protocol_summaries(final)
    assert list(by_protocol) == [None, "greedy"] and by_protocol["greedy"]["base"]["accuracy"] == 0.25


def test_benchmark_questions_asks_each_benchmarks_first_questions_only(tmp_path, full_scale_params):
    params = load(tmp_path, full_scale_params, benchmarks=["aime24"], benchmark_questions=2)
    tasks = final_tasks(params, [example()] * 5, {}, {"aime24": [example(str(n)) for n in range(5)]})
    assert [e.answer for e in tasks[Slot(None, BENCHMARK_SETS, "aime24")].examples] == ["0", "1"]
    assert len(tasks[Slot(None, TEST)].examples) == 5  # the test split stays whole
    with pytest.raises(ConfigError, match="eval.benchmark_questions: must be ≥ 1 or null, got 0"):
        load(tmp_path, full_scale_params, benchmark_questions=0)


def test_without_protocols_or_benchmarks_a_route_is_its_test_summary_as_before(tmp_path, full_scale_params):
    params = load(tmp_path, full_scale_params)
    results = {Slot(None, TEST): {"base": summary([0, 1]), "sft": summary([1, 1])}}
    assert route_summaries(results, params) == {"base": {"accuracy": 0.5}, "sft": {"accuracy": 1.0}}
    assert list(final_tasks(params, [example()], {}, {})) == [Slot(None, TEST)]


PI = "The angle is \\boxed{\\frac{\\pi}{2}}"
PAIR = "In polar form: \\boxed{(3, \\frac{\\pi}{2})}"


def test_a_boxed_extraction_reads_the_box_inside_the_answer_block_else_the_prompts_own_reading():
    r1_zero, question_only = answer_text_fn("r1_zero", BOXED), answer_text_fn("question_only", BOXED)
    assert r1_zero(f"so </think> <answer> {PI} </answer>") == "\\frac{\\pi}{2}"
    assert answer_text_fn("r1_zero")(f"so </think> <answer> {PI} </answer>") == PI
    assert r1_zero("so </think> <answer> (3, \\frac{\\pi}{2}) </answer>") == "(3, \\frac{\\pi}{2})"  # no box: the block
    assert r1_zero(f"so {PI}, no answer block") is None  # the format's answer is the block
    assert question_only(f"so {PI}.") == answer_text_fn("question_only")(f"so {PI}.") == "\\frac{\\pi}{2}"
    assert vote_answer_fn("r1_zero", BOXED)(f"</think> <answer> {PI.replace('pi}', 'pi }')} </answer>") == (
        "\\frac{\\pi}{2}"
    )
    assert vote_answer_fn("r1_zero")(f"</think> <answer> {PAIR} </answer>") is None  # no single number to count
    assert vote_answer_fn("r1_zero", BOXED)(f"</think> <answer> {PAIR} </answer>") == "(3,\\frac{\\pi}{2})"


def test_a_latex_benchmark_is_graded_and_voted_on_its_boxed_answers_with_each_routes_own_prompt(
    tmp_path, full_scale_params, tiny_model_dir
):
    """MATH-500 declares the boxed extraction: each route answers with the prompt it trained with; math-verify
    grades the boxed LaTeX and the majority vote counts it (the prompts' number reading finds no single number in a
    pair, so no vote)."""

    class BoxingEngine(Engine):
        def generate(self, prompts, n, temperature, top_p, seed, **sampling):
            texts = [f"so </think> <answer> {PAIR} </answer>", f"so {PAIR}."]
            return [[Sample(texts[i % 2], [1], None, prompt_token_ids=[2], finish="stop_string") for i in range(n)]
                    for _ in prompts]  # fmt: skip

    params = load(tmp_path, full_scale_params, protocols={"avg2": {"temperature": 0.6, "samples": 2}},
                  benchmarks=["math500"])  # fmt: skip
    pair = GSM8KExample("Convert (0,3) to polar coordinates.", "", "\\left( 3, \\frac{\\pi}{2} \\right)")
    tasks = final_tasks(params, [example()], {}, {"math500": [pair]})
    assert tasks[Slot("avg2", BENCHMARK_SETS, "math500")].extraction == BOXED
    prompts = {"sft": "r1_zero", "grpo": "question_only"}
    models = dict.fromkeys(prompts, tiny_model_dir)
    results = evaluate_checkpoints(BoxingEngine(), models, tasks, prompts, seed=0)
    by_route = results[Slot("avg2", BENCHMARK_SETS, "math500")]
    sft, grpo = by_route["sft"], by_route["grpo"]
    assert "<think>" in sft.records[0]["prompt"] and "<think>" not in grpo.records[0]["prompt"]
    assert [r["reward"] for r in sft.records] == [1.0, 0.0]  # the second breaks r1_zero's format
    assert [r["reward"] for r in grpo.records] == [1.0, 1.0]  # question_only reads the last box of either
    assert sft.metrics["majority_accuracy"] == grpo.metrics["majority_accuracy"] == 1.0
    assert [r["answer"] for r in grpo.records] == ["(3,\\frac{\\pi}{2})"] * 2
