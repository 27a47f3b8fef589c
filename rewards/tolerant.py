"""An example of a user's reward for the r1_zero prompt: its format, a numeric answer accepted within a relative
tolerance (an answer rounded to a cent, a percentage given to one decimal), and partial credit for a well-formed
wrong answer, which gives GRPO a signal before the first right one. In params.yaml:
``rewards: {r1_zero: rewards.tolerant:tolerant_reward}``."""

from reasonrl.grading import extract_answer_block, ground_truth_value, has_r1_zero_format, single_number

RELATIVE_TOLERANCE = 0.01
"""An answer within 1% of the ground truth is right (an exact one for a ground truth of 0)."""
FORMAT_CREDIT = 0.1
"""The reward of a well-formed wrong answer; a right one gets 1.0, a malformed one 0.0."""


def tolerant_reward(response: str, ground_truth: str) -> dict[str, float]:
    """Grade ``response`` (the text after ``Assistant: <think>``) against ``ground_truth`` (a number or a GSM8K
    answer field).

    >>> tolerant_reward("45 * 1.005 = 45.2 </think> <answer> 45.2 </answer>", "45")
    {'format_reward': 1.0, 'answer_reward': 1.0, 'reward': 1.0}
    >>> tolerant_reward("9 * 5 = 50 </think> <answer> 50 </answer>", "45")
    {'format_reward': 1.0, 'answer_reward': 0.0, 'reward': 0.1}
    """
    formatted = has_r1_zero_format(response)
    block = extract_answer_block(response)
    stated = single_number(block) if block is not None else None
    expected = ground_truth_value(ground_truth)
    right = stated is not None and expected is not None and abs(stated - expected) <= RELATIVE_TOLERANCE * abs(expected)
    reward = 1.0 if formatted and right else FORMAT_CREDIT * formatted
    return {"format_reward": float(formatted), "answer_reward": float(right), "reward": reward}
