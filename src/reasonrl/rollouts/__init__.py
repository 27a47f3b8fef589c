"""Rollouts: sampling the policy with vLLM, in this process or in one of its own, for the training loops.

The parts: ``types`` (what a draw returns: samples and a step's groups of them; no torch, no vLLM), ``engine`` (the
in-process vLLM engine and the weight sync into it), ``channel`` (the weight stream into an engine's own process),
``process`` (that process and the trainer's handle on it), ``drawing`` (a step's questions and groups of samples,
shared by expert iteration and GRPO) and ``sources`` (where the GRPO loop takes each step's rollouts from: the
engine beside it, or the engine's process drawing ahead). The package imports none of them: a stage depends on the
parts it imports.
"""
