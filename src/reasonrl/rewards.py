"""Which function grades a prompt's responses: a built-in reward (:data:`reasonrl.prompts.REWARD_FNS`) by name, or a
user's ``rewards.<module>:<function>`` from the ``rewards/`` package at the root of the tree the stage runs in.

Params name one per prompt (``rewards.<prompt>``); every stage that grades that prompt's responses resolves it with
:func:`prompt_reward` (which checks every result as it is computed), so a user's reward replaces the built-in
wherever the prompt is used. A user's function has the built-ins' contract:
``fn(response, ground_truth) -> {"format_reward", "answer_reward", "reward"}``, floats, where a ``reward`` of 1.0
means right (accuracy, the SFT filter and expert iteration count those) and ``format_reward`` 1.0 well-formed (the
format rate). Majority votes keep reading the prompt's built-in answer function (:data:`reasonrl.prompts.ANSWER_FNS`):
it says which number a response states, the reward says whether that is right.

A function with a parameter named ``info`` (or ``**kwargs``) is always called with it: a :class:`ResponseInfo` (the
response's token count, whether it was cut at the budget, the budget) where GRPO grades the rollouts it trains on,
None where a stage measures (evaluation, the SFT filter, expert iteration), so a length-shaped reward never counts
a right answer wrong. A function without it is called as before.

A user's function gets :data:`REWARD_SECONDS` of wall clock per response, kept by a SIGALRM timer (a function that
sleeps or waits uses no CPU time): past it, the stage stops with an error naming the function and the response, where
it would otherwise wait forever, silently (GRPO's trainer "waiting for its reply" from an engine stuck grading). A
signal reaches the main thread only, which is where every stage, and the engine's own process, grades. The built-ins
are not bounded so: math-verify's verdicts keep their own bound (:mod:`reasonrl.symbolic`).

The package is loaded from this tree's ``rewards/`` by file location, never found on ``sys.path``: a queued DVC
experiment runs in a copy of the repository, and its reward must be the copy's (the one its dvc.yaml deps hash),
not one installed or in the checkout a process happened to start from. The tree is the one ``reasonrl`` itself was
imported from (every stage command starts with ``PYTHONPATH=src``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import math
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from reasonrl.data import LATEX
from reasonrl.errors import UserError
from reasonrl.prompts import ANSWER, FORMAT_FNS, REWARD_FNS, answer_text_fn
from reasonrl.symbolic import verdict

RewardFn = Callable[..., dict[str, float]]
"""``fn(response, ground_truth) -> {"format_reward", "answer_reward", "reward"}``, optionally with an ``info``
keyword (:class:`ResponseInfo` or None)."""
INFO_KEYWORD = "info"
MATH_VERIFY = "math_verify"
"""The built-in reward that grades answers with math-verify (:func:`math_verify_reward`): LaTeX answers."""


@dataclass(frozen=True)
class ResponseInfo:
    """What a reward function that takes ``info`` learns of a GRPO rollout besides its text: enough to write DAPO's
    soft overlong punishment (``grpo.overlong_penalty`` is the built-in one)."""

    tokens: int
    """Generated tokens, a final EOS included: what ``max_tokens`` bounds."""
    truncated: bool
    """Cut at ``max_tokens``: neither EOS nor a stop string ended it."""
    max_tokens: int
    """The token budget it was sampled with (``grpo.max_tokens``)."""


REWARD_SECONDS = 10.0
"""The wall-clock bound of one call of a user's reward function: grading one response. A reward that runs past it
stops the stage (a reward that took seconds per response would take hours per GRPO step anyway)."""
PACKAGE = "rewards"
"""The package of users' reward modules, at the repository root: dvc.yaml's grading stages depend on it whole."""
ROOT = Path(__file__).resolve().parents[2]
"""The root of the tree this ``reasonrl`` was imported from (``<root>/src/reasonrl``)."""
REWARD_KEYS = ("format_reward", "answer_reward", "reward")
PROBES = (
    ("2 + 2 = 4 </think> <answer> 4 </answer>", "4"),
    ("I am not sure. </think> <answer> 5 </answer>", "There are 3 + 4 = 7.\n#### 7"),
    ("", "1,000"),
)
"""(response, ground truth) pairs a user's function must grade without raising before any model loads: right and
well-formed, wrong with a whole GSM8K answer field as the truth, and empty."""
PROBE_INFOS = (None, ResponseInfo(tokens=8, truncated=True, max_tokens=8))
"""What a function that takes ``info`` is probed with on each probe: a measuring stage's None, and a response cut
at its budget."""


class RewardTimeout(BaseException):
    """A user's reward function ran past :data:`REWARD_SECONDS`. A BaseException, so that no ``except Exception``
    in the function swallows it and keeps it waiting."""


class RewardSpecError(ValueError):
    """A ``rewards.<prompt>`` value that names no usable reward function; params validation says which param."""


class RewardError(UserError, ValueError):
    """A reward function broke its contract on a response a stage graded; the message names the param and the
    response."""


def parse_spec(spec: str) -> tuple[str, str]:
    """``"rewards.tolerant:tolerant_reward"`` → ``("rewards.tolerant", "tolerant_reward")``."""
    module, colon, function = spec.partition(":")
    if not colon or not function.isidentifier() or not all(part.isidentifier() for part in module.split(".")):
        builtins = ", ".join([*REWARD_FNS, MATH_VERIFY])
        raise RewardSpecError(f"{spec!r} is neither a built-in reward ({builtins}) nor module:function")
    if module.split(".")[0] != PACKAGE or module == PACKAGE:
        raise RewardSpecError(
            f"module {module!r} is no module of the repository's {PACKAGE}/ package: put it there and name it "
            f"{PACKAGE}.<module>:<function>, so that DVC sees its file as a dependency of every stage that grades"
        )
    return module, function


def _tree_package(root: Path) -> None:
    """Make ``root/rewards`` the process's ``rewards`` package (loaded from its ``__init__.py``), unless it is."""
    directory = (root / PACKAGE).resolve()
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None:
        where = [Path(path).resolve() for path in getattr(loaded, "__path__", [])]
        if where != [directory]:
            raise RewardSpecError(f"this process already imported another {PACKAGE} package ({where or loaded})")
        return
    init = directory / "__init__.py"
    if not init.is_file():
        raise RewardSpecError(f"{init} is missing: the {PACKAGE}/ package holds users' reward modules")
    spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[str(directory)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    try:
        spec.loader.exec_module(package)
    except Exception:
        del sys.modules[PACKAGE]
        raise


def math_verify_reward(prompt: str, extraction: str = ANSWER) -> RewardFn:
    """``prompt``'s built-in reward with its answer check done by math-verify (:func:`reasonrl.symbolic.verdict`,
    within its time bound) on the answer text ``extraction`` reads (:func:`~reasonrl.prompts.answer_text_fn`; by
    default the text the built-in reads): a LaTeX ground truth such as ``\\left( 3, \\frac{\\pi}{2} \\right)``.
    The format check (:data:`~reasonrl.prompts.FORMAT_FNS`, the built-in's rule alone: the built-in's own answer
    check is not run) and how the two combine are the built-in's: r1_zero's reward needs both, question_only's the
    answer. Never raises on its arguments."""
    has_format, answer_text = FORMAT_FNS[prompt], answer_text_fn(prompt, extraction)

    def math_verify_reward_fn(response: str, ground_truth: str) -> dict[str, float]:
        if not isinstance(response, str) or not isinstance(ground_truth, str):
            return dict.fromkeys(REWARD_KEYS, 0.0)
        format_ok = has_format(response)
        answer_ok = verdict(answer_text(response), ground_truth).correct
        return {
            "format_reward": float(format_ok),
            "answer_reward": float(answer_ok),
            "reward": float(format_ok and answer_ok),
        }

    return math_verify_reward_fn


def rewards_for(answer_format: str, rewards: Mapping[str, str]) -> dict[str, str]:
    """The reward of each prompt on a held-out set whose answers are written in ``answer_format``: params'
    ``rewards``, but on a ``latex`` set :data:`MATH_VERIFY` in place of each number-only built-in (which would score
    every answer to ``\\frac{\\pi}{2}`` 0); a user's own reward stays."""
    if answer_format != LATEX:
        return dict(rewards)
    return {prompt: MATH_VERIFY if spec in REWARD_FNS else spec for prompt, spec in rewards.items()}


def is_built_in(spec: str) -> bool:
    """Whether ``spec`` names a built-in reward (this package's code) rather than a user's function."""
    return spec in REWARD_FNS or spec == MATH_VERIFY


def reward_fn(spec: str, root: Path = ROOT, prompt: str | None = None, extraction: str = ANSWER) -> RewardFn:
    """The function ``spec`` names: a key of :data:`~reasonrl.prompts.REWARD_FNS` (looked up on each call),
    :data:`MATH_VERIFY` (for ``prompt``, reading answers as ``extraction`` says), or ``rewards.<module>:<function>``
    imported from ``root/rewards``. Only math-verify's grading takes an extraction: a built-in reads one number its
    own way, a user's function the whole response."""
    if spec in REWARD_FNS:
        return REWARD_FNS[spec]
    if spec == MATH_VERIFY:
        if prompt not in REWARD_FNS:
            raise RewardSpecError(f"{MATH_VERIFY} grades a prompt's answers as it reads them; no prompt {prompt!r}")
        return math_verify_reward(prompt, extraction)
    module_name, function_name = parse_spec(spec)
    try:
        _tree_package(root)
        module = importlib.import_module(module_name)
    except RewardSpecError:
        raise
    except ModuleNotFoundError as error:
        if error.name is not None and (module_name + ".").startswith(error.name + "."):
            raise RewardSpecError(f"no module {module_name} in {root / PACKAGE}") from None
        raise RewardSpecError(f"importing {module_name} failed: {type(error).__name__}: {error}") from None
    except Exception as error:
        raise RewardSpecError(f"importing {module_name} failed: {type(error).__name__}: {error}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise RewardSpecError(f"{module_name} ({module.__file__}) has no function {function_name}")
    return function


def contract_breach(result: object) -> str | None:
    """What is wrong with a reward function's ``result`` (a dict of exactly :data:`REWARD_KEYS`, each a finite
    float), None when nothing is."""
    if not isinstance(result, dict) or set(result) != set(REWARD_KEYS):
        return f"must return a dict of exactly {', '.join(REWARD_KEYS)}; it returned {result!r}"
    if not all(isinstance(result[key], float) and math.isfinite(result[key]) for key in REWARD_KEYS):
        return f"must return finite floats; it returned {result!r}"
    return None


def takes_info(function: RewardFn) -> bool:
    """Whether ``function`` accepts the ``info`` keyword: a parameter of that name, or ``**kwargs``."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature: called as before
        return False
    named = parameters.get(INFO_KEYWORD)
    if named is not None:
        return named.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values())


def check_reward(spec: str, root: Path = ROOT, prompt: str | None = None) -> RewardFn:
    """:func:`reward_fn`, after probing it on :data:`PROBES` (:func:`contract_breach`; a user's function within
    :data:`REWARD_SECONDS` each), each with every one of :data:`PROBE_INFOS` when it takes ``info``."""
    function, bounded = reward_fn(spec, root, prompt), not is_built_in(spec)
    calls = [{INFO_KEYWORD: info} for info in PROBE_INFOS] if takes_info(function) else [{}]
    for response, ground_truth in PROBES:
        for keywords in calls:
            shown = "".join(f", {INFO_KEYWORD}={info!r}" for info in keywords.values())
            on = f"on the probe ({response!r}, {ground_truth!r}{shown})"
            graded(function, response, ground_truth, spec, on, RewardSpecError, bounded, **keywords)
    return function


def graded(
    function: RewardFn,
    response: str,
    ground_truth: str,
    where: str,
    on: str,
    error: type[ValueError],
    bounded: bool,
    **keywords: ResponseInfo | None,
) -> dict[str, float]:
    """``function(response, ground_truth, **keywords)``, or ``error`` naming ``where`` and ``on`` (which call) when it
    raises, breaks its contract (:func:`contract_breach`) or, ``bounded``, runs past :data:`REWARD_SECONDS`."""
    seconds = REWARD_SECONDS
    try:
        with wall_clock_bound(seconds if bounded else None):
            result = function(response, ground_truth, **keywords)
    except RewardTimeout:
        raise error(f"{where} did not return within {seconds:g} s {on}") from None
    except Exception as exception:
        raise error(f"{where} raised {type(exception).__name__}: {exception} {on}") from exception
    breach = contract_breach(result)
    if breach:
        raise error(f"{where} {breach} {on}")
    return result


@contextmanager
def wall_clock_bound(seconds: float | None) -> Iterator[None]:
    """Raise :class:`RewardTimeout` inside the block once ``seconds`` have passed (None: no bound), or as it ends if
    the code inside caught the first one."""
    if seconds is None:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("a user's reward function is bounded with SIGALRM, which only the main thread receives")
    armed, expired = True, False

    def expire(signum: int, frame: object) -> None:
        nonlocal expired
        expired = True
        if armed:
            raise RewardTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)  # once: the timer can fire at most once, wherever it lands
    try:
        yield
    finally:
        try:
            armed = False
        finally:  # even when the timer fires on the way out
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    if expired:
        raise RewardTimeout


def shorten(text: str, head: int = 120, tail: int = 60) -> str:
    """``text``'s repr, its middle elided when it is long: an error line shows which response, not all of it."""
    if len(text) <= head + tail:
        return repr(text)
    return f"{text[:head]!r} … {text[-tail:]!r} ({len(text)} characters)"


def checked(function: RewardFn, param: str, spec: str) -> RewardFn:
    """``function`` with every result checked as it is computed: the probes of :func:`check_reward` cannot find a
    NaN that only long responses get, and one reaching GRPO's advantages would be blamed on the learning rate. A
    breach, an exception or (a user's function) a call past :data:`REWARD_SECONDS` raises :class:`RewardError`
    naming ``param`` and the response. The wrapper takes an ``info`` keyword (default None), which it passes on only
    to a function that takes it (:func:`takes_info`)."""

    with_info, bounded = takes_info(function), not is_built_in(spec)

    @functools.wraps(function)
    def checked_reward(response: str, ground_truth: str, info: ResponseInfo | None = None) -> dict[str, float]:
        on = f"on the response {shorten(response)} with ground truth {shorten(ground_truth)}"
        keywords = {INFO_KEYWORD: info} if with_info else {}  # a function without the keyword is called as before
        return graded(function, response, ground_truth, f"{param} ({spec})", on, RewardError, bounded, **keywords)

    return checked_reward


def prompt_reward(
    prompt: str, rewards: Mapping[str, str] | None = None, root: Path = ROOT, extraction: str = ANSWER
) -> RewardFn:
    """The function that grades ``prompt``'s responses, each result checked (:func:`checked`): ``rewards[prompt]``
    (params' ``rewards`` section); the prompt's built-in when ``rewards`` is None. ``extraction``: as
    :func:`reward_fn`."""
    spec = prompt if rewards is None else rewards[prompt]
    return checked(reward_fn(spec, root, prompt, extraction), f"rewards.{prompt}", spec)


def user_code_digest(spec: str, root: Path = ROOT) -> str | None:
    """SHA-256 over the ``.py`` files of ``root/rewards`` by relative name and content when ``spec`` is a user's
    (the module may import its neighbours); None for a built-in, whose code the stage's own code digest holds."""
    if is_built_in(spec):
        return None
    directory = root / PACKAGE
    digest = hashlib.sha256()
    for file in sorted(p for p in directory.rglob("*.py") if "__pycache__" not in p.parts):
        content = file.read_bytes()
        digest.update(f"{file.relative_to(directory).as_posix()}\0{len(content)}\0".encode() + content)
    return digest.hexdigest()


def reward_identity(prompt: str, rewards: Mapping[str, str] | None, root: Path = ROOT) -> dict[str, str | None]:
    """What a resume fingerprint records of the reward that grades ``prompt``: its spec and, for a user's, the
    ``rewards/`` package by content (:func:`user_code_digest`)."""
    spec = prompt if rewards is None else rewards[prompt]
    return {"spec": spec, "code": user_code_digest(spec, root)}
