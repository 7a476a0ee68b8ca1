"""The package's architecture, checked: data flows one way (cli -> study / embed -> train -> tasks -> data / model ->
base) and down the rooms of each floor, no import cycles, reporting without torch, a docstring per module, one
formatter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

PACKAGE = REPO / "roformer"
BASE = {
    "roformer.config",
    "roformer.config_yaml",
    "roformer.config_paths",
    "roformer.catalogue",
    "roformer.files",
    "roformer.labels",
    "roformer.errors",
    "roformer.logs",
    "roformer.plugins",
    "roformer.version",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: names for annotations, never imported when the code runs."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skipped |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    return skipped


def imports_of(path: Path, name: str, type_only: bool = False) -> set[str]:
    """Every roformer module imported anywhere in the file (top level and inside functions; type-only imports too with
    `type_only`)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    tree = ast.parse(path.read_text())
    skipped = set() if type_only else type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "roformer"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base])
            if base.split(".")[0] == "roformer":
                known = modules()
                for alias in node.names:  # `from roformer.data import mlm` imports a module
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return found


def floor(name: str) -> int:
    if name in BASE:
        return 1
    if name.startswith(("roformer.model.", "roformer.data.")) or name in ("roformer.model", "roformer.data"):
        return 2
    if name.startswith("roformer.tasks"):
        return 3
    if name.startswith("roformer.train"):
        return 4
    if name.startswith("roformer.study") or name == "roformer.embed":
        return 5
    if name.startswith("roformer.commands"):
        return 6
    return {"roformer.cli": 7, "roformer.__main__": 8, "roformer": 0}[name]


def graph(type_only: bool = False) -> dict[str, set[str]]:
    return {name: imports_of(path, name, type_only) - {name} for name, path in modules().items()}


def test_imports_run_down_the_floors_only() -> None:
    upward = []
    for name, targets in graph().items():
        if name == "roformer":  # the public API: names resolved lazily with importlib
            continue
        for target in targets:
            if target == "roformer":
                upward.append(f"{name} imports the package itself")
            elif floor(target) > floor(name):
                upward.append(f"{name} -> {target}")
            elif floor(target) == floor(name) == 2 and name.split(".")[1] != target.split(".")[1]:
                upward.append(f"{name} -> {target} (data and model are independent)")
    assert not upward, upward


# Rooms inside each floor, lowest first: a module imports only modules of lower rooms of its own package. The data
# floor reads the way data flows: its config, then text and tokens, then blocks and stores, then the batches.
# A module of roformer.tasks that declares task types (`SPECS = (...)` at its top level) and is not listed by name is in
# the room marked TASK_TYPES: a new type is one module and no edit here (the registry finds it the same way). Type
# modules are listed only where one must sit above another.
TASK_TYPES = "<a module declaring SPECS>"
# The same for the position encodings: a module of roformer.model that declares `ENCODINGS` and is not listed by name
# is in the room marked ENCODINGS, above the encodings it may build on (rotary, relative) and below `positions`.
ENCODINGS = "<a module declaring ENCODINGS>"
DECLARATIONS = {TASK_TYPES: "SPECS", ENCODINGS: "ENCODINGS"}
ROOMS = {
    "roformer.model": [
        {"config", "search"},
        {"weights", "flops", "hf_files"},
        {"terms"},
        {"rotary", "relative"},
        {ENCODINGS},  # the encodings after the paper: p_rope, fire, any new one
        {"positions"},
        {"dropout", "layouts", "masks"},
        {"attention", "generation", "beam"},
        {"layers", "plan"},
        {"backbone"},
        {"heads"},
        {"seq2seq"},
        {"model"},
        {"hf_mapping"},
        {"hf", "onnx"},
        {"pretrained"},
    ],
    "roformer.data": [
        {"builtin", "text", "masking", "sampling", "token_store"},
        {"config"},
        {"tokenizer", "packing"},
        {"corpus", "cache", "segment"},
        {"store", "streaming"},
        {"mlm"},
    ],
    "roformer.tasks": [
        {"baselines", "extensions"},  # under base: the protocol's default baseline and test variants
        {
            "base",
            "registry",
            "records",
            "objectives",
            "glue_tasks",
            "glue_metrics",
            "tagging_metrics",
            "qa_metrics",
            "ir_metrics",
            "mt_metrics",
        },  # fmt: skip
        {"config", "beir", "parallel", "synthetic_rows"},
        {"texts", "conll", "squad", "translator", "synthetic_floors", "build"},
        {TASK_TYPES},  # the type modules: glue, classify, tagging, qa, choices, similarity, triplet, any new one
        {"retrieval"},  # listed: a type module above another (it imports similarity's pair batches)
        {"rerank"},  # reads retrieval's runs
    ],
    "roformer.train": [
        {"config", "interval", "faults", "checkpoints", "evaluate", "sharded", "averaging", "results_card"},
        {"launch", "optim", "run_dir", "recipe"},
        {"stages"},
        {"engine"},
        {"predict"},
        {"finetune_run"},
        {"pretrain", "finetune", "embed"},
    ],
    "roformer.commands": [
        {"common"},
        {"models", "runs", "studies"},
    ],
    "roformer.study": [
        {"outputs", "markdown", "runs", "length_eval"},
        {"stats", "plots", "report", "suite"},
        {"compare", "probes", "decay", "translation_study"},
        {"experiment_config"},  # the configs of both kinds of experiment: read by the task study and the experiment
        {"task_study"},
        {"experiment", "hub"},
    ],
}


