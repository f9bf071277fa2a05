"""Beam ("BeamForCausalLM") reference forward pass in float64 NumPy.

Written from ../../shared/MODELS.md (§0 conventions, §3 Beam, §10.1/§10.4 binding decisions) and
HF naming conventions, not from atoll's C++ code. fp32 semantics only: nothing is rounded to bf16.
"""
import numpy as np


def rms_norm(x, weight, eps):
    """§0.2 / §10.4.4: weight * x / sqrt(mean(x^2) + eps) over the last axis (no `1 + weight`)."""
    return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def swiglu(x, w_gate, w_up, w_down):
    """§3.4 dense MLP / shared expert: down(silu(gate x) * up x); weights [out, in] (§0.1)."""
    return (silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def rope(x, pos, theta):
    """§3.3 / §10.1.11: NeoX rotate-half RoPE; inv_freq = theta^(-2i/D), angle = pos * inv_freq.
    x [B, S, heads, D], pos [B, S] the document position."""
    d = x.shape[-1]
    inv_freq = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)      # [D/2]
    ang = pos[..., None].astype(np.float64) * inv_freq                    # [B, S, D/2]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, :, None, :]      # duplicated-half layout
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin


def attention_mask(pos, valid, window):
    """§0.3 / §10.1.3-4: query t sees key k iff valid[k] and max(0, t - pos[t]) <= k <= t and, on
    sliding layers, t - k < window (the window counts the current token). Returns [B, S(q), S(k)]."""
    s = pos.shape[1]
    t = np.arange(s)[:, None]
    k = np.arange(s)[None, :]
    doc_start = (np.arange(s)[None, :] - pos)[:, :, None]                 # [B, S, 1]
    mask = (k <= t)[None] & (k >= doc_start) & valid[:, None, :]
    if window is not None:
        mask &= (t - k < window)[None]
    return mask


