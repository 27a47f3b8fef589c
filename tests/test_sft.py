"""SFT and expert iteration on the tiny model: the loss falls, targets gain probability, EI keeps only correct."""

import pytest
import torch

from reasonrl import get_response_log_probs, tokenize_prompt_and_output
from reasonrl.batching import sequence_lengths, split_microbatches
from reasonrl.config import EIConfig, SFTConfig
from reasonrl.cost import CostLedger, Tokens
from reasonrl.data import GSM8KExample
from reasonrl.expert_iteration import correct_pairs
from reasonrl.grading import r1_zero_reward_fn
from reasonrl.rollouts.types import Sample
from reasonrl.sft import Pair, sft_schedule, sft_steps
from reasonrl.training.optimizer import make_optimizer

PAIRS = [
    Pair(
        "User: Tom has 3 cards and gets 4 more. How many?\nAssistant: <think>",
        " 3 + 4 = 7 </think> <answer> 7 </answer>",
    ),
    Pair("User: Ann has 9 pens and loses 2. How many?\nAssistant: <think>", " 9 - 2 = 7 </think> <answer> 7 </answer>"),
    Pair("User: 5 boxes of 6 eggs. How many eggs?\nAssistant: <think>", " 5 * 6 = 30 </think> <answer> 30 </answer>"),
    Pair("User: 8 apples shared by 2. How many each?\nAssistant: <think>", " 8 / 2 = 4 </think> <answer> 4 </answer>"),
]


def target_log_prob(policy, tokenizer) -> float:
    batch = tokenize_prompt_and_output([p.prompt for p in PAIRS], [p.response for p in PAIRS], tokenizer)
    with torch.no_grad():
        log_probs = get_response_log_probs(policy, batch["input_ids"], batch["labels"])["log_probs"]
    return (log_probs * batch["response_mask"]).sum().item()


def test_sft_lowers_loss_and_raises_target_log_prob(tiny_model_dir):
    from reasonrl.training.policy import load_policy

    policy, tokenizer = load_policy(tiny_model_dir, torch.device("cpu"))
    config = SFTConfig(learning_rate=3e-3, warmup_ratio=0.0, batch_size=4, microbatch_size=2, epochs=30)
    before = target_log_prob(policy, tokenizer)
    optimizer, schedule = make_optimizer(policy, config.optimizer), sft_schedule(config, total_steps=30)
    ledger = CostLedger()
    metrics = list(sft_steps(policy, tokenizer, optimizer, schedule, PAIRS, config, epochs=30, ledger=ledger))
    after = target_log_prob(policy, tokenizer)

    # What the ledger counts, by hand: each pair's forward runs over its prompt and response but the last token,
    # predicting the response's; 30 epochs of it.
    ids = [tokenizer([p.prompt, p.response], add_special_tokens=False)["input_ids"] for p in PAIRS]
    lengths = [(len(prompt), len(response)) for prompt, response in ids]
    response = sum(r for _, r in lengths)
    assert ledger.phases["train"].tokens == Tokens(30 * (sum(p + r - 1 for p, r in lengths) - response), 30 * response)
    assert ledger.phases["train"].seconds > 0 and ledger.phases["train"].kind == "trained"

    assert len(metrics) == 30  # one optimizer step per epoch of 4 pairs
    assert metrics[-1]["train/loss"] < 0.5 * metrics[0]["train/loss"]
    assert after > before + 10  # nats summed over the response tokens
    assert all(m["train/grad_norm"] > 0 and m["time/tokens_per_second"] > 0 for m in metrics)


class GradientRecorder(torch.optim.SGD):
    """An optimizer that keeps each step's gradients instead of applying them."""

    def step(self, closure=None):
        self.gradients = [p.grad.detach().clone() for group in self.param_groups for p in group["params"]]


# Responses of very unequal token counts: a per-microbatch mean would weigh the short ones up.
UNEQUAL_PAIRS = [
    Pair(PAIRS[0].prompt, " 3 + 4 = 7 so Tom has 7 cards </think> <answer> 7 </answer>"),
    Pair(PAIRS[1].prompt, " 7 </think>"),
    Pair(
        PAIRS[2].prompt,
        " 5 * 6 = 30, and 30 + 0 = 30, 30 - 0 = 30, 30 * 1 = 30 eggs. " * 3 + "</think> <answer> 30 </answer>",
    ),
    Pair(PAIRS[3].prompt, " 4 </think>"),
]


