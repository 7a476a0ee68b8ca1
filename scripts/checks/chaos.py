"""Chaos test: kill, stop, corrupt and starve a tiny pretraining run, and check that it always ends as if untouched.

    python scripts/checks/chaos.py             # 20 SIGKILL + 5 SIGTERM + corruption + disk full (~10 min on 2 CPUs)
    python scripts/checks/chaos.py --kills 5 --terms 2 --steps 30

What it does, with a seeded choice of moments:
1. an uninterrupted reference run (dropout on, a checkpoint every few steps);
2. one run killed with SIGKILL `--kills` times: after a chosen training step, while a checkpoint is being written
   (its hidden `.tmp-step-N` directory exists), or during start-up; resumed with `--resume` after each kill;
3. one run stopped with SIGTERM `--terms` times after chosen steps: it must exit with code 75 having lost no step
   (its newest checkpoint is the last step it trained), then resume;
4. the newest checkpoint of a finished run's copy is truncated: `--resume` must fall back to the previous one;
5. a disk that fills up (a small tmpfs when run as root, else a file-size limit, which fails the same writes with
   EFBIG): the run must exit with code 74, the previous checkpoint intact, and resume elsewhere.
Every run must end with the reference's train and eval events (every number but wall-clock timings) and identical
final weights.
It prints one table and exits 1 if anything differs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
EXIT_PREEMPTED, EXIT_WRITE_FAILED = 75, 74


def write_config(path: Path, steps: int, cache: Path) -> Path:
    """A tiny pretraining config: 2 layers x 32, built-in corpus, a checkpoint every 3 steps, dropout on."""
    config = {
        "model": {
            "vocab_size": 300,
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
            "hidden_dropout": 0.1,
            "attention_dropout": 0.1,
        },
        "data": {"builtin_documents": 300, "vocab_size": 300, "max_seq_len": 32, "cache_dir": str(cache)},
        "train": {
            "max_steps": steps,
            "batch_size": 4,
            "lr": 1e-3,
            "log_every": 4,
            "eval_every": 6,
            "save_every": 3,
            "keep_checkpoints": 2,
            "progress": False,
        },
    }
    path.write_text(yaml.safe_dump(config))
    return path


def launch(config: Path | None, out: Path, resume: bool, limit_bytes: int | None = None) -> subprocess.Popen:
    """Start `roformer pretrain` (fresh, or --resume) in a new process."""
    args = [sys.executable, "-m", "roformer", "pretrain", "--output-dir", str(out)]
    args += ["--resume"] if resume else ["--config", str(config)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    def limit_file_size() -> None:  # writes beyond the limit fail with EFBIG instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.Popen(
        args,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit_file_size if limit_bytes else None,
    )


def last_step(out: Path) -> int:
    """The last step the run reported in metrics.jsonl: a train event (every log_every steps) or its stop; 0 if none."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = [0]
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if event.get("event") in ("train", "stopped"):
            steps.append(event["step"])
    return max(steps)


def newest_checkpoint(out: Path) -> int:
    """Step of the newest complete checkpoint (0 if none)."""
    folder = out / "checkpoints"
    steps = [int(p.name[5:]) for p in folder.glob("step-*") if (p / "COMPLETE").is_file()] if folder.is_dir() else []
    return max(steps, default=0)


def wait_for(process: subprocess.Popen, condition, timeout: float = 300.0) -> bool:
    """Poll until `condition()` (True) or the process ends (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.002)
    raise TimeoutError("the run neither reached the moment nor ended")


def finish(out: Path) -> None:
    """Resume until the run completes (fails loudly otherwise)."""
    process = launch(None, out, resume=True)
    _, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"resume of {out} failed ({process.returncode}): {err.strip().splitlines()[-1:]}")


TIMING = ("tokens_per_sec", "elapsed_sec", "data_fraction")  # wall-clock numbers: the only ones allowed to differ


def result_of(out: Path) -> tuple[list, dict]:
    """(every train and eval event without its timings, final weights).

    log_every (4) is not a divisor of save_every (3): a stop between two events must carry the interval's sums over.
    """
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    kept = [{k: v for k, v in e.items() if k not in TIMING} for e in events if e["event"] in ("train", "eval")]
    return kept, load_file(out / "final" / "model.safetensors")


def differs(out: Path, reference: tuple[list, dict]) -> bool:
    losses, weights = result_of(out)
    return losses != reference[0] or any(not torch.equal(weights[k], reference[1][k]) for k in weights)


def sigkill_faults(config: Path, out: Path, count: int, rng: random.Random, steps: int, reference) -> dict:
    """`count` SIGKILLs at seeded moments (after a step, inside a checkpoint write, during start-up).

    After each kill the run is resumed; a run that completes before the next moment is compared with the reference
    and a fresh one takes over, so every kill lands in some run and every run is checked. A resume that fails
    counts against the kill before it.
    """
    injected = failed = lost = different = 0
    kinds: list[str] = []
    while True:
        resume = (out / "config.yaml").is_file()
        if not resume:
            shutil.rmtree(out, ignore_errors=True)  # a fresh run killed before it wrote its config
        kind = rng.choice(["step", "step", "save", "startup"]) if injected < count else "none"
        target = min(steps - 1, max(newest_checkpoint(out) + rng.randint(1, 5), last_step(out) + 1))
        process = launch(config, out, resume=resume)
        if kind == "step":
            hit = wait_for(process, lambda target=target: last_step(out) >= target)
        elif kind == "save":
            hit = wait_for(process, lambda: any((out / "checkpoints").glob(".tmp-step-*")))
        elif kind == "startup":
            time.sleep(rng.uniform(0.5, 4.0))
            hit = process.poll() is None
        else:
            hit = False
        if not hit:  # the run ended before the moment
            _, err = process.communicate()
            if process.returncode != 0:
                failed += 1
                print(f"{out}: resume failed ({process.returncode}): {err.strip()[-500:]}", file=sys.stderr)
            else:
                different += differs(out, reference)
            if injected == count:
                break
            shutil.rmtree(out)
            continue
        reached = last_step(out)
        process.send_signal(signal.SIGKILL)
        process.wait()
        injected += 1
        kinds.append(kind)
        lost += max(0, reached - newest_checkpoint(out))
    return {"faults": injected, "survived": injected - failed, "lost": lost, "kinds": kinds, "differs": different}


def sigterm_faults(config: Path, out: Path, count: int, rng: random.Random, steps: int) -> dict:
    """`count` SIGTERMs after seeded steps: each must exit 75 with its last trained step checkpointed."""
    survived = lost = 0
    targets = sorted(rng.sample(range(2, steps - 1), count))
    for index, target in enumerate(targets):
        target = max(target, last_step(out) + 1)  # a step this launch trains, not one logged before it
        process = launch(config, out, resume=index > 0)
        if not wait_for(process, lambda target=target: last_step(out) >= target):
            raise RuntimeError("the run ended before the SIGTERM")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate()
        trained, kept = last_step(out), newest_checkpoint(out)
        lost += trained - kept
        survived += process.returncode == EXIT_PREEMPTED and trained == kept
        if process.returncode != EXIT_PREEMPTED:
            print(f"SIGTERM at {target}: exit {process.returncode}: {err.strip()[-300:]}", file=sys.stderr)
    finish(out)
    return {"faults": count, "survived": survived, "lost": lost}


def corruption_fault(reference_run: Path, out: Path) -> dict:
    """Truncate the newest checkpoint of a finished run's copy, resume: it must fall back to the previous one."""
    shutil.copytree(reference_run, out)
    shutil.rmtree(out / "final")
    newest = newest_checkpoint(out)
    weights = out / "checkpoints" / f"step-{newest}" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    process = launch(None, out, resume=True)
    _, err = process.communicate()
    fell_back = process.returncode == 0 and "is damaged" in err
    return {"faults": 1, "survived": int(fell_back), "lost": 0}


