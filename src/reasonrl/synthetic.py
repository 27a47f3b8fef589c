"""A synthetic GSM8K-format task: multi-step arithmetic word problems a tiny model can learn on a CPU.

Each problem is 1..``max_steps`` operations (+, −, ×) on values ≤ ``max_value``, with one reasoning line per step
(``Tom has 21 + 3 = 24 cards.``) and GSM8K's ``#### N`` answer line, so every stage treats it exactly like GSM8K.
Deterministic from the seed.
"""

from __future__ import annotations

import json
import random

NAMES = ("Tom", "Ann", "Raj", "Mia", "Leo", "Zoe", "Sam", "Ivy", "Ben", "Eva")
ITEMS = ("cards", "apples", "stamps", "marbles", "books", "coins", "shells", "pencils")


def arithmetic_problem(rng: random.Random, max_steps: int, max_value: int) -> dict[str, str]:
    """One problem as a GSM8K record ``{"question", "answer"}`` (answer: reasoning lines, then ``#### N``)."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(1, max_value)
    sentences = [f"{name} has {total} {item}."]
    reasoning = []
    for _ in range(rng.randint(1, max_steps)):
        operation = rng.choice("+-*")
        if operation == "-" and total <= 1:
            operation = "+"
        if operation == "+":
            amount = rng.randint(1, max_value)
            sentences.append(f"{name} gets {amount} more {item}.")
            result = total + amount
        elif operation == "-":
            amount = rng.randint(1, total - 1)
            sentences.append(f"{name} gives away {amount} {item}.")
            result = total - amount
        else:
            amount = rng.randint(2, 4)
            sentences.append(f"{name}'s {item} grow {amount} times.")
            result = total * amount
        reasoning.append(f"{name} has {total} {operation} {amount} = {result} {item}.")
        total = result
    question = " ".join(sentences) + f" How many {item} does {name} have now?"
    return {"question": question, "answer": "\n".join(reasoning) + f"\n#### {total}"}


def arithmetic_lines(count: int, seed: int, max_steps: int, max_value: int) -> list[str]:
    """``count`` problems as GSM8K jsonl lines."""
    rng = random.Random(seed)
    return [json.dumps(arithmetic_problem(rng, max_steps, max_value)) for _ in range(count)]
