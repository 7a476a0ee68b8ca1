"""The documentation is tested like code: README.md and every docs/ page.

- Every fenced block names its language; `yaml` blocks parse; relative links and images resolve (files and headings).
- `python` blocks run, in page order, one namespace per page, in a working directory laid out like a clone's root:
  configs/ and scripts/, ../shared/data, and a finished tiny pretraining run at runs/roformer-tiny/.
- `bash` blocks: every `roformer` command (also after `accelerate launch ... -m roformer`) is parsed by the real CLI
  parser and its --config found; scripts it names exist. A block marked `<!-- docs-test: run -->` is also executed,
  in the same working directory, between the page's python blocks.
- `<!-- docs-test: skip (reason) -->` before a block: not run (a hub download, a GPU, hours of training), but python
  still compiles, commands are still parsed, and every roformer name it uses must exist.
- Every `roformer.X` a page names, in a python block or in a code span, exists; so does every public name and model
  class, the docstrings that list the architectures name all of them, and the table of position encodings in
  docs/baselines.md is their declarations'.
- The site builds with mkdocs (strict), offline.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from helpers import REPO, SHARED_DATA

import roformer
from roformer.cli import build_parser
from roformer.config import find_config, shipped_config

PAGES = [REPO / "README.md", REPO / "CHANGELOG.md"] + sorted((REPO / "docs").glob("*.md"))
LANGUAGES = {"bash", "python", "yaml", "text"}
MARKER = re.compile(r"<!--\s*docs-test:\s*(run|skip)\b(.*?)-->")
FENCE = re.compile(r"^```(\S*)\s*$")
# the folder a command looks a shipped config name up in (roformer.cli)
CONFIG_FOLDER = {
    "pretrain": "pretrain",
    "prepare-data": "pretrain",
    "finetune": "glue",
    "glue": "glue",
    "suite": "glue",
}
CONFIG_FOLDER["experiment"] = "experiments"


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    marker: str | None  # "run", "skip" or None

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    found, lines = [], page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        marker = MARKER.search(before)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        code = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(page, i + 1, match[1], code, marker[1] if marker else None))
        i = end + 1
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]


def page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


def test_the_docs_exist() -> None:
    names = {p.name for p in (REPO / "docs").glob("*.md")}
    topics = {"pretraining.md", "fine-tuning.md", "experiments.md", "speed.md", "extensions.md", "models.md"}
    assert topics | {"index.md", "install.md", "architecture.md", "cli.md", "baselines.md"} <= names
    assert len((REPO / "README.md").read_text().splitlines()) <= 150, "the README is the landing page: keep it short"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_marker_is_a_known_one_on_the_line_before_a_block(page: Path) -> None:
    lines = page.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if "docs-test" not in line:
            continue
        assert MARKER.search(line), f"{page.name}:{i + 1}: not a docs-test marker (run or skip (reason)): {line}"
        following = next((x for x in lines[i + 1 :] if x.strip()), "")
        assert FENCE.match(following), f"{page.name}:{i + 1}: a marker must be the line before a code block"


def test_every_block_names_its_language() -> None:
    unnamed = [f"{b} ({b.language or 'no language'})" for b in ALL_BLOCKS if b.language not in LANGUAGES]
    assert not unnamed, unnamed


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.language == "yaml"], ids=str)
def test_yaml_blocks_parse(block: Block) -> None:
    yaml.safe_load(block.code)


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.language == "python"], ids=str)
def test_python_blocks_compile(block: Block) -> None:
    compile(block.code, str(block), "exec")


# --- names: what a page or a docstring says exists --------------------------------------------------------------


def resolve(dotted: str) -> object:
    """The object `roformer.a.b.C` names, importing submodules on the way.

    Raises:
        AttributeError or ImportError: no such name.
    """
    parts = dotted.split(".")
    value: object = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            value = getattr(value, part)
        except AttributeError:
            if not isinstance(value, ModuleType):
                raise
            value = importlib.import_module(".".join(parts[: i + 1]))  # a submodule no one has imported yet
    return value


def roformer_names(code: str, modules: dict[str, str]) -> set[str]:
    """The dotted roformer names a python block uses, found in its syntax tree: nothing is run.

    `from roformer.x import A` uses `roformer.x.A`; `import roformer.x` uses `roformer.x`; an attribute chain on a
    name bound to a roformer module (`roformer.CausalLM`, `roformer.model.masks.KVCache`) uses the whole chain.
    `modules` maps a local name to the module `import` bound it to; an earlier block of the page fills it (a page
    is one namespace), and `roformer` itself is always known.
    """
    tree = ast.parse(code)
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.partition(".")[0] == "roformer":
                    used.add(alias.name)
                    modules[alias.asname or "roformer"] = alias.name if alias.asname else "roformer"
        elif (
            isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").partition(".")[0] == "roformer"
        ):
            used.update(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
    for node in ast.walk(tree):
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if chain and isinstance(node, ast.Name) and node.id in modules:
            used.add(".".join([modules[node.id], *reversed(chain)]))
    return used


def missing(names: set[str]) -> list[str]:
    """Those of `names` that do not resolve, with why."""
    absent = []
    for name in sorted(names):
        try:
            resolve(name)
        except (AttributeError, ImportError) as e:
            absent.append(f"{name} ({type(e).__name__}: {e})")
    return absent


def pages_with_python() -> list[Path]:
    return [p for p in PAGES if any(b.language == "python" for b in blocks(p))]


@pytest.mark.parametrize("page", pages_with_python(), ids=page_id)
def test_every_roformer_name_a_python_block_uses_exists(page: Path) -> None:
    """Skipped blocks too (a hub download, minutes of training): never run, their names are checked here."""
    modules = {"roformer": "roformer"}
    for block in blocks(page):
        if block.language == "python":
            absent = missing(roformer_names(block.code, modules))
            assert not absent, f"{block} ({block.marker or 'run'}): {absent}"


CODE_SPAN = re.compile(r"`(roformer(?:\.[A-Za-z_]\w*)+)(?:\(.*?\))?`")


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "CHANGELOG.md"], ids=page_id)
def test_every_roformer_name_in_the_prose_exists(page: Path) -> None:
    """`roformer.load`, `roformer.model.onnx.export_onnx(...)` in the text (the changelog may name what is gone)."""
    assert not missing(set(CODE_SPAN.findall(prose(page))))


def test_every_model_class_is_public_and_in_the_package_docstring() -> None:
    from roformer.model.model import ARCHITECTURES

    for cls in ARCHITECTURES.values():
        assert cls.__name__ in roformer.__all__ and getattr(roformer, cls.__name__) is cls
        assert f"`{cls.__name__}`" in (roformer.__doc__ or ""), cls.__name__
    assert not missing({f"roformer.{name}" for name in roformer.__all__})


def documented(target: object) -> str:
    return inspect.getdoc(target) or ""


def test_docstrings_that_list_architectures_name_every_one_and_point_to_the_encodings() -> None:
    """The architectures live in roformer.model.config (ARCHITECTURE_NAMES); these docstrings repeat them. The position
    encodings are declared by their modules: these docstrings point to their generated table instead."""
    from roformer.model import config, hf, layers, model, pretrained

    package = importlib.import_module("roformer.model")
    for target in (package, model, model.load, pretrained.load_pretrained, hf.from_hf):
        absent = [name for name in config.ARCHITECTURE_NAMES if f"`{name}`" not in documented(target)]
        assert not absent, f"{getattr(target, '__name__', target)} does not name the architectures {absent}"
    for target in (package, model, layers, config.ModelConfig):
        assert "docs/baselines.md" in " ".join(documented(target).split()), getattr(target, "__name__", target)


def test_the_docs_table_of_encodings_is_their_declarations() -> None:
    from roformer.model.config import TABLE_END, TABLE_START, encodings_table

    text = (REPO / "docs" / "baselines.md").read_text()
    shown = text[text.index(TABLE_START) : text.index(TABLE_END) + len(TABLE_END)]
    assert shown == encodings_table(), "docs/baselines.md: paste roformer.model.config.encodings_table() in its place"


# --- links ---------------------------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped (not - or _), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m[1]) for m in re.finditer(r"^#+\s+(.*)$", prose(page), flags=re.M)}


def prose(page: Path) -> str:
    """The page without its code blocks (a `[x](y)` inside code is not a link)."""
    return re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert not broken, broken


# --- commands ------------------------------------------------------------------------------------------------------


def commands(code: str) -> list[str]:
    """The logical lines of a bash block: continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def roformer_invocations(line: str) -> list[list[str]]:
    """The argument lists of every `roformer` command in a shell line (`a && b`, `accelerate launch -m roformer`)."""
    found = [shlex.split(inner) for inner in re.findall(r"\$\(roformer ([^)]*)\)", line)]  # "$(roformer configs x)"
    for part in re.split(r"&&|\|\||;|\|", line):
        words = shlex.split(re.sub(r'"\$\([^)]*\)"|\$\([^)]*\)', "SUBSTITUTED", part), comments=True)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]
        if words[:1] == ["roformer"]:
            found.append(words[1:])
        elif "-m" in words and words[words.index("-m") + 1 : words.index("-m") + 2] == ["roformer"]:
            found.append(words[words.index("-m") + 2 :])
    return found


