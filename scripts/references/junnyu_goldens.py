#!/usr/bin/env python
"""Golden files from JunnYu's RoFormer port (PyPI ``roformer==0.4.3``).

JunnYu's port is the code the hub model cards of ``junnyu/roformer_chinese_*``,
``junnyu/roformer_chinese_sim_char_*`` (RoFormer-Sim) and
``junnyu/roformer_v2_chinese_char_*`` (RoFormerV2) use. It needs a transformers
4.x, which clashes with the project's environment, so this script builds a
throwaway virtualenv and re-runs itself inside it.

Pinned versions (all installed into the venv with ``pip install --no-deps``;
the venv is made with ``--system-site-packages`` so it reuses the system torch,
which is never installed or changed here):

    roformer==0.4.3          JunnYu's port (setup.py: transformers>=4.13.0, rjieba;
                             rjieba is only needed by its tokenizer, not installed)
    transformers==4.25.1     the last 4.x whose generate() hands the cache to
                             prepare_inputs_for_generation(past=...); from 4.26 on it is
                             passed as past_key_values=..., which the port ignores, so
                             generation silently runs without a cache (and without the
                             port's seq2seq/UniLM behaviour). Do not bump it.
    tokenizers==0.13.3       matches transformers 4.25.1 (<0.14), has a cp311 wheel
    huggingface_hub==0.11.1  matches transformers 4.25.1 (>=0.10,<1.0)
    safetensors==0.3.1       matches transformers 4.25.1 (>=0.2.1)
    torch, numpy, regex, requests, filelock, packaging, pyyaml, tqdm: system ones

Regenerate (creates the venv if missing, then re-runs itself inside it):

    python scripts/references/junnyu_goldens.py --venv /tmp/junnyu-venv

Writes ``tests/golden/junnyu/<name>/{config.json, model.safetensors,
state_dict_keys.json, io.safetensors}`` and ``tests/golden/junnyu/README.md``.
Never downloads weights: all models are tiny random ones built from configs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PINS = [
    "roformer==0.4.3",
    "transformers==4.25.1",
    "tokenizers==0.13.3",
    "huggingface_hub==0.11.1",
    "safetensors==0.3.1",
]
EXPECTED = {"roformer": "0.4.3", "transformers": "4.25.1"}

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "golden" / "junnyu"

# Tiny sizes shared by every golden model.
TINY = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    type_vocab_size=2,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    initializer_range=0.02,
    layer_norm_eps=1e-12,
    pad_token_id=0,
)
CLS, SEP, PAD = 2, 3, 0


# --------------------------------------------------------------------------- outer


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(venv: Path) -> None:
    py = venv_python(venv)
    if not py.exists():
        print(f"creating venv {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    # --no-deps everywhere: nothing may pull a (CUDA) torch or touch system packages.
    want = dict(p.split("==") for p in PINS)
    probe = (
        "import importlib.metadata as m, sys; "
        f"sys.exit(0 if all(m.version(k) == v for k, v in {want!r}.items()) else 1)"
    )
    # cwd=/tmp: run from the repo, importlib.metadata would find our roformer.egg-info
    ok = subprocess.run([str(py), "-c", probe], capture_output=True, cwd="/tmp").returncode == 0
    if not ok:
        print("installing pinned packages into the venv (--no-deps)", flush=True)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", *PINS], check=True)


def outer(args: argparse.Namespace) -> int:
    venv = Path(args.venv).resolve()
    if REPO in venv.parents or venv == REPO:
        raise SystemExit("keep the venv outside the repository (e.g. /tmp/junnyu-venv)")
    ensure_venv(venv)
    env = dict(os.environ, PYTHONNOUSERSITE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # the project's own packages must not leak in
    out = str(Path(args.out).resolve())
    cmd = [str(venv_python(venv)), str(Path(__file__).resolve()), "--inside", "--out", out]
    return subprocess.run(cmd, env=env, cwd="/tmp").returncode


# --------------------------------------------------------------------------- inside


def inside(args: argparse.Namespace) -> int:  # noqa: C901 - a flat script
    import importlib.metadata as md

    for pkg, ver in EXPECTED.items():
        got = md.version(pkg)
        if got != ver:
            raise SystemExit(f"{pkg}=={got} in this interpreter, expected {ver}")

    import torch
    import transformers

    import roformer

    for mod in (roformer, transformers):
        if not Path(mod.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()):
            raise SystemExit(f"{mod.__name__} imported from {mod.__file__}, not from {sys.prefix}")
    from safetensors.torch import save_file

    from roformer import RoFormerConfig, RoFormerForCausalLM, RoFormerForMaskedLM, RoFormerModel

    transformers.logging.set_verbosity_error()
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    out_root = Path(args.out).resolve()
    out_root.mkdir(parents=True, exist_ok=True)

    # ---- inputs: batch 2, length 10; row 1 right-padded (2 pads) -----------------
    input_ids = torch.tensor(
        [
            [CLS, 17, 33, 5, 48, SEP, 21, 9, 60, SEP],
            [CLS, 40, 11, 27, SEP, 54, 8, SEP, PAD, PAD],
        ],
        dtype=torch.long,
    )
    attention_mask = torch.tensor([[1] * 10, [1] * 8 + [0] * 2], dtype=torch.long)
    token_type_ids = torch.tensor([[0] * 6 + [1] * 4, [0] * 5 + [1] * 3 + [0] * 2], dtype=torch.long)

    def randomize(model: torch.nn.Module, seed: int) -> None:
        """Non-trivial random weights: LayerNorm gamma in U(0.5,1.5), every bias
        N(0,0.1^2), embeddings N(0,1), Linear weights N(0,1/fan_in). The fixed
        sinusoidal table (encoder.embed_positions.weight) is left as built.
        named_parameters() yields tied parameters once, so ties survive."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "embed_positions" in name:
                    continue
                if name.endswith("LayerNorm.weight"):
                    p.copy_(torch.rand(p.shape, generator=g) + 0.5)
                elif name.endswith("bias"):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
                elif "word_embeddings" in name or "token_type_embeddings" in name:
                    p.copy_(torch.randn(p.shape, generator=g))
                elif p.dim() == 2:
                    p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
                else:
                    raise AssertionError(f"unhandled parameter {name}")

    def dedup_state_dict(model: torch.nn.Module):
        """Full state dict (what save_pretrained(safe_serialization=False) / torch.save
        would write, i.e. minus _keys_to_ignore_on_save) and the safetensors one with
        tied duplicates removed the way transformers>=4.35 save_pretrained does it:
        for each group of names sharing storage keep the first in state_dict order."""
        sd = model.state_dict()
        for k in model._keys_to_ignore_on_save or []:
            sd.pop(k, None)
        keep, first_of = {}, {}
        tied = {}
        for name, t in sd.items():
            ptr = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
            if ptr in first_of:
                tied[name] = first_of[ptr]
                continue
            first_of[ptr] = name
            keep[name] = t.detach().clone().contiguous()
        return sd, keep, tied

    def save_model(model, name: str, notes: str) -> Path:
        d = out_root / name
        d.mkdir(parents=True, exist_ok=True)
        for f in d.iterdir():
            f.unlink()
        full, keep, tied = dedup_state_dict(model)
        model.save_pretrained(str(d), safe_serialization=True, state_dict=keep)
        keys = {
            "model_class": type(model).__name__,
            "notes": notes,
            "saved_keys": {k: list(v.shape) for k, v in keep.items()},
            "tied_duplicates_removed": tied,
            "ignored_on_save": list(model._keys_to_ignore_on_save or []),
            "full_state_dict_keys": {k: list(v.shape) for k, v in model.state_dict().items()},
        }
        (d / "state_dict_keys.json").write_text(json.dumps(keys, indent=1) + "\n")
        return d

    def save_io(d: Path, tensors: dict, meta: dict) -> None:
        clean = {}
        for k, v in tensors.items():
            v = v.detach().contiguous()
            v = v.to(torch.int64) if not v.is_floating_point() else v.to(torch.float32)
            clean[k] = v
        # one metadata key only: safetensors serialises a multi-key metadata map in
        # hash order, which would make the header (and the checksum) vary by run
        notes = json.dumps(meta, sort_keys=True) if meta else ""
        save_file(clean, str(d / "io.safetensors"), metadata={"notes": notes} if notes else None)

    def stack_hidden(hs) -> torch.Tensor:
        return torch.stack(list(hs), dim=0)  # [num_layers + 1, B, T, H]

    summary = {}

    # ---- a/b: V1 RoFormerModel with pooler (tanh / linear) ----------------------
    for name, act, seed in (("v1_model_pooler_tanh", "tanh", 1), ("v1_model_pooler_linear", "linear", 2)):
        torch.manual_seed(seed)
        cfg = RoFormerConfig(**TINY, hidden_act="gelu", pooler_activation=act)
        model = RoFormerModel(cfg, add_pooling_layer=True).eval()
        randomize(model, seed)
        with torch.no_grad():
            o = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                output_hidden_states=True,
            )
        d = save_model(
            model,
            name,
            "RoFormerModel(config, add_pooling_layer=True); no 'roformer.' prefix "
            "(base model saved on its own), so encoder.embed_positions.weight is NOT dropped "
            "by _keys_to_ignore_on_save. add_pooling_layer is NOT a config field.",
        )
        save_io(
            d,
            dict(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                last_hidden_state=o.last_hidden_state,
                pooler_output=o.pooler_output,
                hidden_states=stack_hidden(o.hidden_states),
            ),
            {"pooler_activation": act},
        )
        summary[name] = f"V1 RoFormerModel + pooler ({act})"

    # ---- c: RoFormer-Sim = RoFormerForCausalLM, is_decoder, linear pooler -------
    name, seed = "sim_causal_lm", 3
    torch.manual_seed(seed)
    # As the port's README / examples/test_sim.py set it on top of the hub config:
    # config.is_decoder = True; config.eos_token_id = tokenizer.sep_token_id;
    # config.pooler_activation = "linear". Hub sim configs: hidden_act gelu, V1 norm.
    # eos_token_id is left unset (the README sets it to [SEP]) so that greedy
    # generation below runs all max_new_tokens steps.
    cfg = RoFormerConfig(**TINY, hidden_act="gelu", is_decoder=True, pooler_activation="linear")
    model = RoFormerForCausalLM(cfg).eval()
    randomize(model, seed)
    assert model.cls.predictions.decoder.weight is model.roformer.embeddings.word_embeddings.weight
    with torch.no_grad():
        # 1) plain forward (no cache): the port uses ONLY the padding mask here,
        #    i.e. fully bidirectional, token_type_ids only feed the embedding.
        o = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            output_hidden_states=True,
        )
        # 2) UniLM / seq2seq mask (bert4keras unilm_mask: key j visible from query i
        #    iff cumsum(tt)[j] <= cumsum(tt)[i]) times the padding mask, passed as a
        #    3-D attention_mask (the port broadcasts it to all heads).
        idx = torch.cumsum(token_type_ids, dim=1)
        unilm = (idx[:, None, :] <= idx[:, :, None]).long() * attention_mask[:, None, :]
        u = model(
            input_ids=input_ids,
            attention_mask=unilm,
            token_type_ids=token_type_ids,
            output_hidden_states=True,
        )
        # 3) the port's own cached path: segment A (tt==0) in one pass without past
        #    (bidirectional), then segment B one token at a time with past_key_values
        #    (causal, rotary positions offset by the cache length). Per row, valid
        #    tokens only. Must equal the UniLM-mask forward on those positions.
        incr = torch.zeros_like(u.logits)
        for b in range(2):
            n = int(attention_mask[b].sum())
            a_len = int((token_type_ids[b, :n] == 0).sum())
            ids = input_ids[b : b + 1, :n]
            tt = token_type_ids[b : b + 1, :n]
            p = model(input_ids=ids[:, :a_len], token_type_ids=tt[:, :a_len], use_cache=True)
            incr[b, :a_len] = p.logits[0]
            past = p.past_key_values
            for t in range(a_len, n):
                s = model(
                    input_ids=ids[:, t : t + 1],
                    token_type_ids=tt[:, t : t + 1],
                    attention_mask=torch.ones(1, t + 1, dtype=torch.long),
                    past_key_values=past,
                    use_cache=True,
                )
                incr[b, t] = s.logits[0, 0]
                past = s.past_key_values
            err = (incr[b, :n] - u.logits[b, :n]).abs().max().item()
            assert err < 1e-4, f"cached decode != UniLM-mask forward (row {b}): {err}"
        # 4) greedy generation with the port's prepare_inputs_for_generation
        prompt = torch.tensor([[CLS, 17, 33, 5, 48, SEP]], dtype=torch.long)
        g = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            token_type_ids=torch.zeros_like(prompt),
            do_sample=False,
            num_beams=1,
            max_new_tokens=8,
            pad_token_id=PAD,
            output_scores=True,
            return_dict_in_generate=True,
        )
        gen = g.sequences
        gen_scores = torch.stack(g.scores, dim=1)  # [1, steps, vocab]
        # check: same tokens from the UniLM-mask full forward (prompt tt=0, new tt=1)
        L = gen.shape[1]
        tt_g = torch.tensor([[0] * prompt.shape[1] + [1] * (L - prompt.shape[1])])
        ig = torch.cumsum(tt_g, dim=1)
        mg = (ig[:, None, :] <= ig[:, :, None]).long()
        full = model(input_ids=gen, token_type_ids=tt_g, attention_mask=mg).logits
        want = full[0, prompt.shape[1] - 1 : L - 1].argmax(-1)
        assert torch.equal(want, gen[0, prompt.shape[1] :]), (want, gen)
        err = (full[0, prompt.shape[1] - 1 : L - 1] - gen_scores[0]).abs().max().item()
        assert err < 1e-4, f"generate scores != UniLM-mask forward: {err}"
    d = save_model(
        model,
        name,
        "RoFormerForCausalLM: always has roformer.pooler (add_pooling_layer=True); "
        "cls.predictions.decoder.weight tied to roformer.embeddings.word_embeddings.weight, "
        "cls.predictions.decoder.bias is cls.predictions.bias.",
    )
    save_io(
        d,
        dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            logits=o.logits,
            pooler_output=o.pooler_output,
            last_hidden_state=o.hidden_states[-1],
            hidden_states=stack_hidden(o.hidden_states),
            unilm_attention_mask=unilm,
            unilm_logits=u.logits,
            unilm_pooler_output=u.pooler_output,
            unilm_last_hidden_state=u.hidden_states[-1],
            unilm_hidden_states=stack_hidden(u.hidden_states),
            gen_prompt_ids=prompt,
            gen_output_ids=gen,
            gen_scores=gen_scores,
        ),
        {
            "plain_forward": "attention_mask 2-D, no past: bidirectional (padding mask only)",
            "unilm": "3-D mask cumsum(tt)[j] <= cumsum(tt)[i] times padding; equals the port's "
            "cached decode (A without past, B token by token with past) on valid tokens",
            "generate": "greedy, max_new_tokens=8, no eos_token_id, pad_token_id=0; prompt tt=0, "
            "new tokens tt=1 via the cache; gen_scores[step] = logits of the step",
        },
    )
    summary[name] = "RoFormer-Sim: V1 RoFormerForCausalLM, is_decoder, linear pooler, generate"

    # ---- d: V2 RoFormerForMaskedLM ---------------------------------------------
    name, seed = "v2_masked_lm", 4
    torch.manual_seed(seed)
    # mimics junnyu/roformer_v2_chinese_char_small at tiny size: hidden_act relu,
    # use_bias False, norm_type rms_norm, rotary_value False, max_position 512->64.
    cfg = RoFormerConfig(**TINY, hidden_act="relu", use_bias=False, norm_type="rms_norm", rotary_value=False)
    model = RoFormerForMaskedLM(cfg).eval()
    randomize(model, seed)
    assert model.cls.predictions.decoder.weight is model.roformer.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is None
    with torch.no_grad():
        o = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            output_hidden_states=True,
        )
    d = save_model(
        model,
        name,
        "V2: no LayerNorm parameters at all (parameter-free RMS Norm), no Linear biases in "
        "attention/FFN, MLM head = bare decoder tied to word embeddings, no bias, no transform.",
    )
    save_io(
        d,
        dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            logits=o.logits,
            last_hidden_state=o.hidden_states[-1],
            hidden_states=stack_hidden(o.hidden_states),
        ),
        {},
    )
    summary[name] = "RoFormerV2 RoFormerForMaskedLM (rms_norm, use_bias False, relu)"

    # ---- e: V1 MLM, embedding_size != hidden_size, rotary_value (ELECTRA generator)
    name, seed = "v1_masked_lm_emb16_rotary_value", 5
    torch.manual_seed(seed)
    cfg = RoFormerConfig(**dict(TINY, hidden_act="gelu", embedding_size=16, rotary_value=True))
    model = RoFormerForMaskedLM(cfg).eval()
    randomize(model, seed)
    assert model.cls.predictions.decoder.weight is model.roformer.embeddings.word_embeddings.weight
    with torch.no_grad():
        o = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            output_hidden_states=True,
        )
    d = save_model(
        model,
        name,
        "V1 MLM like junnyu/roformer_small_generator: embedding_size 16 < hidden 32 "
        "(roformer.embeddings_project), rotary_value True, head transform hidden->embedding_size.",
    )
    save_io(
        d,
        dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            logits=o.logits,
            last_hidden_state=o.hidden_states[-1],
            hidden_states=stack_hidden(o.hidden_states),
        ),
        {},
    )
    summary[name] = "V1 RoFormerForMaskedLM, embedding_size 16 != hidden 32, rotary_value"

    write_readme(out_root, summary, torch.__version__)
    for n in summary:
        print(n, sorted(p.name for p in (out_root / n).iterdir()))
    return 0