# Fixed microbatches of 1, 2 and 4 pairs, and token budgets: "3 short" fits the three short pairs together and leaves
# the long one alone (microbatches of unequal row counts), and 4096 takes the batch whole.
@pytest.mark.parametrize(
    ("microbatch_size", "microbatch_tokens"), [(1, None), (2, None), (4, None), (4, "3 short"), (4, 4096)]
)
def test_sft_step_is_the_per_token_mean_over_the_batch(tiny_model_dir, microbatch_size, microbatch_tokens):
    """Whatever the microbatch split, one step's gradient is that of the batch's per-token mean NLL (fp32, 1e-6)."""
    from reasonrl.training.policy import load_policy

    policy, tokenizer = load_policy(tiny_model_dir, torch.device("cpu"))
    batch = tokenize_prompt_and_output(
        [p.prompt for p in UNEQUAL_PAIRS], [p.response for p in UNEQUAL_PAIRS], tokenizer
    )
    lengths = batch["response_mask"].sum(dim=-1).tolist()
    assert max(lengths) > 10 * min(lengths), lengths
    log_probs = get_response_log_probs(policy, batch["input_ids"], batch["labels"])["log_probs"]
    (-(log_probs * batch["response_mask"]).sum() / batch["response_mask"].sum()).backward()
    expected = [p.grad.detach().clone() for p in policy.parameters()]
    policy.zero_grad(set_to_none=True)

    if microbatch_tokens == "3 short":
        rows = sequence_lengths(batch["response_mask"])
        microbatch_tokens = 3 * sorted(rows)[-2]
        parts = split_microbatches(range(4), rows, 4, microbatch_tokens)
        assert [len(part) for part in parts] == [1, 3], (rows, parts)
    config = SFTConfig(
        batch_size=4, microbatch_size=microbatch_size, microbatch_tokens=microbatch_tokens, max_grad_norm=1e9
    )
    recorder = GradientRecorder(policy.parameters(), lr=0.0)
    list(sft_steps(policy, tokenizer, recorder, sft_schedule(config, 1), UNEQUAL_PAIRS, config, epochs=1))
    flat_expected = torch.cat([g.flatten() for g in expected])
    flat_actual = torch.cat([g.flatten() for g in recorder.gradients])
    relative = ((flat_actual - flat_expected).norm() / flat_expected.norm()).item()
    split = f"microbatch {microbatch_size}, {microbatch_tokens} tokens"
    print(f"{split}: response lengths {lengths}, relative gradient difference {relative:.2e}")
    assert relative < 1e-6


def test_ei_keeps_only_correct_rollouts():
    questions = [GSM8KExample("q1", "", "7"), GSM8KExample("q2", "", "30")]

    def sample(text: str) -> Sample:
        return Sample(text, [1], None, prompt_token_ids=[2], finish="stop_string")

    samples = [
        [sample(" x </think> <answer> 7 </answer>"), sample(" x </think> <answer> 8 </answer>")],
        [sample(" x </think> <answer> 31 </answer>"), sample("no answer")],
    ]
    kept, solved = correct_pairs(questions, ["p1", "p2"], samples, r1_zero_reward_fn)
    assert kept == [Pair("p1", " x </think> <answer> 7 </answer>")]
    assert solved == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"batch_size": 30, "microbatch_size": 4},
            "sft.batch_size: must be a positive multiple of sft.microbatch_size=4",
        ),
        ({"learning_rate": 0.0}, "sft.learning_rate: must be > 0"),
        ({"num_examples": 0}, "sft.num_examples"),
    ],
)
def test_sft_config_errors_name_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SFTConfig(**kwargs)


def test_ei_config_errors_name_the_parameter():
    with pytest.raises(ValueError, match="ei.num_rollouts: must be ≥ 1"):
        EIConfig(num_rollouts=0)