def check_command(args: list[str]) -> None:
    parsed = build_parser().parse_args(args)  # SystemExit(2) on an unknown option or command
    config = getattr(parsed, "config", None)
    if config and parsed.command in CONFIG_FOLDER:
        find_config(config, CONFIG_FOLDER[parsed.command])
    if parsed.command == "configs" and parsed.name:
        shipped_config(parsed.name)


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.language == "bash"], ids=str)
def test_bash_commands_parse(block: Block, capsys: pytest.CaptureFixture) -> None:
    for line in commands(block.code):
        for args in roformer_invocations(line):
            if args in (["--version"], ["--help"]) or args[-1:] == ["--help"]:
                continue
            try:
                check_command(args)
            except SystemExit as e:
                message = capsys.readouterr().err.strip()
                pytest.fail(f"{block}: `roformer {' '.join(args)}` does not parse ({e.code}): {message}")
        for script in re.findall(r"(scripts/[\w./-]+\.(?:py|sh))", line):
            assert (REPO / script).is_file(), f"{block}: {script} does not exist"


# --- running the pages ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny pretraining run (final/ with model and tokenizer), as `roformer pretrain` writes it."""
    run = tmp_path_factory.mktemp("docs-run") / "roformer-tiny"
    overrides = ["train.max_steps=30", "data.builtin_documents=2000", "train.eval_every=10", "train.save_every=30"]
    command = [
        sys.executable,
        "-m",
        "roformer",
        "pretrain",
        "--config",
        str(REPO / "configs/pretrain/roformer-tiny.yaml"),
    ]
    command += [arg for item in overrides + ["train.progress=false"] for arg in ("--set", item)]
    subprocess.run(command + ["--output-dir", str(run)], check=True, capture_output=True, timeout=600)
    return run


