"""The base model: a hub id, a local HF directory, or the tiny model built here."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils.chat_template_utils import render_jinja_template

from reasonrl.atomic import atomic_directory
from reasonrl.config import Precision, TinyModelSpec
from reasonrl.data import GSM8KExample
from reasonrl.errors import UserError
from reasonrl.prompts import PROMPT_NAMES, Prompt, load_prompt
from reasonrl.tiny_model import CHAT_TEMPLATE, build_tiny_model, train_tokenizer

TINY = "tiny"
REQUIRED_FILES = ("config.json",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
MODEL_CARD = "README.md"
"""A model directory's card: a hub model's, or the one a training stage writes (``reasonrl.model_card``)."""
NOT_COPIED = (".git", ".cache")
"""Version control and the hub's download metadata: not part of a local model directory's copy."""


class ModelSourceError(UserError, ValueError):
    """``model.name`` does not lead to a usable model; the message says how to supply one."""


def validate_model_dir(path: Path) -> None:
    """A directory ``from_pretrained`` and vLLM can load: a config, weights and a tokenizer, in regular files.

    ``config.json`` and the safetensors headers are parsed here: a broken one would otherwise stop the first stage
    that loads the model, 10-20 s into the engine's start. A link is refused: copying it would copy whatever it
    points at (any file on the machine) into ``models/base`` and the DVC cache."""
    _refuse_links(path)
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        missing.append("*.safetensors (weights)")
    if not has_tokenizer(path):
        missing.append("tokenizer.json (tokenizer)")
    if missing:
        raise ModelSourceError(f"{path}: not a Hugging Face model directory, missing {', '.join(missing)}")
    _check_config(path / "config.json")
    for weights in sorted(path.glob("*.safetensors")):
        _check_safetensors(weights)


def has_tokenizer(path: Path) -> bool:
    """Whether ``path`` holds the files of a tokenizer: one of :data:`TOKENIZER_FILES`."""
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of the model in ``model_dir``, refused when its files are missing: transformers would make an
    empty one from the config alone, which reads every prompt as no tokens, and the stage would stop at its first
    generation, after the engine's start, inside vLLM ("The decoder prompt cannot be empty")."""
    if not has_tokenizer(Path(model_dir)):
        raise ModelSourceError(
            f"{model_dir}: the model has no tokenizer, none of {', '.join(TOKENIZER_FILES)}; copy its tokenizer's "
            f"files from the model it was made from"
        )
    return AutoTokenizer.from_pretrained(model_dir)


def _refuse_links(path: Path) -> None:
    """The directory and everything in it (but :data:`NOT_COPIED`) are real directories and regular files."""
    if path.is_symlink():
        raise ModelSourceError(
            f"{path}: a symbolic link (to {os.readlink(path)}); set model.name to the directory it points to"
        )
    for root, directories, files in os.walk(path):
        directories[:] = [name for name in directories if name not in NOT_COPIED]
        for name in directories + files:
            entry = Path(root) / name
            if entry.is_symlink():
                raise ModelSourceError(
                    f"{entry}: a symbolic link (to {os.readlink(entry)}); a model directory must hold the files "
                    f"themselves (copy it with cp -rL)"
                )
            if not entry.is_dir() and not entry.is_file():
                raise ModelSourceError(f"{entry}: not a regular file")


def _check_config(path: Path) -> None:
    """``config.json`` is a transformers config: a JSON object that names its ``model_type``."""
    try:
        config = json.loads(path.read_bytes())
    except ValueError as error:  # invalid JSON or UTF-8
        raise ModelSourceError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelSourceError(f"{path}: not a transformers config (a JSON object with a model_type)")


def _check_safetensors(path: Path) -> None:
    """A safetensors file whose header the loaders accept: the library that loads the weights validates it (the
    header's length within the file, its JSON, every tensor's offsets and size) without reading a weight."""
    try:
        with safe_open(path, framework="pt"):
            pass
    except SafetensorError as error:
        raise ModelSourceError(f"{path}: not a valid safetensors file ({error})") from None


