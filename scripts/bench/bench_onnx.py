"""Inference speed of an exported ONNX file in onnxruntime against the same model in PyTorch (eager, no grad).

Both run the same padded batches on the CPU with the same thread count; reported: median tokens/s of each and the
ratio, after checking that the logits agree.

    python scripts/bench/bench_onnx.py                       # the small MLM, rotary, batch 8 x 128 and 1 x 512
    python scripts/bench/bench_onnx.py --model runs/roformer-small/final
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import onnxruntime as ort
import torch

import roformer
from roformer.model.onnx import INPUT_NAMES, ONNX_FILE, export_onnx


def median_seconds(fn, repeats: int) -> float:  # noqa: ANN001
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a roformer model directory (default: a fresh small rotary MLM)")
    p.add_argument("--shapes", default="8x128,1x512", help="batch x length, comma separated")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    if args.model:
        model = roformer.load(args.model)
    else:
        torch.manual_seed(0)
        model = roformer.MaskedLM(roformer.ModelConfig.from_yaml("configs/model/roformer-small.yaml"))
    model.eval()
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__}, {torch.get_num_threads()} threads, "
          f"{model.config.position_encoding} {model.architecture}; median of {args.repeats}")  # fmt: skip
    print("| batch x length | PyTorch tokens/s | onnxruntime tokens/s | onnxruntime / PyTorch |\n|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        path = export_onnx(model, Path(tmp) / ONNX_FILE, max_length=512)
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for shape in args.shapes.split(","):
            batch, length = (int(x) for x in shape.split("x"))
            ids = torch.randint(5, model.config.vocab_size, (batch, length))
            mask, types = torch.ones_like(ids), torch.zeros_like(ids)
            feed = dict(zip(INPUT_NAMES, (ids.numpy(), mask.numpy(), types.numpy()), strict=True))
            with torch.no_grad():
                expected = model(ids, attention_mask=mask, token_type_ids=types).logits
            torch.testing.assert_close(torch.from_numpy(session.run(None, feed)[0]), expected, rtol=1e-4, atol=1e-4)

            def eager(ids: torch.Tensor = ids, mask: torch.Tensor = mask, types: torch.Tensor = types) -> None:
                with torch.no_grad():
                    model(ids, attention_mask=mask, token_type_ids=types)

            ours = batch * length / median_seconds(eager, args.repeats)
            runtime = batch * length / median_seconds(lambda feed=feed: session.run(None, feed), args.repeats)
            print(f"| {batch} x {length} | {ours:,.0f} | {runtime:,.0f} | {runtime / ours:.2f}x |")


if __name__ == "__main__":
    main()
