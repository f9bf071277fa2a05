"""Float64 NumPy reference forward pass of the Flint family (MODELS.md §2, §0, §10.1, §10.3).

Written from the specification and HF/Qwen2-MoE conventions, not from atoll's C++ sources.
Numerics are those of precision fp32 (no bf16 rounding), carried out in float64.
"""
import numpy as np


def rms_norm(x, weight, eps):
    """§0.2: x * rsqrt(mean(x^2) + eps), times the gamma (§10.1.2: q/k norms use rms_norm_eps)."""
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def silu(x):
    return x / (1.0 + np.exp(-x))


def swiglu_mlp(x, gate_w, up_w, down_w):
    """§0.6 / §2.2: plain SwiGLU, silu(x Wg^T) * (x Wu^T), then Wd^T (PyTorch Linear layout, §0.1)."""
    return (silu(x @ gate_w.T) * (x @ up_w.T)) @ down_w.T


def attention_mask(positions, valid, window):
    """§0.3 / §10.1.3-4 / §10.3.5: key k visible to query q iff valid[k], q - pos[q] <= k <= q
    (same document, causal; a row may start inside a document), and on sliding layers q - k <= window - 1."""
    S = positions.shape[-1]
    q = np.arange(S)[:, None]
    k = np.arange(S)[None, :]
    mask = (k <= q) & (k >= q - positions[:, :, None]) & valid[:, None, :]
    if window is not None:
        mask &= (q - k) < window
    return mask  # [B, S, S]


def rope(x, positions, theta):
    """§2.2 / §10.1.11: NeoX rotate-half RoPE on all D channels, inv_freq = theta^(-2i/D),
    angles = document position * inv_freq, duplicated-half cos/sin tables. x: [B, S, heads, D]."""
    D = x.shape[-1]
    inv_freq = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    angles = positions[:, :, None].astype(np.float64) * inv_freq  # [B, S, D/2]
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)[:, :, None, :]
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)[:, :, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin


def self_attention(cfg, w, p, x, positions, valid, sliding):
    """§2.2: q/k/v projections, per-head q_norm/k_norm before RoPE (sliding layers only; full layers
    are NoPE), GQA (§10.1.1), scale D^-0.5, per-head sink logit in the softmax denominator with zero
    value (§2.2, §10.3.1: every layer), masked per §0.3, then o_proj."""
    B, S, _ = x.shape
    Hq, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    q = (x @ w[p + "q_proj.weight"].T).reshape(B, S, Hq, D)
    k = (x @ w[p + "k_proj.weight"].T).reshape(B, S, Hkv, D)
    v = (x @ w[p + "v_proj.weight"].T).reshape(B, S, Hkv, D)
    q = rms_norm(q, w[p + "q_norm.weight"], eps)
    k = rms_norm(k, w[p + "k_norm.weight"], eps)
    if sliding:
        q = rope(q, positions, cfg["rope_theta"])
        k = rope(k, positions, cfg["rope_theta"])
    # §10.1.1: query head h reads KV head h // (Hq / Hkv)
    kv_of = np.arange(Hq) // (Hq // Hkv)
    k, v = k[:, :, kv_of], v[:, :, kv_of]  # [B, S, Hq, D]
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) * D ** -0.5
    mask = attention_mask(positions, valid, cfg["sliding_window"] if sliding else None)[:, None]
    sinks = w[p + "softmax_offset"][None, :, None, None]  # §10.3.1 HF key of the sink holder
    scores = np.where(mask, scores, -np.inf)
    top = np.maximum(scores.max(axis=-1, keepdims=True), sinks)  # finite thanks to the sink
    e = np.where(mask, np.exp(scores - top), 0.0)
    probs = e / (np.exp(sinks - top) + e.sum(axis=-1, keepdims=True))
    # §10.1.4: a query with no visible key outputs 0 (the empty sum gives exactly that)
    out = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, S, Hq * D)
    return out @ w[p + "o_proj.weight"].T


