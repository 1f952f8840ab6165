"""Hugging Face models as users bring them: a training step eager vs through ``pullback.integrations.torch.compile``.

Each family is built from its config class (random weights, no download) at a size where kernels matter (hidden
256, 2 layers, 4 heads, intermediate 1024, sequence 128, batch 4; images 64x64, batch 8) and trained on its own
loss (``labels``): forward, backward, SGD update. One process per family; eager's steps and pullback's (torch
target unless ``--target``) alternate one by one, so ``x eager`` (the median of the per-step ratios) is robust to
the machine drifting. Columns: the medians of both steps, ``x eager``, pullback's first step (export, AD,
clean-up, partition, build, the step), the bytes each saves for the backward (activations: parameters and inputs
left out, as ``torch_train.py`` counts them) and the first step's two losses.

The families cover what the correctness sweeps found users run: decoders with grouped-query attention (Llama,
Mistral, Qwen2), GPT-2, mixtures of experts with transformers' default grouped experts (Mixtral, OLMoE), BERT, T5,
RWKV's time loop, Mamba, ViT, ConvNeXt. glibc's malloc is tuned for both as in ``torch_train.py`` unless
``--no-tune-malloc`` (untuned, large blocks are page-faulted afresh every step and both sides' times scatter by
30% between runs).

Usage: ``python bench/hf_train.py [--only llama,mixtral] [--dtype float32|bfloat16] [--policy min_cut] [--reps 10]
[--json F]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_train import child_row, saved_mb, set_threads  # noqa: E402

H, LAYERS, HEADS, FF, SEQ, BATCH, VOCAB = 256, 2, 4, 1024, 128, 4, 1000


def _decoder(**kw) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=H, intermediate_size=FF, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                max_position_embeddings=2 * SEQ, **kw)


FAMILIES = {  # name -> (config class, model class, config kwargs, kind)
    "llama": ("LlamaConfig", "LlamaForCausalLM", _decoder(num_key_value_heads=2), "lm"),
    "mistral": ("MistralConfig", "MistralForCausalLM", _decoder(num_key_value_heads=2), "lm"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _decoder(num_key_value_heads=2), "lm"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=VOCAB, n_embd=H, n_layer=LAYERS, n_head=HEADS,
                                                   n_positions=2 * SEQ), "lm"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", _decoder(num_key_value_heads=2, num_local_experts=4,
                                                                num_experts_per_tok=2), "lm"),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", _decoder(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2), "lm"),
    "bert": ("BertConfig", "BertForMaskedLM", _decoder(), "mlm"),
    "t5": ("T5Config", "T5ForConditionalGeneration", dict(vocab_size=VOCAB, d_model=H, d_kv=H // HEADS, d_ff=FF,
                                                          num_layers=LAYERS, num_heads=HEADS, decoder_start_token_id=0), "s2s"),
    "rwkv": ("RwkvConfig", "RwkvForCausalLM", dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS,
                                                   attention_hidden_size=H, intermediate_size=FF, context_length=2 * SEQ), "lm"),
    "mamba": ("MambaConfig", "MambaForCausalLM", dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS,
                                                      state_size=16, use_mambapy=False), "lm"),
    "vit": ("ViTConfig", "ViTForImageClassification", dict(image_size=64, patch_size=8, hidden_size=H, num_hidden_layers=LAYERS,
                                                           num_attention_heads=HEADS, intermediate_size=FF, num_labels=10), "img"),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification", dict(hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1],
                                                                           num_labels=10), "img"),
}


def _loss_of(model, keys):
    """``model`` as a module ``forward(*tensors) -> loss``, the tensors passed as the keywords ``keys``."""
    import torch

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            return self.model(**dict(zip(keys, tensors))).loss

    return Loss()


def build(name: str, dtype: str):
    """``(module, inputs)``: the family's model (dropout off) wrapped to return its loss, and its batch."""
    import torch
    import transformers

    config_cls, model_cls, kw, kind = FAMILIES[name]
    cfg = getattr(transformers, config_cls)(**kw)
    for key, value in list(vars(cfg).items()):  # no dropout: both sides draw no masks
        if isinstance(value, float) and not isinstance(value, bool) and ("drop" in key.lower()):
            setattr(cfg, key, 0.0)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).train().to(getattr(torch, dtype))
    ids = torch.randint(3, VOCAB, (BATCH, SEQ))
    if kind == "img":
        pixels = torch.randn(2 * BATCH, 3, 64, 64, dtype=getattr(torch, dtype))
        return _loss_of(model, ("pixel_values", "labels")), (pixels, torch.arange(2 * BATCH) % 10)
    if kind == "s2s":
        return _loss_of(model, ("input_ids", "labels")), (ids, torch.randint(3, VOCAB, (BATCH, SEQ // 4)))
    labels = ids if kind == "lm" else torch.randint(3, VOCAB, (BATCH, SEQ))
    return _loss_of(model, ("input_ids", "labels")), (ids, labels)


def run(name: str, dtype: str, reps: int, warmup: int, threads: int, target: str, tune_malloc: bool,
        policy: str = "save_all") -> dict:
    import torch

    from pullback.integrations.torch import compile as pb_compile

    set_threads(threads)
    if tune_malloc:
        from pullback.runtime.tuning import keep_freed_memory

        keep_freed_memory()
    model, inputs = build(name, dtype)
    eager = copy.deepcopy(model)

    def stepper(m):
        opt = torch.optim.SGD(m.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = m(*inputs)
            loss.backward()
            opt.step()
            return loss

        return step

    eager_step = stepper(eager)
    t0 = time.perf_counter()
    compiled = pb_compile(model, inputs, target=target, policy=policy)
    ours = stepper(compiled)
    losses = (float(eager_step()), float(ours()))
    first = time.perf_counter() - t0
    for _ in range(warmup):
        eager_step(), ours()
    te, tp = [], []
    for _ in range(reps):
        for times, step in ((te, eager_step), (tp, ours)):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
    row = {"eager_ms": statistics.median(te) * 1e3, "pullback_ms": statistics.median(tp) * 1e3,
           "x_eager": statistics.median(b / a for a, b in zip(te, tp)), "first_s": first, "losses": losses}
    row["eager_saved_mb"], row["pullback_saved_mb"] = saved_mb(eager, compiled, model, inputs)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(FAMILIES))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="torch")
    ap.add_argument("--policy", default="save_all", help="PartitionForwardBackward's policy: save_all or min_cut")
    ap.add_argument("--no-tune-malloc", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("ROW " + json.dumps(run(args.child, args.dtype, args.reps, args.warmup, args.threads, args.target,
                                      not args.no_tune_malloc, args.policy)), flush=True)
        return
    print(f"Hugging Face training steps, {args.dtype}, {args.threads} threads, {args.reps} alternating steps, target "
          f"{args.target}, policy {args.policy}, malloc tuned: {not args.no_tune_malloc}")
    print(f"{'family':10s} {'eager ms':>9s} {'pullback':>9s} {'x eager':>8s} {'first s':>8s} {'act MB eager/pb':>16s}  "
          "losses (eager, pullback)")
    rows = {}
    for name in args.only.split(","):
        cmd = [sys.executable, __file__, "--child", name, "--dtype", args.dtype, "--reps", str(args.reps), "--warmup",
               str(args.warmup), "--threads", str(args.threads), "--target", args.target, "--policy", args.policy]
        r, why = child_row(cmd + (["--no-tune-malloc"] if args.no_tune_malloc else []))
        if r is None:
            print(f"{name:10s} failed: {why}")
            continue
        rows[name] = r
        print(f"{name:10s} {r['eager_ms']:9.1f} {r['pullback_ms']:9.1f} {r['x_eager']:8.2f} {r['first_s']:8.2f} "
              f"{r['eager_saved_mb']:7.1f} / {r['pullback_saved_mb']:6.1f}  ({r['losses'][0]:.6g}, {r['losses'][1]:.6g})")
    if rows:
        ratios = sorted(r["x_eager"] for r in rows.values())
        print(f"median x eager over {len(ratios)} families: {statistics.median(ratios):.2f}; slowest {ratios[-1]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
