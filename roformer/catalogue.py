"""The shipped configs: the repository's configs/ folder, installed into the package as roformer/configs.

Found by name as well as by path: `find_config` (`roformer-tiny`, `glue/rte`; a path wins) is what every `--config`
means, `shipped_config` what `roformer configs NAME` prints, `configs_listing` what `roformer configs` prints. The one
table of their folders, with what each is for, is SHIPPED_FOLDERS.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from roformer.errors import ConfigError, UserError

# The shipped configs: in a wheel they are package data (pyproject.toml maps the repository's configs/ folder to
# roformer/configs); in a clone or an editable install they are the repository's configs/ folder.
_PACKAGE_DIR = Path(__file__).resolve().parent
INSTALLED_CONFIGS = _PACKAGE_DIR / "configs"
CHECKOUT_CONFIGS = _PACKAGE_DIR.parent / "configs"

# The folders of shipped configs and what each is for, in the order a stem that several of them have is looked up
# (`roformer-tiny` is pretrain/roformer-tiny before model/roformer-tiny) and `roformer configs` lists them.
SHIPPED_FOLDERS = {
    "pretrain": "roformer pretrain, prepare-data, eval-mlm --data (the folder may be left out of the name)",
    "glue": "roformer finetune (a task) and roformer glue (a suite); the folder may be left out",
    "finetune": "roformer finetune: NER, QA, multiple choice, CLUE, your own files (recipe.yaml: what they include)",
    "experiments": "roformer experiment (the folder may be left out)",
    "model": "the model: section of a pretraining config",
    "accelerate": 'accelerate launch --config_file "$(roformer configs accelerate/NAME)" -m roformer ...',
    "synthetic": "roformer finetune: the length-generalization tasks, a model trained from scratch (init: '')",
    "translation": "roformer finetune: an encoder-decoder trained from scratch; roformer translate reads its best/",
}


def shipped_configs_dir() -> Path | None:
    """The folder of the shipped configs: the installed package's, else the clone's (None if neither is there)."""
    if INSTALLED_CONFIGS.is_dir():
        return INSTALLED_CONFIGS
    if (CHECKOUT_CONFIGS / "pretrain").is_dir() and (_PACKAGE_DIR.parent / "pyproject.toml").is_file():
        return CHECKOUT_CONFIGS
    return None


def shipped_configs() -> dict[str, Path]:
    """{name: file} of every shipped config, named `folder/stem` (`pretrain/roformer-tiny`), in name order."""
    root = shipped_configs_dir()
    if root is None:
        return {}
    return {p.relative_to(root).with_suffix("").as_posix(): p for p in sorted(root.rglob("*.yaml"))}


def config_summary(path: Path, width: int = 100) -> str:
    """The first sentence of a config file's header comment (without a leading `name:`), at most `width` characters."""
    header = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("# ").strip())
    text = " ".join(header).removeprefix(f"{path.stem}: ")
    sentences = re.split(r"(?<=\.)\s+(?=[A-Z])", text)  # not after "et al. 2021" or "sec. 4.4"
    summary = sentences[0].rstrip(".")
    return summary if len(summary) <= width else summary[: width - 3].rstrip() + "..."


def configs_listing() -> str:
    """What `roformer configs` prints: every shipped config by folder, with its header's first sentence.

    Raises:
        UserError: this installation ships no configs.
    """
    configs = shipped_configs()
    if not configs:
        raise UserError("no shipped configs found: this installation has no roformer/configs folder")
    folders = list(SHIPPED_FOLDERS) + sorted({n.split("/")[0] for n in configs} - set(SHIPPED_FOLDERS))
    lines = [f"shipped configs in {shipped_configs_dir()} (a name works where --config wants a file; a path wins)"]
    for folder in folders:
        names = [name for name in configs if name.split("/")[0] == folder]
        if names:
            lines.append(f"\n{folder}/: {SHIPPED_FOLDERS.get(folder, '')}".rstrip(": "))
            width = max(len(name) for name in names)
            lines += [f"  {name:<{width}}  {config_summary(configs[name])}" for name in names]
    lines.append(
        "\nroformer configs NAME prints the file's path. To start your own, copy the whole folder: the files refer to"
        " each other by relative paths (model: ../model/x.yaml)"
    )
    return "\n".join(lines)


def shipped_config(name: str) -> Path:
    """The shipped config called `name`: its `folder/stem`, or a stem, looked up in SHIPPED_FOLDERS order.

    Raises:
        ConfigError: no shipped config of that name.
    """
    found = _shipped_by_name(name, tuple(SHIPPED_FOLDERS))
    if found is None:
        raise ConfigError(f"{name}: no shipped config of that name (`roformer configs` lists them)")
    return found


def _shipped_by_name(name: str, folders: tuple[str, ...]) -> Path | None:
    """The shipped config `name` (`.yaml` and a leading `configs/` optional), else `folder/name` for each folder."""
    configs = shipped_configs()
    name = name.removesuffix(".yaml").removeprefix("configs/")
    for candidate in [name] + [f"{folder}/{name}" for folder in folders]:
        if candidate in configs:
            return configs[candidate]
    return None


def find_config(value: str | Path, folder: str) -> Path:
    """The config file that a `--config` value means: a path if that file exists, else a shipped config's name.

    Names are relative to the shipped configs folder, with or without `.yaml` and the command's own `folder`
    (`roformer-tiny` for `pretrain`, `glue/rte` or `rte` for `glue`); a leading `configs/` is accepted, so the
    repository's documented paths (`configs/pretrain/roformer-tiny.yaml`) also work from an installed package.

    Raises:
        ConfigError: neither a file nor a shipped config's name.
    """
    path = Path(value)
    if path.is_file():
        return path
    if not path.is_absolute() and ".." not in path.parts:  # a name never leaves the configs folder
        found = _shipped_by_name(path.as_posix(), (folder,))
        if found is not None:
            logging.getLogger(__name__).info("%s: no such file, using the shipped config %s", value, found)
            return found
    if path.is_dir():
        raise ConfigError(f"{value}: is a directory, not a config file (nor a shipped config's name)")
    raise ConfigError(
        f"{value}: config file not found, nor a shipped config of that name (`roformer configs` lists them)"
    )
