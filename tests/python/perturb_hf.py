#!/usr/bin/env python3
"""Copies an HF model folder (atoll-convert export's, one model.safetensors) with every parameter
moved away from its init, so that each feature of the family shows in the logits: after a few
steps of training, correction biases, residual queries, gates and clip scales are still at
(or near) their init, where a reference that ignores them would agree by luck.

usage: perturb_hf.py SRC_DIR DST_DIR SEED
"""
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file


def beam(k, v, normal, config):
    if k.endswith("norm.weight"):
        return normal(v.shape, 0.4, 1.0)                      # gains other than 1
    if k.endswith("output_gate_bias"):
        return normal(v.shape, 1.5)
    if k.endswith("e_score_correction_bias"):
        return normal(v.shape, 0.1)                           # the bias changes the selection
    if k.endswith("mlp.gate.weight"):
        return v * 30                                         # routing far from uniform
    if k == "model.embed_tokens.weight":
        return v * 50
    if k == "lm_head.weight":
        return v * 10                                         # logits inside the softcap's steep part
    return v * 4


def flint(k, v, normal, config):
    if k.endswith("sinks") or k.endswith("softmax_offset"):
        return normal(v.shape, 1.5)                           # sinks well away from 0
    if "norm" in k:
        return normal(v.shape, 0.3, 1.0)                      # norm gains
    if k.endswith("gate.weight"):
        return v * 10                                         # decisive routing
    if "embed" in k or "lm_head" in k:
        return v * 20
    return v * 4                                              # projections, experts


def inkling2(k, v, normal, config):
    hq, hkv, d, dr = (config[key] for key in ("num_attention_heads", "num_key_value_heads", "head_dim", "d_rel"))
    if "query" in k:
        return normal(v.shape, 0.3)                           # AttnRes pseudo-queries
    if k.endswith("l2_clip.scale"):
        return 6 * np.exp(normal(v.shape, 0.4))               # the clip active on some tokens
    if "sconv" in k or "relative_table" in k:
        return normal(v.shape, 0.3)                           # conv taps; relative logits and the sink
    if "e_score_correction_bias" in k:
        return normal(v.shape, 0.3)
    if "norm" in k and v.ndim == 1:
        return normal(v.shape, 0.2, 1.0)
    if k.endswith("qkvr.weight"):
        v = v.copy()
        v[hq * d:hq * d + hkv * d] *= 8                       # k large enough to be clipped
        v[(hq + 2 * hkv) * d + hq * dr:] *= 10                # dynamic taps (full layers)
        return v
    if k.endswith("gate.weight") and "mlp" not in k:
        return normal(v.shape, 0.3)                           # attention output gate
    return v


def main(src, dst, seed):
    rng = np.random.default_rng(int(seed))
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    rule = {"beam": beam, "flint": flint, "inkling2": inkling2}[config["model_type"]]
    normal = lambda shape, std, mean=0.0: rng.normal(mean, std, shape)
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), dst)
    weights = load_file(os.path.join(src, "model.safetensors"))
    out = {k: np.ascontiguousarray(np.asarray(rule(k, v, normal, config), dtype=np.float32))
           for k, v in sorted(weights.items())}
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