def route(cfg, x, gate_w):
    """§2.2 / §10.1.7 / §10.1.9 / §10.3.4: fp32 router logits, softmax over all E then top-K
    (softmax_before_topk), sorted by score descending with ties to the lower expert id;
    renormalised only when norm_topk_prob and K > 1 (§0.5); route_scale 1."""
    K = cfg["num_experts_per_tok"]
    logits = x @ gate_w.T  # [T, E]
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    idx = np.argsort(-probs, axis=-1, kind="stable")[:, :K]  # stable: ties keep the lower id first
    weights = np.take_along_axis(probs, idx, axis=-1)
    if cfg.get("norm_topk_prob", False) and K > 1:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
    return idx, weights


def moe(cfg, w, p, x, valid):
    """§2.2 / §10.1.8 / §10.3.2-4: routed SwiGLU experts (HF per-expert layout), routing weight
    applied after down_proj, summed over the K slots; invalid tokens get a routed output of 0;
    the ungated shared expert runs on every token with weight 1."""
    B, S, H = x.shape
    t = x.reshape(-1, H)
    idx, weights = route(cfg, t, w[p + "gate.weight"])
    out = np.zeros_like(t)
    for e in range(cfg["num_experts"]):
        e_p = f"{p}experts.{e}."
        sel = (idx == e) & valid.reshape(-1, 1)  # [T, K]
        rows = sel.any(axis=-1)
        if not rows.any():
            continue
        y = swiglu_mlp(t[rows], w[e_p + "gate_proj.weight"], w[e_p + "up_proj.weight"], w[e_p + "down_proj.weight"])
        out[rows] += (weights[rows] * sel[rows]).sum(axis=-1, keepdims=True) * y  # §0.5: y *= w after down
    if cfg.get("shared_expert_intermediate_size", 0) > 0:
        s_p = p + "shared_expert."
        out += swiglu_mlp(t, w[s_p + "gate_proj.weight"], w[s_p + "up_proj.weight"], w[s_p + "down_proj.weight"])
    return out.reshape(B, S, H)


def decoder_layer(cfg, w, i, h, positions, valid):
    """§2.2: pre-norm block, h += attn(input_layernorm(h)); h += mlp_or_moe(post_attention_layernorm(h)).
    Dense SwiGLU MLP on mlp_only_layers, MoE elsewhere; sliding layers per layer_types."""
    p = f"model.layers.{i}."
    eps = cfg["rms_norm_eps"]
    sliding = cfg["layer_types"][i] == "sliding_attention"
    h = h + self_attention(cfg, w, p + "self_attn.", rms_norm(h, w[p + "input_layernorm.weight"], eps),
                           positions, valid, sliding)
    x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
    if i in cfg.get("mlp_only_layers", []):
        m = p + "mlp."
        return h + swiglu_mlp(x, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
    return h + moe(cfg, w, p + "mlp.", x, valid)


def logits(config, weights, input_ids, positions, valid):
    """[B, S, V] float64 logits: embedding, the decoder layers, model.norm, the untied lm_head with no
    softcap (§2.2, §10.3.4), then columns >= unpadded_vocab_size set to -inf (§0.4, §10.1.5)."""
    input_ids = np.asarray(input_ids, dtype=np.int64)
    positions = np.asarray(positions, dtype=np.int64)
    valid = np.asarray(valid, dtype=bool)
    # §0.3 / §10.1.3: positions restart at 0 or grow by 1; negative positions are an error
    assert (positions >= 0).all()
    assert ((positions[:, 1:] == 0) | (positions[:, 1:] == positions[:, :-1] + 1)).all()
    h = weights["model.embed_tokens.weight"][input_ids]
    for i in range(config["num_hidden_layers"]):
        h = decoder_layer(config, weights, i, h, positions, valid)
    h = rms_norm(h, weights["model.norm.weight"], config["rms_norm_eps"])
    z = h @ weights["lm_head.weight"].T  # §2.2: untied head
    z[..., config.get("unpadded_vocab_size", config["vocab_size"]):] = -np.inf
    return z
