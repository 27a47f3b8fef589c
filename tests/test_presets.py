"""`python -m reasonrl.presets`: the README's commands work as written; `--apply` changes the preset's lines only."""

import difflib
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reasonrl.config import ConfigError, GRPOConfig, flat_dict, load_params, parse_yaml
from reasonrl.loss_registry import LOSS_TYPES
from reasonrl.presets import apply_overrides, apply_to_file, available, load_preset, set_params_words

PRESETS = [sys.executable, "-m", "reasonrl.presets"]


def dotted_keys_by_line(text: str) -> dict[int, str]:
    """The dotted key of each ``key: value`` line of a block-style YAML file, from indentation alone."""
    keys, stack = {}, []  # stack: (indent, key) of the open sections
    for number, line in enumerate(text.splitlines()):
        stripped = line.lstrip(" ")
        if not stripped or stripped.startswith("#") or ":" not in stripped:
            continue
        indent = len(line) - len(stripped)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = stripped.split(":", 1)[0]
        keys[number] = ".".join([k for _, k in stack] + [key])
        stack.append((indent, key))
    return keys


def _get(tree, dotted):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_apply_changes_exactly_the_lines_of_the_values_the_preset_changes(params_file):
    before = params_file.read_text(encoding="utf-8")
    preset = load_preset("cpu")
    subprocess.run([*PRESETS, "cpu", "--params", str(params_file), "--apply"], check=True, capture_output=True)
    after = params_file.read_text(encoding="utf-8")

    old_lines, new_lines = before.splitlines(), after.splitlines()
    changed = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old_lines, new_lines).get_opcodes():
        if tag != "equal":
            assert (tag, i2 - i1) == ("replace", j2 - j1), f"lines added or removed: {old_lines[i1:i2]}"
            changed += range(i1, i2)
    keys = dotted_keys_by_line(before)
    original = parse_yaml(before)
    differing = {key for key, value in preset.items() if _get(original, key) != value}
    assert {keys[number] for number in changed} == differing
    for number in changed:  # the value changes; the key, its indentation and a comment and its column stay
        old, new = old_lines[number], new_lines[number]
        assert new.split(":", 1)[0] == old.split(":", 1)[0]
        if "#" in old:
            assert new.find("#") == old.find("#") and new[new.find("#") :] == old[old.find("#") :]
        else:
            assert "#" not in new

    expected = parse_yaml(before)
    apply_overrides(expected, preset)
    assert parse_yaml(after) == expected
    assert load_params(params_file).model.name == "tiny"


def test_apply_writes_a_flow_list_null_and_float_as_yaml_reads_them_back(params_file):
    overrides = {"eval.stop": ["</answer>", "\n\n"], "sft.max_steps": None, "grpo.learning_rate": 3e-6}
    apply_to_file(overrides, params_file)
    params = load_params(params_file)
    assert (params.eval.stop, params.sft.max_steps, params.grpo.optimizer.learning_rate) == (
        ["</answer>", "\n\n"],
        None,
        3e-6,
    )


def test_apply_refuses_a_value_it_cannot_edit_in_place(tmp_path):
    path = tmp_path / "params.yaml"
    text = "sft:\n  lr: &lr 1.0e-5\ngrpo:\n  lr: *lr\n"
    path.write_text(text)
    with pytest.raises(ConfigError, match="anchor, alias or merge key"):
        apply_to_file({"grpo.lr": 2.0e-5}, path)
    assert path.read_text() == text


