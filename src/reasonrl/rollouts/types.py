"""What a draw of rollouts returns: a sample, a step's questions with their groups of samples and the samples'
grades, and the rollouts a GRPO step trains on; the room a prompt and its answer need. Plain data, with no torch and
no vLLM: a checkpoint's rollouts in flight parse without them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from reasonrl.cost import Tokens
from reasonrl.errors import ConfigError

if TYPE_CHECKING:
    from reasonrl.data import GSM8KExample


@dataclass(frozen=True)
class Sample:
    """One generated completion."""

    text: str
    """Generated text; a stop string that ended it is kept (``include_stop_str_in_output=True``)."""
    token_ids: list[int]
    """Generated token ids, ending with the EOS token when EOS ended the sample (it is trained on: ending is a
    decision of the policy)."""
    logprobs: list[float] | None
    """Log-prob of each sampled token under the distribution it was drawn from, when asked: vLLM's
    ``processed_logprobs``, after temperature and top-p (``log_softmax(logits / T)`` at top-p 1), and before
    ``min_tokens`` tokens with the stop tokens masked out, as the sampler masks them (greedy, ``temperature=0``:
    the untempered distribution)."""
    prompt_token_ids: list[int]
    """The exact prompt ids the engine conditioned on (with any BOS its tokenizer adds): train on these."""
    finish: Literal["eos", "stop_string", "length"]
    """What ended the sample: the EOS token, a stop string, or ``max_tokens`` (truncated)."""

    @property
    def length(self) -> int:
        """Generated tokens, not counting a final EOS token (which is no text)."""
        return len(self.token_ids) - (self.finish == "eos")


def samples_tokens(samples: Iterable[Sample]) -> Tokens:
    """What the engine processed for ``samples``: each one's prompt and generated tokens."""
    prompt = response = 0
    for sample in samples:
        prompt += len(sample.prompt_token_ids)
        response += len(sample.token_ids)
    return Tokens(prompt, response)


def require_room(
    prompt_tokens: int, answer_tokens: int, max_model_len: int, *, prompt: str, answer_param: str, other_fixes: str
) -> None:
    """A prompt of ``prompt_tokens`` and its longest answer must fit ``rollout.max_model_len``: vLLM refuses a prompt
    that fills it and silently cuts an answer that reaches it, which would quietly shorten what ``max_tokens``
    promised. The error names the prompt (``prompt``), the param that set the answer's length and the other ways out
    (``other_fixes``, after the length to raise it to)."""
    needed = prompt_tokens + answer_tokens
    if needed > max_model_len:
        raise ConfigError(
            f"rollout.max_model_len: ({max_model_len}) is too short for {prompt} and an answer of up to "
            f"{answer_tokens} tokens ({answer_param}); raise rollout.max_model_len to at least {needed}{other_fixes}"
        )


Scores = dict[str, float]
"""A reward function's grade of one sample: ``reward``, ``format_reward`` and ``answer_reward``."""


@dataclass
class DrawnRollouts:
    """The questions a step trains on, their prompts and their groups of samples (flattened group after group), each
    sample graded once, as it was drawn."""

    questions: list[GSM8KExample]
    prompts: list[str]
    samples: list[Sample]
    scores: list[Scores]
    """The grade of each of ``samples``."""
    sampled_questions: list[GSM8KExample]
    sampled_samples: list[Sample]
    """Every group the step sampled, kept or dropped, in every round (the trained ones without dynamic sampling):
    what the step's rollout metrics describe."""
    sampled_scores: list[Scores]
    """The grade of each of ``sampled_samples``."""
    sampling_rounds: int = 1
    dropped_groups: int = 0


@dataclass
class StepRollouts:
    """The rollouts GRPO step ``step`` trains on, and the policy version that sampled them: the weights after
    ``version`` GRPO steps."""

    step: int
    version: int
    drawn: DrawnRollouts
    engine_seconds: float | None = None
    """The engine's own time on them, when it ran beside the trainer."""

    @property
    def policy_lag(self) -> int:
        """GRPO steps between the policy that sampled them and the one that trains on them."""
        return self.step - self.version

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> StepRollouts:
        """As ``dataclasses.asdict`` wrote them; anything else raises (KeyError, TypeError, ValueError, ...)."""
        from reasonrl.data import GSM8KExample

        drawn = dict(saved["drawn"])
        for name in ("questions", "sampled_questions"):
            drawn[name] = [GSM8KExample(**question) for question in drawn[name]]
        for name in ("samples", "sampled_samples"):
            drawn[name] = [Sample(**sample) for sample in drawn[name]]
        return cls(saved["step"], saved["version"], DrawnRollouts(**drawn), saved["engine_seconds"])
