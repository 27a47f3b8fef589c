"""A prompt's reward is a param: a built-in by name or a user's ``rewards.<module>:<function>`` from the repository's
``rewards/`` package, checked when params load (imported, probed), used by every stage that grades the prompt,
declared as those stages' dep and hashed into GRPO's resume fingerprint."""

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from reasonrl import rewards
from reasonrl.code_deps import import_closure, source_file
from reasonrl.config import ConfigError, EngineConfig, EvalConfig, GRPOConfig, load_params
from reasonrl.cot_filter import make_sft_pairs
from reasonrl.data import GSM8KExample
from reasonrl.expert_iteration import correct_pairs
from reasonrl.grading import question_only_reward_fn, r1_zero_reward_fn
from reasonrl.pipeline import CODE_FROM_TREE, read_pipeline
from reasonrl.presets import apply_to_file
from reasonrl.prompts import PROMPT_NAMES, REWARD_FNS
from reasonrl.rewards import RewardError, RewardSpecError, check_reward, prompt_reward, reward_fn
from reasonrl.rollouts.types import Sample
from reasonrl.sft import Pair

REPO = Path(__file__).resolve().parents[1]
TOLERANT = "rewards.tolerant:tolerant_reward"
GRADERS = {"baseline", "filter_cots", "sft", "expert_iteration", "grpo", "final_eval"}
"""The stages that grade responses, hence read ``rewards``."""
NEAR = " 3 * 100 = 301 </think> <answer> 301 </answer>"
"""Within 1% of 300: right for the tolerant reward only."""


def with_rewards(params_file: Path, **specs: str) -> Path:
    apply_to_file({f"rewards.{prompt}": spec for prompt, spec in specs.items()}, params_file)
    return params_file


def test_each_prompt_defaults_to_its_built_in_reward(params_file):
    assert load_params(params_file).rewards.specs == {name: name for name in PROMPT_NAMES}
    assert prompt_reward("r1_zero").__wrapped__ is r1_zero_reward_fn
    assert prompt_reward("question_only").__wrapped__ is question_only_reward_fn
    assert all(reward_fn(name) is REWARD_FNS[name] for name in PROMPT_NAMES)


def test_a_users_reward_grades_wherever_its_prompt_is_used(params_file, tiny_tokenizer):
    specs = load_params(with_rewards(params_file, r1_zero=TOLERANT)).rewards.specs
    assert specs == {"r1_zero": TOLERANT, "question_only": "question_only", "r1_zero_chat": "r1_zero_chat"}
    tolerant_reward = prompt_reward("r1_zero", specs)
    assert tolerant_reward.__wrapped__.__code__.co_filename == str(REPO / "rewards/tolerant.py")
    assert prompt_reward("question_only", specs).__wrapped__ is question_only_reward_fn
    assert tolerant_reward(NEAR, "300") == {"format_reward": 1.0, "answer_reward": 1.0, "reward": 1.0}
    assert r1_zero_reward_fn(NEAR, "300")["reward"] == 0.0
    # expert iteration's filter
    question = GSM8KExample("q", "", "300")
    samples = [[Sample(NEAR, [1], None, prompt_token_ids=[2], finish="stop_string")]]
    assert correct_pairs([question], ["p"], samples, prompt_reward("r1_zero", specs)) == ([Pair("p", NEAR)], 1)
    assert correct_pairs([question], ["p"], samples, prompt_reward("r1_zero")) == ([], 0)
    # the SFT filter grades the reference responses with it
    always_wrong = {"r1_zero": "rewards.tolerant:FORMAT_CREDIT"}  # refused by params; the filter trusts its caller
    example = GSM8KExample("q", "3 * 100 = <<3*100=300>>300", "300")
    assert make_sft_pairs([example], "r1_zero", tiny_tokenizer, specs)[0].drop_reason is None
    with pytest.raises(RewardSpecError, match="has no function FORMAT_CREDIT"):
        make_sft_pairs([example], "r1_zero", tiny_tokenizer, always_wrong)