def test_dollar_paren_of_the_printed_words_gives_dvc_the_presets_values(tmp_path, full_scale_params):
    """The README's `dvc exp run $(python -m reasonrl.presets cpu)`, run by bash and DVC as written: bash splits the
    output at whitespace and removes no quotes, so the words must need none."""
    (tmp_path / "params.yaml").write_text(full_scale_params, encoding="utf-8")
    sections = sorted({key.split(".")[0] for key in load_preset("cpu")})
    (tmp_path / "dvc.yaml").write_text(f"stages:\n  noop:\n    cmd: 'true'\n    params: {sections}\n")
    identity = {f"GIT_{who}_{what}": "t" for who in ("AUTHOR", "COMMITTER") for what in ("NAME", "EMAIL")}
    env = {**os.environ, **identity, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    # A mapping as the dapo recipe prints it, through a $(…) too: bash would brace-expand it written out.
    mapping = {"grpo.overlong_penalty": {"buffer": 32, "max_penalty": 1.0}}
    (tmp_path.parent / f"{tmp_path.name}.words").write_text("\n".join(set_params_words(mapping)) + "\n")
    for command in (
        "git init -q && dvc init -q && git add -A && git commit -qm pipeline",
        f"dvc exp run $(python -m reasonrl.presets cpu) $(cat ../{tmp_path.name}.words)",
    ):
        result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    expected = parse_yaml(full_scale_params)
    apply_overrides(expected, load_preset("cpu") | mapping)
    assert parse_yaml((tmp_path / "params.yaml").read_text(encoding="utf-8")) == expected


def test_set_params_words_keep_strings_strings_and_refuse_what_a_shell_would_split_or_glob():
    assert set_params_words({"rollout.engine_device": "cuda:1", "x.version": "1.0", "eval.num_examples": None}) == [
        '-Srollout.engine_device="cuda:1"',
        '-Sx.version="1.0"',
        "-Seval.num_examples=null",
    ]
    for value in ("two words", "*.jsonl", ["</answer>"]):
        with pytest.raises(ConfigError, match=r"x\.y: .* a shell's \$\(…\) would split or glob; .* --apply"):
            set_params_words({"x.y": value})
    # A mapping in DVC's (Hydra's) grammar, whose keys are bare words: it refuses JSON's quoted ones.
    assert set_params_words({"grpo.overlong_penalty": {"buffer": 32, "max_penalty": 1.0, "x": None}}) == [
        "-Sgrpo.overlong_penalty={buffer:32,max_penalty:1.0,x:null}"
    ]
    with pytest.raises(ConfigError, match="key 'two words' is not a bare word"):
        set_params_words({"x.y": {"two words": 1}})


def test_help_shows_apply_as_a_flag_and_the_readme_forms():
    wide = {**os.environ, "COLUMNS": "120"}  # argparse wraps the usage line to the terminal's width
    result = subprocess.run([*PRESETS, "--help"], capture_output=True, text=True, check=True, env=wide)
    assert "usage: python -m reasonrl.presets [-h] [--params PARAMS] [--apply] name" in result.stdout
    assert "--apply PARAMS" not in result.stdout
    assert "dvc exp run $(python -m reasonrl.presets cpu)" in result.stdout
    assert "python -m reasonrl.presets cpu --apply && dvc repro" in result.stdout


def test_an_unknown_preset_is_one_error_line(params_file):
    result = subprocess.run([*PRESETS, "gpu9", "--params", str(params_file)], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "error: unknown preset 'gpu9'; available: ['cpu', 'dapo', 'dr_grpo', 'gspo']\n"


RECIPES = {"dapo": "arXiv:2503.14476", "dr_grpo": "arXiv:2503.20783", "gspo": "arXiv:2507.18071"}
"""Each recipe preset and the paper its header cites."""


def test_every_recipe_cites_its_paper_and_sets_the_same_grpo_loss_and_reward_keys():
    """The same keys in each, so applying one after another leaves the last one whole; no budget (max_tokens,
    batch sizes), so each composes with a scale preset; all of them grpo params."""
    assert set(RECIPES) < set(available())
    keys = {name: list(load_preset(name)) for name in RECIPES}
    assert all(recipe == keys["dapo"] for recipe in keys.values()), keys
    assert all(key.startswith("grpo.") for key in keys["dapo"])
    assert not {"grpo.max_tokens", "grpo.rollout_batch_size", "grpo.train_batch_size"} & set(keys["dapo"])
    for name, paper in RECIPES.items():
        header = (Path(__file__).parents[1] / f"src/reasonrl/presets/{name}.yaml").read_text().split("\ngrpo.")[0]
        assert paper in header, f"{name}.yaml cites no {paper}"


def missing_here(overrides: dict) -> list[str]:
    """What a recipe sets that this branch has not got yet: a ``grpo`` key, or a loss type (issue 32's other branch,
    losses/menu, adds ``grpo.loss_aggregation`` and the loss types ``gspo``, ``gspo_token``, ``cispo``)."""
    missing = [key for key in overrides if key.removeprefix("grpo.") not in GRPOConfig.KEYS]
    loss_type = overrides["grpo.loss_type"]
    return missing + ([f"grpo.loss_type {loss_type}"] if loss_type not in LOSS_TYPES else [])


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_recipe_applied_after_the_cpu_preset_is_a_valid_config_of_both(params_file, recipe):
    """`presets cpu --apply`, then `presets <recipe> --apply`: params that load, with the recipe's grpo settings
    and the CPU preset's scale. Where this branch lacks a key the recipe sets, the rest is applied and checked
    first, then the test skips naming it; a loss type it lacks skips it at once (the clip ranges are that loss
    type's)."""
    overrides, missing = load_preset(recipe), missing_here(load_preset(recipe))
    if any(entry.startswith("grpo.loss_type") for entry in missing):
        pytest.skip(f"{recipe}: not on this branch yet: {', '.join(missing)} (losses/menu adds them)")
    run = functools.partial(subprocess.run, check=True, capture_output=True, text=True)
    run([*PRESETS, "cpu", "--params", str(params_file), "--apply"])
    if missing:
        apply_to_file({key: value for key, value in overrides.items() if key not in missing}, params_file)
    else:
        run([*PRESETS, recipe, "--params", str(params_file), "--apply"])
        printed = run([*PRESETS, recipe, "--params", str(params_file)]).stdout.split()
        assert printed == set_params_words(overrides)  # the `dvc exp run $(…)` form of it too
    params = load_params(params_file)
    grpo = flat_dict(params.grpo)
    assert {key: grpo[key.removeprefix("grpo.")] for key in overrides if key not in missing} == {
        key: value for key, value in overrides.items() if key not in missing
    }
    cpu = load_preset("cpu")
    assert (params.model.name, params.grpo.sampling.max_tokens) == (cpu["model.name"], cpu["grpo.max_tokens"])
    if missing:
        pytest.skip(f"{recipe}: checked without {', '.join(missing)}, not on this branch yet (losses/menu adds it)")