@pytest.fixture
def clone_root(tmp_path: Path, tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory laid out like a clone's root, with a tiny pretraining run in runs/roformer-tiny."""
    root = tmp_path / "work"
    (root / "runs").mkdir(parents=True)
    for name in ("configs", "scripts", "notebooks"):
        (root / name).symlink_to(REPO / name)
    (root / "runs" / "roformer-tiny").symlink_to(tiny_run)
    if SHARED_DATA.is_dir():
        (tmp_path / "shared").mkdir()
        (tmp_path / "shared" / "data").symlink_to(SHARED_DATA)
    monkeypatch.chdir(root)
    return root


def runnable_pages() -> list[Path]:
    return [p for p in PAGES if any(b.language == "python" or b.marker == "run" for b in blocks(p))]


@pytest.mark.parametrize("page", runnable_pages(), ids=page_id)
def test_page_runs(page: Path, clone_root: Path) -> None:
    namespace: dict = {"__name__": "__docs__"}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for block in blocks(page):
        if block.marker == "skip":
            continue
        if block.language == "python":
            exec(compile(block.code, str(block), "exec"), namespace)
        elif block.language == "bash" and block.marker == "run":
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.code],
                cwd=clone_root,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"{block}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="needs mkdocs (pip install -e '.[dev]')")
def test_the_site_builds_offline(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    pages = {"index.html"} | {f"{p.stem}/index.html" for p in (REPO / "docs").glob("*.md") if p.stem != "index"}
    assert pages <= built, pages - built
