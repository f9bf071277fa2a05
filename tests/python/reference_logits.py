#!/usr/bin/env python3
"""An independent reference for atoll's model families: the logits of token rows computed in
float64 NumPy from an HF model folder (config.json + safetensors, as `atoll-convert export`
writes it), following ../shared/MODELS.md rather than atoll's C++ code, and compared with the
logits `atoll-eval --dump-logits` wrote for the same rows.

usage: reference_logits.py HF_DIR TOKENS.safetensors ATOLL_LOGITS.safetensors
Exit 0 when they agree within the tolerance (printed), 1 otherwise.
"""
import importlib
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def load_weights(hf_dir):
    """Every tensor of the folder (one model.safetensors or the shards of its index), as float64."""
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    weights = {}
    for name in files:
        weights.update(load_file(os.path.join(hf_dir, name)))
    return {k: v.astype(np.float64) for k, v in weights.items()}


def main(hf_dir, tokens_file, atoll_file):
    config = json.load(open(os.path.join(hf_dir, "config.json")))
    family = importlib.import_module("atoll_reference." + config["model_type"])
    rows = load_file(tokens_file)
    ref = family.logits(config, load_weights(hf_dir), rows["input_ids"], rows["positions"], rows["valid"])
    got = load_file(atoll_file)["logits"].astype(np.float64)
    usable = np.isfinite(got).all(axis=(0, 1))  # the padded vocabulary's columns are -inf in atoll's
    if ref.shape != got.shape or not usable.any():
        print(f"shapes differ or nothing to compare: reference {ref.shape}, atoll {got.shape}")
        return 1
    valid = rows["valid"].astype(bool)
    ref, got = ref[valid][:, usable], got[valid][:, usable]  # (the -inf columns would subtract to NaN)
    diff = np.abs(ref - got)
    scale = np.abs(ref).max()
    tolerance = 1e-4 * max(1.0, scale)  # fp32 against float64 on a tiny model
    print(f"{config['model_type']}: max |reference - atoll| {diff.max():.3e} over {diff.size} logits "
          f"(largest |logit| {scale:.3f}, tolerance {tolerance:.1e})")
    return 0 if diff.max() <= tolerance else 1


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
