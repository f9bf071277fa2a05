#!/usr/bin/env python3
"""An independent reference for atoll's model families: the logits of token rows computed in
float64 NumPy from an HF model folder (config.json + model.safetensors, as `atoll-convert export`
writes it), following MODELS.md (in ../shared/ beside the repository) rather than atoll's C++
code, and compared with the logits `atoll-eval --dump-logits` wrote for the same rows.

usage: reference_logits.py HF_DIR TOKENS.safetensors ATOLL_LOGITS.safetensors [KEY=JSON ...]
KEY=JSON replaces a config.json field for the reference only (a control: a rule the reference
then gets wrong must make the comparison fail).
Exit 0 when they agree within the tolerance (printed), 1 when they do not, 2 when atoll's logits
are not what a comparison needs (shape, non-finite usable logits, padded columns not -inf).
"""
import importlib
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file


def main(hf_dir, tokens_file, atoll_file, *overrides):
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    for item in overrides:
        key, value = item.split("=", 1)
        config[key] = json.loads(value)
    family = importlib.import_module("atoll_reference." + config["model_type"])
    weights = {k: v.astype(np.float64) for k, v in load_file(os.path.join(hf_dir, "model.safetensors")).items()}
    rows = load_file(tokens_file)
    ref = family.logits(config, weights, rows["input_ids"], rows["positions"], rows["valid"])
    got = load_file(atoll_file)["logits"].astype(np.float64)
    if ref.shape != got.shape:
        print(f"shapes differ: reference {ref.shape}, atoll {got.shape}")
        return 2
    # Valid tokens only; the usable vocabulary must be finite, the padded columns -inf (MODELS.md 10.1.5).
    usable = config.get("unpadded_vocab_size") or config["vocab_size"]
    valid = rows["valid"].astype(bool)
    ref, got = ref[valid], got[valid]
    if not np.isfinite(got[:, :usable]).all() or not np.isneginf(got[:, usable:]).all():
        print(f"atoll's logits: usable columns [0, {usable}) not all finite, or padded ones not all -inf")
        return 2
    diff = np.abs(ref[:, :usable] - got[:, :usable])
    scale = np.abs(ref[:, :usable]).max()
    tolerance = 2e-6 * max(1.0, scale)  # fp32 against float64 on a tiny model: observed <= 0.25 of it
    print(f"{config['model_type']}: max |reference - atoll| {diff.max():.3e} over {diff.size} logits "
          f"(largest |logit| {scale:.3f}, tolerance {tolerance:.1e}, ratio {diff.max() / tolerance:.3f})")
    return 0 if diff.max() <= tolerance else 1


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