def test_grpo_scores_rollouts_with_the_users_reward(params_file):
    """A GRPO step's draw grades its samples with the user's reward; the step's metrics read those grades."""
    from reasonrl.grpo import rollout_metrics
    from reasonrl.rollouts.drawing import draw_rollouts

    specs = load_params(with_rewards(params_file, r1_zero=TOLERANT)).rewards.specs
    config = GRPOConfig()
    wrong = " 3 * 100 = 350 </think> <answer> 350 </answer>"  # well-formed: the tolerant reward's partial credit
    texts = [NEAR, wrong] * (config.batching.group_size // 2)
    samples = [Sample(text, [1], None, prompt_token_ids=[2], finish="stop_string") for text in texts]

    class Engine:  # samples the texts above for the one question
        def tokenizer(self):
            return None

        def generate(self, prompts, n, **sampling):
            return [samples for _ in prompts]

    questions = [GSM8KExample("q", "", "300")]
    group_size = config.batching.group_size
    drawn = draw_rollouts(Engine(), questions, config, stop=[], step_seed=0, rewards=specs)
    mean = rollout_metrics(drawn, group_size, dynamic_sampling=False)["rollout/reward"]
    assert mean.total / mean.count == pytest.approx(0.55)
    built_in = draw_rollouts(Engine(), questions, config, stop=[], step_seed=0)
    assert rollout_metrics(built_in, group_size, dynamic_sampling=False)["rollout/reward"].total == 0.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("os.path:join", "module 'os.path' is no module of the repository's rewards/ package"),
        ("rewards:tolerant", "module 'rewards' is no module of the repository's rewards/ package"),
        ("tolerant", rf"'tolerant' is neither a built-in reward \({', '.join(REWARD_FNS)}, math_verify\) nor module:"),
        ("rewards.tolerant", "'rewards.tolerant' is neither a built-in reward"),
        ("rewards.missing:reward", "no module rewards.missing in "),
        ("rewards.tolerant:missing", "rewards.tolerant .*tolerant.py. has no function missing"),
        ("rewards.tolerant:RELATIVE_TOLERANCE", r"rewards.tolerant \(.*\) has no function RELATIVE_TOLERANCE"),
        ("rewards.tolerant:single_number", r"rewards.tolerant:single_number raised TypeError: .* on the probe \("),
    ],
)
def test_a_reward_that_cannot_grade_is_refused_when_params_load(params_file, spec, message):
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(params_file))}: rewards.r1_zero: {message}"):
        load_params(with_rewards(params_file, r1_zero=spec))


@pytest.fixture
def other_tree(tmp_path):
    """A second tree with its own rewards/ package, made the process's for the test (and the repository's after)."""
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards/__init__.py").write_text("")
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "rewards"}
    for name in saved:
        del sys.modules[name]
    yield tmp_path
    for name in [name for name in sys.modules if name.split(".")[0] == "rewards"]:
        del sys.modules[name]
    sys.modules.update(saved)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("return {'format_reward': 1.0, 'reward': 1.0}", "must return a dict of exactly format_reward, answer_reward"),
        ("return {'format_reward': 1.0, 'answer_reward': 1.0, 'reward': 1.0, 'answer': '4'}", "exactly"),
        ("return [1.0, 1.0, 1.0]", "must return a dict of exactly"),
        ("return {'format_reward': 1, 'answer_reward': 1, 'reward': 1}", "must return finite floats"),
        ("return {'format_reward': 1.0, 'answer_reward': True, 'reward': 1.0}", "must return finite floats"),
        ("return {'format_reward': 1.0, 'answer_reward': 1.0, 'reward': float('nan')}", "must return finite floats"),
        ("return {'format_reward': 1.0, 'answer_reward': 1.0, 'reward': 1.0 / len(response)}", "ZeroDivisionError"),
    ],
)
def test_a_reward_is_probed_for_the_contract(other_tree, body, message):
    (other_tree / "rewards/mine.py").write_text(f"def reward(response, ground_truth):\n    {body}\n")
    with pytest.raises(RewardSpecError, match=message):
        check_reward("rewards.mine:reward", other_tree)