def disk_full_fault(config: Path, out: Path, steps: int) -> dict:
    """Run until a checkpoint exists, then resume on a disk too small for the next one: exit 74, then resume."""
    process = launch(config, out, resume=False)
    wait_for(process, lambda: newest_checkpoint(out) >= 3)
    process.send_signal(signal.SIGKILL)
    process.wait()
    kept = newest_checkpoint(out)
    used = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    checkpoint = sum(p.stat().st_size for p in (out / "checkpoints" / f"step-{kept}").rglob("*") if p.is_file())
    mount = Path(tempfile.mkdtemp(prefix="roformer-full-disk-"))
    size = used + checkpoint // 2  # room for the metrics of a few steps, not for another checkpoint
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
        ).returncode
        == 0
    )
    try:
        small = mount / "run"
        shutil.copytree(out, small)
        process = launch(None, small, resume=True, limit_bytes=None if mounted else checkpoint // 3)
        _, err = process.communicate()
        clean = process.returncode == EXIT_WRITE_FAILED and newest_checkpoint(small) >= kept
        clean = clean and not any((small / "checkpoints").glob(".tmp-step-*"))
        message = (err.strip().splitlines() or [""])[-1]
        shutil.rmtree(out)
        shutil.copytree(small, out)  # carry on where it stopped, on a disk with room
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)], check=False)
        shutil.rmtree(mount, ignore_errors=True)
    print(f"disk full ({'tmpfs ENOSPC' if mounted else 'RLIMIT_FSIZE EFBIG'}): {message}")
    finish(out)
    return {"faults": 1, "survived": int(clean), "lost": 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--terms", type=int, default=5)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory (removed)")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="roformer-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    config = write_config(work / "config.yaml", args.steps, work / "cache")
    started = time.time()
    reference_run = work / "reference"
    shutil.rmtree(reference_run, ignore_errors=True)
    process = launch(config, reference_run, resume=False)
    if process.wait() != 0:
        raise RuntimeError(f"reference run failed: {process.stderr.read()[-2000:]}")
    reference = result_of(reference_run)
    rows = []
    for name, run in (
        ("SIGKILL", lambda out: sigkill_faults(config, out, args.kills, rng, args.steps, reference)),
        ("SIGTERM", lambda out: sigterm_faults(config, out, args.terms, rng, args.steps)),
        ("corrupt newest checkpoint", lambda out: corruption_fault(reference_run, out)),
        ("disk full while saving", lambda out: disk_full_fault(config, out, args.steps)),
    ):
        out = work / name.split()[0].lower()
        shutil.rmtree(out, ignore_errors=True)
        row = run(out)
        row.setdefault("differs", int(differs(out, reference)))
        rows.append((name, row))
    print(f"\n{args.steps}-step tiny run, seed {args.seed}, {time.time() - started:.0f} s\n")
    print("| fault | injected | resumes that succeeded | steps lost | runs whose result differs |")
    print("|---|---:|---:|---:|---:|")
    for name, row in rows:
        print(f"| {name} | {row['faults']} | {row['survived']}/{row['faults']} | {row['lost']} | {row['differs']} |")
    kinds = rows[0][1].get("kinds", [])
    print(f"\nSIGKILL moments: {', '.join(f'{k} x{kinds.count(k)}' for k in sorted(set(kinds)))}")
    ok = all(r["survived"] == r["faults"] and not r["differs"] for _, r in rows) and rows[1][1]["lost"] == 0
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
