"""The shipped configs: the repository's configs/ folder, installed into the package as roformer/configs.

Found by name as well as by path: `find_config` (`roformer-tiny`, `glue/rte`; a path wins) is what every `--config`
means, `named_config` what a name inside a config means (roformer.config_paths.config_file: `include:`, an experiment's
arms, a suite's tasks), `shipped_config` what `roformer configs NAME` prints, `configs_listing` what `roformer
configs` prints. The one table of their folders, with what each is for, is SHIPPED_FOLDERS.

Their data paths start from the data root (`glue_dir: ${ROFORMER_DATA}/glue`): `data_root`, which a user sets once.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from roformer.errors import ConfigError, UserError

# The shipped configs: in a wheel they are package data (pyproject.toml maps the repository's configs/ folder to
# roformer/configs); in a clone or an editable install they are the repository's configs/ folder.
_PACKAGE_DIR = Path(__file__).resolve().parent
INSTALLED_CONFIGS = _PACKAGE_DIR / "configs"
CHECKOUT_CONFIGS = _PACKAGE_DIR.parent / "configs"

# The data root: the shipped configs' data paths start from `${ROFORMER_DATA}` (roformer.config_paths expands it)
DATA_ROOT_VARIABLE = "ROFORMER_DATA"
DEFAULT_DATA_FOLDER = "data"  # without the variable: ./data in the working directory
CHECKOUT_DATA = _PACKAGE_DIR.parent.parent / "shared" / "data"  # the project's own layout: ../shared/data by a clone

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


def data_root() -> Path:
    """Where the shipped configs' data paths start (`glue_dir: ${ROFORMER_DATA}/glue`): one folder, set once.

    The environment variable ROFORMER_DATA when it is set (relative to the working directory, `~` expanded); else,
    in a clone whose ../shared/data is there, that folder (the project's own layout: its tests and CI read it);
    else `data/` in the working directory.
    """
    value = os.environ.get(DATA_ROOT_VARIABLE, "").strip()
    if value:
        return Path(os.path.abspath(os.path.expanduser(value)))
    if shipped_configs_dir() == CHECKOUT_CONFIGS and CHECKOUT_DATA.is_dir():
        return CHECKOUT_DATA.resolve()
    return Path.cwd() / DEFAULT_DATA_FOLDER


def data_root_origin() -> str:
    """How `data_root` was decided, in a few words (for `roformer configs`)."""
    if os.environ.get(DATA_ROOT_VARIABLE, "").strip():
        return f"set by {DATA_ROOT_VARIABLE}"
    if data_root() == Path.cwd() / DEFAULT_DATA_FOLDER:
        return f"./{DEFAULT_DATA_FOLDER} in the working directory, as {DATA_ROOT_VARIABLE} is not set"
    return f"the clone's ../shared/data, as {DATA_ROOT_VARIABLE} is not set"


def missing_data_hint(path: str | Path, key: str, hub: bool = False, value: str = "PATH") -> str:
    """How to give missing data, in its one-line error: the key to set, the data root, the hub.

    The data root only when `path` lies under it (setting it moves every shipped config's data at once); the hub
    where the config names a hub dataset (`hub`). `value` is what `--set KEY=` takes (`"[PATH]"` for a list).
    """
    ways = [f"give it with --set {key}={value}"]
    root = data_root()
    if Path(path).is_relative_to(root):
        ways.append(f"set {DATA_ROOT_VARIABLE}=DIR (the shipped configs' data root, now {root})")
    if hub:
        ways.append("read the data from the hub: --set data.source=hub")
    return ", or ".join(ways)


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
    lines = [
        f"shipped configs in {shipped_configs_dir()} (a name works wherever a config file is named; a path wins)",
        f"their data paths start from {data_root()} ({data_root_origin()}; {DATA_ROOT_VARIABLE}=DIR moves it)",
    ]
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


def named_config(value: str | Path, folders: tuple[str, ...] = tuple(SHIPPED_FOLDERS)) -> Path | None:
    """The shipped config that `value` names (`glue/rte`; a stem such as `rte` looked up in `folders`), or None.

    A path that leaves the configs folder (absolute, or with `..`) is never a name.
    """
    path = Path(value)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        return None
    return _shipped_by_name(path.as_posix(), folders)


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
    found = named_config(path, (folder,))
    if found is not None:  # a name given on purpose: no warning
        logging.getLogger(__name__).debug("%s: the shipped config %s", value, found)
        return found
    if path.is_dir():
        raise ConfigError(f"{value}: is a directory, not a config file (nor a shipped config's name)")
    raise ConfigError(
        f"{value}: config file not found, nor a shipped config of that name (`roformer configs` lists them)"
    )