def policy_dtype(device: torch.device, precision: Precision) -> torch.dtype:
    """The dtype a policy's weights are kept in: on GPU bf16 for ``bf16`` (the handout's setting) and fp32 master
    weights for ``mixed``; fp32 on CPU whatever the precision (bf16 matmuls are slow and lossy there)."""
    return torch.bfloat16 if device.type == "cuda" and precision == "bf16" else torch.float32


def compute_precision(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager:
    """The context a policy's forward and backward run in: bf16 autocast over fp32 weights for ``mixed`` on GPU
    (weight gradients and AdamW stay fp32), nothing otherwise."""
    if device.type == "cuda" and precision == "mixed":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def model_digest(path: str | Path) -> str:
    """SHA-256 over a model directory's files (names and contents: weights, config, tokenizer), in name order, but
    its card (``README.md``: a trained model's names the git commit, a hub model's is prose), which computes nothing:
    a GRPO checkpoint stays resumable when only the init model's card changed."""
    digest = hashlib.sha256()
    files = (p for p in Path(path).rglob("*") if p.is_file() and p.relative_to(path).as_posix() != MODEL_CARD)
    for file in sorted(files):
        digest.update(f"{file.relative_to(path).as_posix()}\0{file.stat().st_size}\0".encode())
        with file.open("rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def template_text(prompt: Prompt) -> str:
    """A template's text as the tiny model will read it: a chat prompt rendered (with an empty question) through
    the tiny tokenizer's chat template, by the renderer ``apply_chat_template`` runs, since that tokenizer is what
    this text trains."""
    if not prompt.is_chat:
        return prompt.text
    (rendered,), _ = render_jinja_template(
        [prompt.messages("")], chat_template=CHAT_TEMPLATE, add_generation_prompt=True
    )
    return rendered + prompt.assistant_prefix


def tokenizer_corpus(examples: list[GSM8KExample], chat: bool = False) -> list[str]:
    """Text a tiny tokenizer learns from: the prompts and the worked solutions it will see. Without the templates'
    words an r1_zero prompt is about 3x the tokens (367 vs 117 on the CPU preset's data), hence prepare_model
    depends on the template files."""
    prompts = [load_prompt(name) for name in PROMPT_NAMES]
    templates = [template_text(prompt) for prompt in prompts if chat or not prompt.is_chat]
    return templates + [f"{example.question}\n{example.reasoning}\n{example.answer}" for example in examples]


def prepare_base_model(
    name: str, tiny_spec: TinyModelSpec, seed: int, train: list[GSM8KExample], out_dir: Path, chat: bool = False
) -> str:
    """Materialise the base model in ``out_dir`` (atomically); returns a one-line description of the source. The
    tiny model's tokenizer carries the ChatML chat template when ``chat`` (a stage of the run uses a chat prompt)."""
    if name == TINY:
        tokenizer = train_tokenizer(tokenizer_corpus(train, chat), tiny_spec.vocab_size, chat)
        model = build_tiny_model(tokenizer, tiny_spec, seed)
        with atomic_directory(out_dir) as staging:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
        return f"tiny Qwen2 ({sum(p.numel() for p in model.parameters()):,} parameters, vocab {len(tokenizer)})"

    local = Path(name).expanduser()
    if local.is_dir():
        validate_model_dir(local)
        with atomic_directory(out_dir) as staging:
            shutil.copytree(local, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*NOT_COPIED))
        return f"local directory {local.resolve()}"
    if local.exists() or name.startswith((".", "/", "~")):
        raise ModelSourceError(f"model.name: {name} is not a directory (expected a HF model directory)")

    from huggingface_hub import snapshot_download

    with atomic_directory(out_dir) as staging:
        try:
            snapshot_download(repo_id=name, local_dir=staging)
        except Exception as error:  # noqa: BLE001 — the hub raises many types; all mean "not reachable/no such model"
            raise ModelSourceError(
                f"model.name: could not download {name!r} from the Hugging Face hub ({type(error).__name__}: "
                f"{error}). Offline? Download it on a connected machine (`hf download {name} --local-dir DIR`), "
                f"copy DIR here and set model.name to that directory."
            ) from None
        validate_model_dir(staging)
    return f"hub {name}"