NAN_FOR_LONG = """
def reward(response, ground_truth):
    score = float("nan") if len(response) > 200 else 1.0
    return {"format_reward": 1.0, "answer_reward": score, "reward": score}


def crashing(response, ground_truth):
    if len(response) > 200:
        raise OverflowError("too long")
    return reward(response, ground_truth)
"""


LONG_RESPONSE = "Let me think step by step. " * 20 + "</think> <answer> 4 </answer>"
"""Longer than any probe: a reward that passes the probes meets it first at run time (569 characters)."""


def test_a_reward_that_breaks_its_contract_at_run_time_is_named_with_the_response(other_tree):
    """It passes the probes; the first long response stops grading with the param and the response, where GRPO
    would otherwise blame NaN advantages on its learning rate."""
    from reasonrl.losses import compute_group_normalized_rewards

    (other_tree / "rewards/mine.py").write_text(NAN_FOR_LONG)
    check_reward("rewards.mine:reward", other_tree)
    reward = prompt_reward("r1_zero", {"r1_zero": "rewards.mine:reward"}, other_tree)
    long = LONG_RESPONSE
    message = (
        r"^rewards.r1_zero \(rewards.mine:reward\) must return finite floats; it returned .*nan.* on the response "
        r"'Let me think step by step\. .*' … '.*</answer>' \(569 characters\) with ground truth '4'$"
    )
    with pytest.raises(RewardError, match=message):
        compute_group_normalized_rewards(reward, ["short", long], ["4", "4"], 2, 1e-6, normalize_by_std=True)
    crashing = prompt_reward("r1_zero", {"r1_zero": "rewards.mine:crashing"}, other_tree)
    with pytest.raises(
        RewardError, match=r"^rewards.r1_zero \(rewards.mine:crashing\) raised OverflowError: too long on the response"
    ):
        crashing(long, "4")


HANGING = """
import time


def sleeps(response, ground_truth):
    time.sleep(3600)


def hangs_on_long(response, ground_truth):
    if len(response) > 200:
        time.sleep(3600)
    return {"format_reward": 1.0, "answer_reward": 1.0, "reward": 1.0}


def swallows(response, ground_truth):
    try:
        time.sleep(3600)
    except BaseException:
        pass
    return {"format_reward": 0.0, "answer_reward": 0.0, "reward": 0.0}
"""
BOUND = 0.5
"""Seconds a user's reward may take in these tests (``reasonrl.rewards.REWARD_SECONDS``)."""


def test_a_reward_that_never_returns_is_refused_when_params_load_within_its_bound(other_tree, monkeypatch):
    """The probes run it within the bound: params load names it, where the stage used to wait forever, silently."""
    monkeypatch.setattr(rewards, "REWARD_SECONDS", BOUND)
    (other_tree / "rewards/mine.py").write_text(HANGING)
    started = time.monotonic()
    message = r"^rewards.mine:sleeps did not return within 0.5 s on the probe \('2 \+ 2 = 4 </think> <answer> 4"
    with pytest.raises(RewardSpecError, match=message):
        check_reward("rewards.mine:sleeps", other_tree)
    assert time.monotonic() - started < BOUND + 1.0


def test_a_reward_that_hangs_on_a_response_stops_grading_naming_it_and_the_response(other_tree, monkeypatch):
    """It passes the probes (short responses) and hangs on a long one: grading stops within the bound with the param,
    the function and the response; one that swallows the timeout and returns is stopped all the same. The timer and
    the signal's handler are as they were after each call, and the bounded reward goes on grading."""
    from reasonrl.losses import compute_group_normalized_rewards

    monkeypatch.setattr(rewards, "REWARD_SECONDS", BOUND)
    (other_tree / "rewards/mine.py").write_text(HANGING)
    handler = signal.getsignal(signal.SIGALRM)
    check_reward("rewards.mine:hangs_on_long", other_tree)
    reward = prompt_reward("r1_zero", {"r1_zero": "rewards.mine:hangs_on_long"}, other_tree)
    long = LONG_RESPONSE
    message = (
        r"^rewards.r1_zero \(rewards.mine:hangs_on_long\) did not return within 0.5 s on the response "
        r"'Let me think step by step\. .*' … '.*</answer>' \(569 characters\) with ground truth '4'$"
    )
    started = time.monotonic()
    with pytest.raises(RewardError, match=message):
        compute_group_normalized_rewards(reward, ["short", long], ["4", "4"], 2, 1e-6, normalize_by_std=True)
    assert time.monotonic() - started < BOUND + 1.0
    swallows = prompt_reward("r1_zero", {"r1_zero": "rewards.mine:swallows"}, other_tree)
    with pytest.raises(RewardError, match=r"\(rewards.mine:swallows\) did not return within 0.5 s on the response 'x'"):
        swallows("x", "4")
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert reward("short", "4")["reward"] == 1.0