def write_readme(out_root: Path, summary: dict, torch_version: str) -> None:
    lines = [
        "# Goldens from JunnYu's RoFormer port (`roformer==0.4.3`)",
        "",
        "Tiny random models (vocab 64, hidden 32, 2 layers, 4 heads of 8, intermediate 64,",
        "max_position_embeddings 64, dropout 0, fp32, eval) built with the port and run with it.",
        "Weights are re-randomised so that no LayerNorm weight is 1, no bias is 0 (a loader",
        "that leaves anything at its init fails). Generated by `scripts/references/junnyu_goldens.py`:",
        "",
        "    python scripts/references/junnyu_goldens.py --venv /tmp/junnyu-venv",
        "",
        "(creates the venv with `--system-site-packages` if missing, installs the pins with",
        "`--no-deps`, then re-runs itself inside it). Versions: roformer 0.4.3,",
        "transformers 4.25.1, tokenizers 0.13.3, huggingface_hub 0.11.1, safetensors 0.3.1,",
        f"torch {torch_version} (system). Do not bump transformers: from 4.26 on `generate()`",
        "passes `past_key_values=` and the port's `prepare_inputs_for_generation(past=...)`",
        "never sees the cache.",
        "",
        "Each folder holds:",
        "",
        "- `config.json`: the port's `save_pretrained` config (diff against defaults).",
        "- `model.safetensors`: `save_pretrained(safe_serialization=True)` with tied duplicates",
        "  removed as transformers>=4.35 does (first name in state_dict order kept), and",
        "  `roformer.encoder.embed_positions.weight` dropped (`_keys_to_ignore_on_save`). That",
        "  ignore pattern carries the `roformer.` prefix, so the bare `RoFormerModel` folders DO",
        "  contain `encoder.embed_positions.weight` (the fixed sinusoidal table, [64, 8]).",
        "- `state_dict_keys.json`: saved keys and shapes, removed tied duplicates (name -> kept",
        "  name), and the full in-memory state dict (what a torch.save'd pytorch_model.bin of the",
        "  port can contain).",
        "- `io.safetensors`: inputs (`input_ids`, `attention_mask`, `token_type_ids`, int64) and",
        "  outputs (float32): `last_hidden_state`, `hidden_states` ([layers+1, B, T, H], index 0 =",
        "  embedding output after `embeddings_project`), `pooler_output`, `logits`, ...",
        "  Row 1 is right-padded (attention_mask 0 on the last 2 positions); outputs at padded",
        "  positions are what the port computes there. Free-text notes, if any, are in the",
        "  safetensors metadata key `notes` (a JSON string).",
        "",
        "| folder | what |",
        "| --- | --- |",
    ]
    for k, v in summary.items():
        lines.append(f"| `{k}` | {v} |")
    lines += [
        "",
        "`sim_causal_lm/io.safetensors` also has: `unilm_attention_mask` (the 3-D mask fed),",
        "`unilm_logits`, `unilm_pooler_output`, `unilm_last_hidden_state`, `unilm_hidden_states`",
        "(forward with the UniLM mask `cumsum(tt)[j] <= cumsum(tt)[i]` times padding; the script",
        "asserts it equals the port's cached decode: segment A without past, then segment B",
        "token by token with past), and `gen_prompt_ids`, `gen_output_ids`, `gen_scores`",
        "([1, steps, vocab]) from greedy `generate(max_new_tokens=8)`. The plain `logits` /",
        "`pooler_output` come from a 2-D mask forward without cache, which the port runs fully",
        "bidirectionally (token_type_ids only enter through the embedding).",
        "",
    ]
    (out_root / "README.md").write_text("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default="/tmp/junnyu-venv", help="throwaway venv (outside the repo)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output folder")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    return inside(args) if args.inside else outer(args)


if __name__ == "__main__":
    sys.exit(main())
