"""Contamination: the benchmark questions that the training data shares a 13-gram of words with, or asks outright.

The convention of GPT-3 (Brown et al. 2020, appendix C) and Llama 2: a test question is contaminated when one of its
runs of 13 consecutive words also stands in a training example (its question or its reasoning). Words are compared
Unicode-normalised (NFKC) and case-folded, punctuation dropped. A question shorter than 13 words has no 13-gram;
it counts as contaminated when a training example asks it word for word (:func:`reasonrl.data.question_key`).

The benchmarks' n-grams are held in memory (a few per cent of their text in hashes), the training data streams past
them once: memory does not grow with the training set.
"""

from __future__ import annotations

import re
import unicodedata
from collections import defaultdict

NGRAM = 13
"""Words in an n-gram: GPT-3's 13."""
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """``text``'s words, NFKC-normalised and case-folded: ``"Tom's 3 apples."`` → ``["tom", "s", "3", "apples"]``."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def ngrams(text: str, n: int = NGRAM) -> set[int]:
    """The hashes of ``text``'s runs of ``n`` words (none when it has fewer). Python's string hash: salted per
    process, which is all a comparison within one process needs."""
    tokens = words(text)
    return {hash(" ".join(tokens[start : start + n])) for start in range(len(tokens) - n + 1)}


class Overlap:
    """Held-out questions by their n-grams and their :func:`~reasonrl.data.question_key`, each with the set it
    belongs to and its position there; :meth:`scan` marks those a training example shares one with."""

    def __init__(self, n: int = NGRAM) -> None:
        self.n = n
        self._by_ngram: dict[int, list[tuple[str, int]]] = defaultdict(list)
        self._by_key: dict[bytes, list[tuple[str, int]]] = defaultdict(list)
        self._found: dict[str, set[int]] = {}

    def add(self, name: str, position: int, question: str, key: bytes) -> None:
        """Question ``position`` (from 0) of held-out set ``name``, and its exact-match ``key``."""
        self._found.setdefault(name, set())
        for gram in ngrams(question, self.n):
            self._by_ngram[gram].append((name, position))
        self._by_key[key].append((name, position))

    @property
    def active(self) -> bool:
        """Whether any question was added: else a scan has nothing to find, and is skipped."""
        return bool(self._found)

    def scan(self, key: bytes, text: str) -> None:
        """A training example: its question's ``key`` and its whole ``text`` (question and reasoning)."""
        for name, position in self._by_key.get(key, ()):
            self._found[name].add(position)
        for gram in ngrams(text, self.n):
            for name, position in self._by_ngram.get(gram, ()):
                self._found[name].add(position)

    def found(self) -> dict[str, list[int]]:
        """Each set's contaminated positions, sorted (every set added, those with none too)."""
        return {name: sorted(positions) for name, positions in self._found.items()}
