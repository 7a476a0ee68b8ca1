"""The source patches that let fairseq 0.12.2 install and import on Python 3.11 with torch 2.x (fairseq_peer.sh).

    python scripts/references/fairseq_patch.py setup TREE       # leave out the C++ extensions whose sources the
                                                                # sdist lacks, and the dataclass defaults below in
                                                                # fairseq's own configs
    python scripts/references/fairseq_patch.py dataclasses DIR  # `name: Config = Config()` fields become
                                                                # default_factory ones
    python scripts/references/fairseq_patch.py installed SITE   # `setup`'s source fixes, on an installed fairseq

Python 3.11 refuses a dataclass field whose default is an instance of a dataclass ("mutable default ... use
default_factory"); fairseq's configs and those of hydra-core 1.0, which it pins, have many.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

INSTANCE_DEFAULT = re.compile(r"^(\s+)(\w+): (\w+) = \3\(\)$", re.M)  # name: Config = Config()
INSTANCE_FIELD = re.compile(r"field\(default=([A-Z]\w*)\(\)\)")  # field(default=Config())


def drop_missing_extensions(tree: Path) -> None:
    """setup.py without the torch C++ extensions (BASE layers, NAT, alignment): the sdist lacks their sources."""
    setup = tree / "setup.py"
    text = setup.read_text()
    start = text.index("    extensions.extend(", text.index("from torch.utils import cpp_extension"))
    end = text.index('    if "CUDA_HOME" in os.environ:')
    setup.write_text(text[:start] + text[end:])


def read_factory_defaults(tree: Path) -> None:
    """hydra_init reads each config group's `.default`, which a default_factory field lacks: call the factory."""
    initialize = tree / "fairseq" / "dataclass" / "initialize.py"
    text = initialize.read_text()
    old = "        v = FairseqConfig.__dataclass_fields__[k].default\n"
    new = (
        "        f = FairseqConfig.__dataclass_fields__[k]\n"
        "        v = f.default_factory() if callable(f.default_factory) else f.default\n"
    )
    if old in text:
        initialize.write_text(text.replace(old, new))


def load_own_checkpoints(tree: Path) -> None:
    """fairseq's checkpoints pickle an argparse.Namespace, which torch >= 2.6 refuses to load by default
    (`weights_only=True`): its own files, written by the run beside it, are loaded as before."""
    utils = tree / "fairseq" / "checkpoint_utils.py"
    text = utils.read_text()
    old = 'state = torch.load(f, map_location=torch.device("cpu"))'
    if old in text:
        utils.write_text(
            text.replace(old, 'state = torch.load(f, map_location=torch.device("cpu"), weights_only=False)')
        )


def no_fast_path(tree: Path) -> None:
    """fairseq 0.12.2 sends inference through torch's BetterTransformer kernels with the signature of torch 1.13,
    which torch 2.x refuses ("Mask Type should be defined"): its plain layers are used, as in training."""
    for name in ("modules/transformer_layer.py", "models/transformer/transformer_encoder.py"):
        path = tree / "fairseq" / name
        text = path.read_text()
        for flag in ("BT_version", "NT_version"):
            text = text.replace(f"{flag} = True", f"{flag} = False")
        path.write_text(text)


def patch_dataclass_defaults(root: Path) -> None:
    """Every `name: Config = Config()` or `field(default=Config())` under `root` as `field(default_factory=Config)`."""
    for path in root.rglob("*.py"):
        source = path.read_text()
        patched = INSTANCE_DEFAULT.sub(r"\1\2: \3 = field(default_factory=\3)", source)
        patched = INSTANCE_FIELD.sub(r"field(default_factory=\1)", patched)
        if patched == source:
            continue
        imported = re.search(r"^from dataclasses import (.*)$", patched, re.M)
        if imported and "field" not in imported.group(1).split(", "):
            patched = patched.replace(imported.group(0), f"from dataclasses import field, {imported.group(1)}", 1)
        path.write_text(patched)
        print(f"patched {path}")


if __name__ == "__main__":
    what, where = sys.argv[1], Path(sys.argv[2])
    if what == "setup":
        drop_missing_extensions(where)
        patch_dataclass_defaults(where / "fairseq")
        read_factory_defaults(where)
        load_own_checkpoints(where)
        no_fast_path(where)
    elif what == "dataclasses":
        patch_dataclass_defaults(where)
    elif what == "installed":  # the fixes of `setup` applied to an installed fairseq (site-packages)
        read_factory_defaults(where)
        load_own_checkpoints(where)
        no_fast_path(where)
    else:
        sys.exit("usage: python scripts/references/fairseq_patch.py setup TREE | dataclasses DIR | installed SITE")