def beam_attention(cfg, w, p, x, pos, valid, sliding):
    """§3.3, §10.4.2-4: GQA with q/k norms, RoPE (sliding) or NoPE + SSMax (full), output gate."""
    b, s, _ = x.shape
    hq, hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    q = (x @ w[p + "q_proj.weight"].T).reshape(b, s, hq, d)
    k = (x @ w[p + "k_proj.weight"].T).reshape(b, s, hkv, d)
    v = (x @ w[p + "v_proj.weight"].T).reshape(b, s, hkv, d)
    # §10.4.4 per-head q_norm / k_norm on every layer, before RoPE or SSMax (eps = rms_norm_eps, §10.1.2)
    q = rms_norm(q, w[p + "q_norm.weight"], eps)
    k = rms_norm(k, w[p + "k_norm.weight"], eps)
    if sliding:
        q, k = rope(q, pos, cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"])
    else:  # §10.4.2 SSMax on q only, full layers only, document position
        q = q * ((1.0 + (pos + 1.0) / cfg["ssmax_base"]) ** cfg["ssmax_exponent"])[:, :, None, None]
    # §10.1.1 GQA: query head h reads KV head h // (Hq / Hkv)
    k = np.repeat(k, hq // hkv, axis=2)
    v = np.repeat(v, hq // hkv, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) * d ** -0.5               # §3.3 scale D^-0.5
    mask = attention_mask(pos, valid, cfg["sliding_window"] if sliding else None)[:, None]
    scores = np.where(mask, scores, -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    e = np.where(mask, np.exp(scores - np.where(np.isfinite(m), m, 0.0)), 0.0)
    z = e.sum(axis=-1, keepdims=True)
    probs = np.divide(e, z, out=np.zeros_like(e), where=z > 0)            # §10.1.4 no visible key -> 0
    o = np.einsum("bhqk,bkhd->bqhd", probs, v)
    # §10.4.3 output gate from the attention input x, per-head bias broadcast over D, before o_proj
    gate = (x @ w[p + "output_gate_proj.weight"].T).reshape(b, s, hq, d)
    o = o * sigmoid(gate + w[p + "output_gate_bias"][None, None, :, None])
    return o.reshape(b, s, hq * d) @ w[p + "o_proj.weight"].T


def route(cfg, x, w_gate, bias):
    """§0.5 sigmoid_with_bias + §10.1.7 + §10.4.6: grouped noaux_tc selection on biased scores,
    unbiased weights, normalised (also for top-1 when norm_topk_prob_top1), times the scaling factor.
    x [T, H] -> (idx [T, K], weights [T, K])."""
    e, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    n_group, topk_group = cfg.get("n_group", 1), cfg.get("topk_group", 1)
    s = sigmoid(x @ w_gate.T)                                             # [T, E]
    c = s + bias
    if n_group > 1:
        grouped = c.reshape(-1, n_group, e // n_group)
        top2 = -np.sort(-grouped, axis=-1)[..., : min(2, e // n_group)]  # top-2 biased scores per group
        group_score = top2.sum(axis=-1)                                    # [T, n_group]
        keep = np.argsort(-group_score, axis=-1, kind="stable")[:, :topk_group]
        group_ok = np.zeros_like(group_score, dtype=bool)
        np.put_along_axis(group_ok, keep, True, axis=-1)
        c = np.where(np.repeat(group_ok, e // n_group, axis=-1), c, -np.inf)  # dropped groups -> -inf
    idx = np.argsort(-c, axis=-1, kind="stable")[:, :k]                   # descending, ties -> lower id
    wts = np.take_along_axis(s, idx, axis=-1)
    if cfg.get("norm_topk_prob", True) and (k > 1 or cfg.get("norm_topk_prob_top1", True)):
        wts = wts / (wts.sum(axis=-1, keepdims=True) + 1e-20)
    return idx, wts * cfg.get("routed_scaling_factor", 1.0)


def moe(cfg, w, p, x, valid):
    """§3.4 / §10.1.8 / §10.4.6: routed SwiGLU experts, routing weight before down, invalid tokens
    not dispatched; optional shared experts on every token with weight 1. x [B, S, H]."""
    b, s, h = x.shape
    xt, vt = x.reshape(-1, h), valid.reshape(-1)
    idx, wts = route(cfg, xt, w[p + "gate.weight"], w[p + "gate.e_score_correction_bias"])
    out = np.zeros_like(xt)
    for e in range(cfg["n_routed_experts"]):
        ep = f"{p}experts.{e}."  # HF per-expert layout (§5.8): gate/up [I, H], down [H, I]
        hit = (idx == e) & vt[:, None]
        tok = np.nonzero(hit.any(axis=-1))[0]
        if tok.size == 0:
            continue
        we = (wts * hit).sum(axis=-1)[tok, None]
        a = we * silu(xt[tok] @ w[ep + "gate_proj.weight"].T) * (xt[tok] @ w[ep + "up_proj.weight"].T)
        out[tok] += a @ w[ep + "down_proj.weight"].T
    for sp in (p + "shared_experts.", p + "shared_expert."):
        if sp + "gate_proj.weight" in w:
            out += swiglu(xt, w[sp + "gate_proj.weight"], w[sp + "up_proj.weight"], w[sp + "down_proj.weight"])
    return out.reshape(b, s, h)


def residual_coefs(cfg, idx):
    """§3.2 / §10.4.1 depth-scaled residual: cs = 1/sqrt(idx), cr = sqrt((idx-1)/idx); else 1, 1."""
    if not cfg.get("depth_scaled_residual", False):
        return 1.0, 1.0
    return 1.0 / np.sqrt(idx), np.sqrt((idx - 1.0) / idx)


def block(cfg, w, i, h, pos, valid):
    """§3.2: sandwich norms around both sublayers, combined by the depth-scaled residual."""
    p, eps = f"model.layers.{i}.", cfg["rms_norm_eps"]
    sliding = cfg["layer_types"][i] == "sliding_attention"
    a = beam_attention(cfg, w, p + "self_attn.", rms_norm(h, w[p + "input_layernorm.weight"], eps), pos, valid, sliding)
    cs, cr = residual_coefs(cfg, 2 * i + 2)
    h = cs * rms_norm(a, w[p + "post_attention_layernorm.weight"], eps) + cr * h
    x = rms_norm(h, w[p + "pre_feedforward_layernorm.weight"], eps)
    if cfg["mlp_layer_types"][i] == "sparse":
        m = moe(cfg, w, p + "mlp.", x, valid)
    else:
        m = swiglu(x, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"])
    cs, cr = residual_coefs(cfg, 2 * i + 3)
    return cs * rms_norm(m, w[p + "post_feedforward_layernorm.weight"], eps) + cr * h


def head(cfg, w, h):
    """§3.4 untied lm_head, §0.4 / §10.1.5 softcap on every column then columns >= Vu set to -inf."""
    z = rms_norm(h, w["model.norm.weight"], cfg["rms_norm_eps"]) @ w["lm_head.weight"].T
    cap = cfg.get("final_logit_softcapping") or 0.0
    if cap > 0:
        z = cap * np.tanh(z / cap)
    z[..., cfg.get("unpadded_vocab_size", cfg["vocab_size"]):] = -np.inf
    return z


def logits(config, weights, input_ids, positions, valid):
    """float64 logits [B, S, vocab_size] for packed rows (§0.3: documents start where positions reset)."""
    ids = np.asarray(input_ids, dtype=np.int64)
    pos = np.asarray(positions, dtype=np.int64)
    valid = np.asarray(valid, dtype=bool)
    assert (pos >= 0).all(), "negative positions (§10.1.3)"
    steps = pos[:, 1:]
    assert ((steps == pos[:, :-1] + 1) | (steps == 0)).all(), "malformed positions (§0.3)"
    h = weights["model.embed_tokens.weight"][ids]                          # §10.4.4 no sqrt(H) scale
    for i in range(config["num_hidden_layers"]):
        h = block(config, weights, i, h, pos, valid)
    return head(config, weights, h)