WITH_INFO = """
from reasonrl.grading import r1_zero_reward_fn

BUFFER = 4
SEEN = []


def soft_overlong(response, ground_truth, info):
    \"\"\"DAPO's soft overlong punishment written by a user: the grade where a stage measures (info None).\"\"\"
    grade = r1_zero_reward_fn(response, ground_truth)
    if info is None:
        return grade
    penalty = min(-(info.tokens - (info.max_tokens - BUFFER)) / BUFFER * 1.0, 0.0)
    return {**grade, "reward": grade["reward"] + penalty}


def any_keywords(response, ground_truth, **keywords):
    SEEN.append(keywords)
    return {"format_reward": 1.0, "answer_reward": 1.0, "reward": 1.0}


def needs_info(response, ground_truth, info):
    return {"format_reward": 1.0, "answer_reward": 1.0, "reward": float(info.tokens)}
"""


def test_a_reward_that_takes_info_sees_each_rollouts_tokens_and_truncation(other_tree):
    """GRPO's draw passes each sample's token count (a final EOS counted), truncation and budget to a reward that
    takes ``info`` (a parameter or ``**kwargs``): a user's DAPO punishment then equals the built-in
    ``grpo.overlong_penalty``. A measuring stage calls it with None; a reward without the keyword is called as
    before; one that cannot grade without info is refused by the probes."""
    from reasonrl.losses import overlong_penalties
    from reasonrl.rewards import ResponseInfo, takes_info
    from reasonrl.rollouts.drawing import score_samples

    (other_tree / "rewards/mine.py").write_text(WITH_INFO)
    right = " 2 + 2 = 4 </think> <answer> 4 </answer>"
    samples = [Sample(right, [7] * (length - 1) + [0], None, [2], "eos") for length in (3, 4, 5, 6, 7)] + [
        Sample(right, [7] * 8, None, [2], "length")
    ]
    questions = [GSM8KExample("q", "", "4")]
    check_reward("rewards.mine:soft_overlong", other_tree)
    shaped = prompt_reward("r1_zero", {"r1_zero": "rewards.mine:soft_overlong"}, other_tree)
    rewards = [score["reward"] for score in score_samples(questions, samples, len(samples), shaped, max_tokens=8)]
    assert rewards == [1.0 + penalty for penalty in overlong_penalties([3, 4, 5, 6, 7, 8], 8, 4, 1.0)]
    assert rewards == [1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    assert shaped(right, "4")["reward"] == 1.0  # evaluation, the SFT filter, expert iteration: info None

    keywords = prompt_reward("r1_zero", {"r1_zero": "rewards.mine:any_keywords"}, other_tree)
    score_samples(questions, samples[-1:], 1, keywords, max_tokens=8)
    keywords(right, "4")
    seen = sys.modules["rewards.mine"].SEEN
    assert seen[-2:] == [{"info": ResponseInfo(tokens=8, truncated=True, max_tokens=8)}, {"info": None}]

    assert not takes_info(r1_zero_reward_fn)  # without the keyword: called as before, info or not
    built_in = prompt_reward("r1_zero")
    assert built_in(right, "4", info=ResponseInfo(3, False, 8)) == built_in(right, "4") == r1_zero_reward_fn(right, "4")
    with pytest.raises(RewardSpecError, match=r"needs_info raised AttributeError: .* on the probe \(.*, info=None\)"):
        check_reward("rewards.mine:needs_info", other_tree)


def test_a_module_that_fails_to_import_is_refused_by_its_error(other_tree):
    (other_tree / "rewards/mine.py").write_text("import not_installed_anywhere\n")
    with pytest.raises(RewardSpecError, match="importing rewards.mine failed: ModuleNotFoundError: No module named"):
        reward_fn("rewards.mine:reward", other_tree)
    with pytest.raises(RewardSpecError, match="already imported another rewards package"):
        reward_fn(TOLERANT)  # one process, one tree's rewards


PROBE = f"from reasonrl.rewards import reward_fn; print(reward_fn({TOLERANT!r}).__code__.co_filename)"


def test_a_stage_grades_with_the_rewards_of_the_tree_it_runs_in(tmp_path):
    """As DVC runs a queued experiment in a copy of the repository: the copy's rewards/, even with another checkout's
    package first on sys.path (as with ``python -m`` from that checkout)."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "src/reasonrl", tmp_path / "src/reasonrl", ignore=ignore)
    shutil.copytree(REPO / "rewards", tmp_path / "rewards", ignore=ignore)
    command = f"{CODE_FROM_TREE}{sys.executable} -c {PROBE!r}"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"src:{REPO}"}  # the checkout after the copy's src, as python -m
    result = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == str(tmp_path / "rewards/tolerant.py")


@pytest.fixture
def tree(tmp_path):
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("stages", "src/reasonrl", "rewards"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=ignore)
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text("{}")
    return tmp_path


def grpo_fingerprint(tree: Path, spec: str) -> str:
    from reasonrl.data import examples_digest
    from reasonrl.training.checkpoints import fingerprint

    rewards = {"r1_zero": spec, "question_only": "question_only"}
    data = {"train": examples_digest([]), "val": examples_digest([])}
    return fingerprint(
        "grpo", GRPOConfig(), EvalConfig(), EngineConfig(), tree / "model", data,
        tree / "stages/grpo.py", "cpu", rewards, source=tree / "src",
    )  # fmt: skip


def test_the_grpo_fingerprint_holds_the_reward_and_its_code(tree):
    """An edited user reward never resumes a checkpoint it did not grade; with a built-in, rewards/ is no input."""
    builtin, user = grpo_fingerprint(tree, "r1_zero"), grpo_fingerprint(tree, TOLERANT)
    assert builtin != user
    with (tree / "rewards/tolerant.py").open("a") as stream:
        stream.write("\nFORMAT_CREDIT = 0.2\n")
    assert grpo_fingerprint(tree, TOLERANT) != user
    assert grpo_fingerprint(tree, "r1_zero") == builtin


def test_the_stages_that_grade_depend_on_the_rewards_package_and_params(full_scale_params):
    stages = read_pipeline(REPO / "dvc.yaml", yaml.safe_load(full_scale_params))
    assert {name for name, stage in stages.items() if "rewards" in stage.deps} == GRADERS
    read = {name: {p for p in stage.params if p.split(".")[0] == "rewards"} for name, stage in stages.items()}
    # Each grades the prompt a param names (sft.prompt, ei.prompt, grpo.prompt, …): the whole section.
    assert {name: params for name, params in read.items() if params} == {name: {"rewards"} for name in GRADERS}
    # The example's own imports of reasonrl are deps of every stage that may run it.
    needed = {
        source_file(module).relative_to(REPO).as_posix() for module in import_closure(REPO / "rewards/tolerant.py")
    }
    assert needed == {"src/reasonrl/__init__.py", "src/reasonrl/grading.py"}
    assert all(needed <= set(stages[name].deps) for name in GRADERS)


def test_a_models_card_names_the_users_reward(params_file, tmp_path):
    from reasonrl.model_card import Provenance, render_card
    from reasonrl.training.best import BestCheckpoint

    committed = load_params(params_file)
    params = load_params(with_rewards(params_file, r1_zero=TOLERANT))
    card = render_card(
        params, "sft", "the final policy", BestCheckpoint(), "step", Provenance("abc", committed, "", {}, (), {})
    )
    assert f"| `rewards.r1_zero` | `{TOLERANT}` | `r1_zero` |" in card
    assert f"reasonrl graded it with the reward `{TOLERANT}` (`rewards.r1_zero`)" in card
