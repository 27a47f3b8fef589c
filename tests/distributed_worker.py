"""One rank of the distributed GRPO test (``tests/test_distributed.py`` starts it under ``torch.distributed.run``).

Each rank draws its share of one step's questions from its own engine, trains two optimizer steps on them through
the loop's functions (DDP or FSDP2, gloo), and writes what the test compares: its questions and samples, the rollout
metrics as the loop logs them, the reduced gradients of each step, its whole weights afterwards, and the engine's
log-probs after a weight load against HF's, and whether a KL reference refreshed to the trained policy holds all of it.

    python -m torch.distributed.run --nproc-per-node 2 tests/distributed_worker.py MODEL_DIR OUT_DIR STRATEGIES [TP]

STRATEGIES is one strategy or several, comma-separated (``ddp,fsdp2``): each trains a fresh policy on the same
rollouts, drawn once, and writes ``<strategy>-rank<rank>.pt`` and ``.json``; the engines and the process group start
once for all of them. With TP = 2 the two ranks are one tensor-parallel group: one engine sharded over both, the same
questions and samples, half the training rows each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from reasonrl.config import DistributedConfig, EngineConfig, GRPOConfig
from reasonrl.data import parse_lines
from reasonrl.distributed import full_tensor, init_ranks, wrap_for_training
from reasonrl.grpo import (
    FixedLogProbs,
    Forwards,
    KLReference,
    NonFiniteGuard,
    accumulate_gradients,
    compute_old_log_probs,
    optimizer_step,
    rollout_metrics,
    score_rollouts,
)
from reasonrl.logprobs import get_response_log_probs
from reasonrl.lora import merged_weights
from reasonrl.prompts import REWARD_FNS
from reasonrl.rollouts.drawing import draw_rollouts
from reasonrl.rollouts.engine import RolloutEngine
from reasonrl.synthetic import arithmetic_lines
from reasonrl.training.optimizer import make_optimizer
from reasonrl.training.policy import load_policy

STEP_SEED = 5
# Two passes over the rollout batch, each one optimizer step of all 32 responses: the second is off-policy (old
# log-probs, clipping). The sequences are 337 to 354 tokens (the prompt is most of them): a 700-token microbatch holds
# two only when the longer is at most 350, so the ranks, whose prompts differ, get different microbatch counts.
CONFIG = GRPOConfig(
    rollout_batch_size=32, group_size=4, train_batch_size=32, gradient_accumulation_steps=1, max_tokens=12,
    min_tokens=2, loss_type="grpo_clip", epochs_per_rollout_batch=2, microbatch_tokens=700, learning_rate=1e-3,
    old_log_probs_microbatch_tokens=160,
)  # fmt: skip


def odd_length_reward(response: str, ground_truth: str) -> dict[str, float]:
    """A reward a random model earns about half the time: advantages, hence gradients, that are not all zero."""
    reward = float(len(response) % 2)
    return {"format_reward": reward, "answer_reward": reward, "reward": reward}


def train_questions():
    return parse_lines(arithmetic_lines(64, seed=0, max_steps=1, max_value=9), "train")


def main() -> None:
    model_dir, out_dir, strategies = sys.argv[1], Path(sys.argv[2]), sys.argv[3].split(",")
    tensor_parallel_size = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    REWARD_FNS["r1_zero"] = odd_length_reward
    distributed = DistributedConfig(nproc_per_node=2, tensor_parallel_size=tensor_parallel_size)
    ranks = init_ranks(distributed, "cpu")
    engine_config = EngineConfig(layout="cpu", cpu_kv_cache_gib=1, max_model_len=512, enforce_eager=True)
    engine = RolloutEngine(model_dir, engine_config, ranks.tensor_parallel_size)
    policy, _ = load_policy(model_dir, torch.device("cpu"))
    with engine.serving(policy):
        drawn = draw_rollouts(engine, train_questions(), CONFIG, stop=[], step_seed=STEP_SEED, ranks=ranks)
    rollout = ranks.mean_metrics(rollout_metrics(drawn, CONFIG.batching.group_size, CONFIG.sampling.dynamic_sampling))
    questions = [question.question for question in drawn.questions]
    for strategy in strategies:
        results = train_and_check(model_dir, strategy, engine, drawn, ranks)
        name = f"{strategy}-rank{ranks.rank}"
        checks = {key: results.pop(key) for key in ("engine_vs_hf", "reference_refreshed")}
        (out_dir / f"{name}.json").write_text(json.dumps({**checks, "rank": ranks.rank}))
        torch.save(
            {"questions": questions, "samples": drawn.samples, "rollout": rollout, **results}, out_dir / f"{name}.pt"
        )
    torch.distributed.barrier()  # the process group stays: vLLM tears its own groups down at exit


def train_and_check(model_dir: str, strategy: str, engine: RolloutEngine, drawn, ranks) -> dict:
    """A fresh policy trained under ``strategy`` on ``drawn``: the rows this rank trained, each step's loss and
    reduced gradients, the whole weights afterwards, and the engine's log-probs after loading them against HF's."""
    policy, tokenizer = load_policy(model_dir, torch.device("cpu"))
    trainer = wrap_for_training(policy, strategy, ranks)
    optimizer, guard = make_optimizer(policy, CONFIG.optimizer), NonFiniteGuard(limit=0)
    loss, group_size, max_grad_norm = CONFIG.loss, CONFIG.batching.group_size, CONFIG.optimizer.max_grad_norm
    batch = score_rollouts(tokenizer, drawn, group_size, loss, CONFIG.sampling)
    fixed = FixedLogProbs(old=compute_old_log_probs(trainer, batch, Forwards.fixed(CONFIG), ranks))
    rows = ranks.rows_to_train(len(batch.responses))
    gradients, losses = [], []
    for _ in range(CONFIG.batching.epochs_per_rollout_batch):
        forwards = Forwards.training(CONFIG)
        metrics = accumulate_gradients(trainer, batch, rows, fixed, loss, forwards, CONFIG.sampling.max_tokens, ranks)
        losses.append(metrics["train/loss"])
        gradients.append({name: full_tensor(p.grad).clone() for name, p in policy.named_parameters()})
        optimizer_step(trainer, optimizer, max_grad_norm, guard, 0, {"loss": metrics["train/loss"]}, ranks)
    weights = dict(merged_weights(policy))  # every rank gathers (FSDP2)
    # A KL reference refreshed to the trained policy (grpo.ref_update_every): every rank's copy whole.
    refreshing = GRPOConfig(kl_coef=0.1, ref_update_every=1).loss
    reference = KLReference.of(load_policy(model_dir, torch.device("cpu"))[0], refreshing, lora_rank=0)
    reference.refresh(policy, steps_done=1)
    refreshed = all(torch.equal(tensor, weights[name]) for name, tensor in reference.frozen.state_dict().items())

    # The engine after a weight load samples from the trained policy: its log-probs against HF's on the same tokens
    # (no min_tokens: the engine's log-probs of those tokens are of a distribution without EOS).
    plain = load_policy(model_dir, torch.device("cpu"))[0].eval()
    plain.load_state_dict(weights)
    prompts = drawn.prompts[:2]
    with engine.serving(policy):
        samples = engine.generate(prompts, n=2, max_tokens=12, stop=(), seed=1, return_logprobs=True)
    worst = 0.0
    for sample in (sample for group in samples for sample in group):
        ids = torch.tensor([sample.prompt_token_ids + sample.token_ids])  # [1, P + R]
        with torch.no_grad():
            log_probs = get_response_log_probs(plain, ids[:, :-1], ids[:, 1:])["log_probs"]  # [1, P + R - 1]
        hf = log_probs[0, len(sample.prompt_token_ids) - 1 :]
        worst = max(worst, (hf - torch.tensor(sample.logprobs)).abs().max().item())
    return {"rows": rows, "gradients": gradients, "weights": weights, "losses": losses, "engine_vs_hf": worst,
            "reference_refreshed": refreshed}  # fmt: skip


if __name__ == "__main__":
    main()