def declares(path: Path, name: str = "SPECS") -> bool:
    """Whether the module assigns `name` at its top level: `SPECS` (roformer.tasks.registry collects such modules'
    types) or `ENCODINGS` (roformer.model.config.encodings collects their position encodings)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def room(name: str, path: Path | None = None) -> tuple[str, int] | None:
    """(package, room index) of a module of a floor with declared rooms; None for the package modules themselves.

    Args:
        name: The module's dotted name.
        path: Its file (default: the package's own); a module not listed by name is placed by its contents.
    """
    package, _, leaf = name.rpartition(".")
    if package not in ROOMS:
        return None
    rooms = [i for i, members in enumerate(ROOMS[package]) if leaf in members]
    if not rooms:
        path = path or modules().get(name)
        marks = [mark for mark, variable in DECLARATIONS.items() if path is not None and declares(path, variable)]
        rooms = [i for i, members in enumerate(ROOMS[package]) if set(marks) & members]
    assert rooms, f"{name} is in no room of tests/unit/test_layout.py ROOMS: place it"
    return package, rooms[0]


def test_imports_inside_a_floor_run_down_its_rooms() -> None:
    upward = []
    for name, targets in graph().items():
        here = room(name)
        for target in targets:
            there = room(target)
            if here and there and here[0] == there[0] and there[1] >= here[1]:
                upward.append(f"{name} -> {target}")
    assert not upward, upward


def test_the_room_checker_catches_an_import_up_a_room(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text("from roformer.data.mlm import MLMBatches\n")  # as if data.config imported the batches
    (target,) = imports_of(path, "roformer.data.config")
    assert room(target)[1] > room("roformer.data.config")[1]


def test_a_new_type_module_is_in_the_types_room_without_an_edit(tmp_path: Path) -> None:
    """A module declaring SPECS is placed by what it holds; any other module must be listed (no room by default)."""
    declaring = tmp_path / "toy_type.py"
    declaring.write_text('"""A toy type."""\n\nfrom roformer.tasks.base import TaskSpec\n\nSPECS: tuple = ()\n')
    types_room = next(i for i, members in enumerate(ROOMS["roformer.tasks"]) if TASK_TYPES in members)
    assert room("roformer.tasks.toy_type", declaring) == ("roformer.tasks", types_room)
    assert room("roformer.tasks.glue") == ("roformer.tasks", types_room)  # a shipped type, listed by no name either
    assert room("roformer.tasks.retrieval")[1] > types_room  # listed: above the types it imports
    reader = tmp_path / "toy_reader.py"
    reader.write_text('"""A reader."""\n\n\ndef specs() -> None:\n    SPECS = ()\n    return SPECS\n')
    with pytest.raises(AssertionError, match="toy_reader is in no room"):
        room("roformer.tasks.toy_reader", reader)  # SPECS inside a function declares nothing


def test_a_new_encoding_module_is_in_the_encodings_room_without_an_edit(tmp_path: Path) -> None:
    """A module of roformer.model declaring ENCODINGS is placed by what it holds, above rotary and relative."""
    declaring = tmp_path / "toy_encoding.py"
    declaring.write_text('"""A toy encoding."""\n\nENCODINGS: tuple = ()\n')
    encodings_room = next(i for i, members in enumerate(ROOMS["roformer.model"]) if ENCODINGS in members)
    assert room("roformer.model.toy_encoding", declaring) == ("roformer.model", encodings_room)
    assert room("roformer.model.rotary")[1] < encodings_room < room("roformer.model.positions")[1]


@pytest.mark.parametrize("type_only", [False, True], ids=["imports", "type-only imports included"])
def test_no_import_cycles(type_only: bool) -> None:
    edges = graph(type_only)
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join(path + [node, nxt]))
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])


def test_the_floor_checker_catches_an_upward_import(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text("from roformer.train.engine import Engine\n")
    assert floor("roformer.data.mlm") < max(floor(t) for t in imports_of(path, "roformer.data.mlm"))


def test_reporting_imports_no_torch() -> None:
    code = "import sys, roformer.study.compare, roformer.train.run_dir; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_command_line_parser_imports_no_torch() -> None:
    """Every command's options are built at start-up: torch (a second or more) loads only for the command that runs."""
    code = "import sys, roformer.cli; roformer.cli.build_parser(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_public_api() -> None:
    import roformer

    names = [
        "Backbone",
        "CausalLM",
        "CheckpointError",
        "ConfigError",
        "EncoderDecoder",
        "EncoderDecoderConfig",
        "MaskedLM",
        "Model",
        "ModelConfig",
        "ModelOutput",
        "MultipleChoice",
        "QuestionAnswering",
        "SentenceEncoder",
        "Seq2SeqOutput",
        "SequenceClassifier",
        "TokenClassifier",
        "UserError",
        "convert_rotary_layout",
        "from_hf",
        "load",
        "to_hf",
    ]
    assert sorted(set(roformer.__all__) - {"__version__"}) == names
    for name in names:
        assert getattr(roformer, name) is not None


def test_modules_say_what_they_are_for() -> None:
    """Every module opens with its purpose. (No line cap: a room is as big as what belongs together in it.)"""
    for name, path in modules().items():
        assert ast.get_docstring(ast.parse(path.read_text())), f"{name} has no module docstring"


def test_code_is_formatted_by_ruff_format() -> None:
    """One formatter for the package, the tests and the scripts (`ruff format`, line length 120), no opt-outs."""
    import shutil

    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    done = subprocess.run(
        [ruff, "format", "--check", "roformer", "tests", "scripts"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    skips = [str(p) for p in (REPO / "roformer").rglob("*.py") if "fmt: skip" in p.read_text()]
    assert not skips, skips


def test_every_dotted_name_in_the_code_exists() -> None:
    """A docstring or comment that cites `roformer.x.y.name` cites something that is there (moves leave none behind)."""
    import importlib
    import re

    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for reference in sorted(set(re.findall(r"roformer(?:\.[A-Za-z_]\w*)+", path.read_text()))):
            parts = reference.split(".")
            for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
                try:
                    found: object = importlib.import_module(".".join(parts[:i]))
                    break
                except ImportError:
                    continue
            for name in parts[i:]:
                found = getattr(found, name, None)
            if found is None:
                missing.append(f"{path.relative_to(REPO)}: {reference}")
    assert not missing, missing


def test_no_two_modules_of_a_package_define_a_function_of_one_name() -> None:
    """`summarise` in two study modules reads as one function; each top-level function name is its package's own."""
    defined: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                key = (str(path.parent.relative_to(REPO)), node.name)
                defined.setdefault(key, []).append(path.name)
    repeated = {f"{package}: {name}": files for (package, name), files in defined.items() if len(files) > 1}
    assert not repeated, repeated
