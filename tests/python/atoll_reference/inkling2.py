"""Float64 NumPy reference forward pass of the Inkling2 family (text decoder), written from
/work/shared/MODELS.md (§0, §1, §10.1, §10.2) for fp32 parity checks; it never rounds to bf16.

Inputs follow the HF layout that `atoll-convert export` writes (§10.2.10: no `model.` prefix,
residual queries as [H] vectors, experts as gate_up_proj [E, 2I, H] interleaved and down_proj [E, H, I]).
"""
import numpy as np


def rms(x, eps, weight=None):
    """RMSNorm over the last axis (§0.2); no-gamma form when weight is None."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * weight


def residual_mix(sources, w, eps):
    """AttnRes depth mix (§1.3, §10.2.6): keys are the RMS-normalised sources (no gamma), one logit per
    source and token, softmax over the sources, weighted sum of the unnormalised sources. N = 1 is the identity."""
    if len(sources) == 1 or w is None:
        assert len(sources) == 1, "a mix of several sources needs a query"
        return sources[0]
    x = np.stack(sources)                                  # [N, B, S, H]
    logit = rms(x, eps) @ w                                # [N, B, S]
    a = np.exp(logit - logit.max(axis=0))
    a /= a.sum(axis=0)
    return (a[..., None] * x).sum(axis=0)


def lagged(x, positions, j):
    """lag_j(x)[t] = x[t-j] if pos[t] >= j (and t-j is inside the row) else 0 (§1.4 step 2, §10.1.3, §10.2.3)."""
    out = np.zeros_like(x)
    if j < x.shape[1]:
        out[:, j:] = x[:, :x.shape[1] - j]
    keep = positions >= j
    return out * keep.reshape(keep.shape + (1,) * (x.ndim - 2))


def short_conv(x, taps, positions, valid):
    """Residual short convolution y = x + sum_j w_j lag_j(x) (§10.2.3), inputs zeroed at invalid tokens.
    x [B,S,G,C]; taps [G,W] (static, per group of C channels) or [B,S,G,W] (dynamic, per token)."""
    x = x * valid[:, :, None, None]
    y = x.copy()
    for j in range(taps.shape[-1]):
        y += taps[..., j:j + 1] * lagged(x, positions, j)
    return y


def static_conv_hidden(x, weight, head_dim, positions, valid):
    """Layer-level attn_sconv / mlp_sconv: weight [H/D, W], channel c uses row c // D (§10.2.3)."""
    B, S, H = x.shape
    return short_conv(x.reshape(B, S, H // head_dim, head_dim), weight, positions, valid).reshape(B, S, H)


def l2_clip(x, radius, scale=None):
    """L2 clip per head vector (§1.4 step 3, §10.2.5): u = scale*x; u * min(1, radius / max(|u|, tiny))."""
    u = x if scale is None else x * scale
    norm = np.sqrt(np.sum(u * u, axis=-1, keepdims=True))
    return u * np.minimum(1.0, radius / np.maximum(norm, 1e-12))


def attention_mask(positions, valid, window):
    """mask[b,q,k] = valid[k] && max(0, q-pos[q]) <= k <= q && (window is None || q-k < window) (§0.3, §10.1.3)."""
    S = positions.shape[1]
    q = np.arange(S)[None, :, None]
    k = np.arange(S)[None, None, :]
    start = np.maximum(0, q - positions[:, :, None])
    mask = valid[:, None, :] & (k >= start) & (k <= q)
    if window is not None:
        mask &= (q - k) < window
    return mask


def relative_bias(r, table, R):
    """Relative logits (§1.4 step 5, §10.2.4): P = r @ table[:, :R]; bias[q,k] = P[q, q-k] for 0 <= q-k < R, else 0.
    The sink logit is r . table[:, R]. r [B,S,Hq,dr] -> bias [B,Hq,S,S], sink [B,Hq,S]."""
    S = r.shape[1]
    profiles = np.einsum("bthi,ir->bhtr", r, table[:, :R])
    dist = np.arange(S)[:, None] - np.arange(S)[None, :]        # q - k
    inside = (dist >= 0) & (dist < R)
    bias = np.where(inside, np.take_along_axis(
        profiles, np.broadcast_to(np.clip(dist, 0, R - 1), profiles.shape[:2] + (S, S)), axis=-1), 0.0)
    sink = np.einsum("bthi,i->bht", r, table[:, R])
    return bias, sink


def attention(cfg, w, p, xq, xk, xv, positions, valid, local):
    """Inkling2Attention (§1.4 and the call order of §10.2.1); returns wo_ud's output [B,S,H] (before attn_sconv)."""
    B, S, H = xq.shape
    Hq, Hkv, D, dr, W = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                         cfg["d_rel"], cfg["conv_kernel_size"])
    eps = cfg["rms_norm_eps"]
    # (1) qkvr row blocks q | k | v | r | (k-taps | v-taps), head-major (§10.2.2)
    sizes = [Hq * D, Hkv * D, Hkv * D, Hq * dr] + ([] if local else [Hkv * W, Hkv * W])
    blocks = np.split(w[p + "self_attn.qkvr.weight"], np.cumsum(sizes)[:-1])
    q = (xq @ blocks[0].T).reshape(B, S, Hq, D)
    k = (xk @ blocks[1].T).reshape(B, S, Hkv, D)
    v = (xv @ blocks[2].T).reshape(B, S, Hkv, D)
    r = (xq @ blocks[3].T).reshape(B, S, Hq, dr)
    # (2) K/V short convs per KV head: static taps on local layers, raw token-generated taps on full layers (§10.2.3)
    if local:
        k_taps, v_taps = w[p + "self_attn.k_sconv.weight"], w[p + "self_attn.v_sconv.weight"]
    else:
        k_taps = (xk @ blocks[4].T).reshape(B, S, Hkv, W)
        v_taps = (xv @ blocks[5].T).reshape(B, S, Hkv, W)
    k = short_conv(k, k_taps, positions, valid)
    v = short_conv(v, v_taps, positions, valid)
    # (3) L2 clips (§10.2.5); radius 0 or missing means the default √D, √D, √dr
    radius = lambda key, default: cfg.get(key) or default
    q = l2_clip(q, radius("l2_clip_radius_q", np.sqrt(D)), w[p + "self_attn.q_l2_clip.scale"])
    k = l2_clip(k, radius("l2_clip_radius_k", np.sqrt(D)))
    r = l2_clip(r, radius("l2_clip_radius_r", np.sqrt(dr)), w[p + "self_attn.rel_l2_clip.scale"])
    # (4) optional value norm, no gamma, per head (§1.4 step 4)
    if cfg.get("use_value_norm_no_gamma"):
        v = rms(v, eps)
    # (5) relative bias and sink from the clipped r; R = window on local layers, rel_extent on full ones (§10.2.4)
    window = cfg["sliding_window_size"] if local else None
    R = window if local else cfg["rel_extent"]
    table = w[p + "self_attn.relative_table"]
    assert table.shape == (dr, R + 1), table.shape
    bias, sink = relative_bias(r, table, R)
    # (6) full-layer log scaling by document position, on q and the bias, not the sink (§1.4 step 6, §10.2.1)
    n_floor = cfg.get("log_scaling_n_floor")
    if not local and n_floor:
        lam = 1.0 + cfg["log_scaling_alpha"] * np.log(np.maximum(1.0, (positions + 1) / n_floor))   # [B,S]
        q = q * lam[:, :, None, None]
        bias = bias * lam[:, None, :, None]
    # (7) scores with GQA (query head h uses KV head h // (Hq/Hkv), §10.1.1), mask, softmax with the sink
    kh = np.repeat(k, Hq // Hkv, axis=2)
    vh = np.repeat(v, Hq // Hkv, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, kh) / np.sqrt(D) + bias
    mask = attention_mask(positions, valid, window)[:, None]
    scores = np.where(mask, scores, -np.inf)
    top = np.maximum(scores.max(axis=-1), sink)                                    # finite: the sink is finite
    e = np.where(mask, np.exp(scores - top[..., None]), 0.0)
    denom = e.sum(axis=-1) + np.exp(sink - top)
    probs = e / denom[..., None]                                                   # no visible key -> all zero
    # (8) o = sum p v (the sink has zero value)
    o = np.einsum("bhqk,bkhd->bqhd", probs, vh)
    # (9) optional per-head sigmoid gate read from xq (§1.2; its input is not fixed by MODELS.md)
    if cfg.get("use_attention_gate"):
        o = o / (1.0 + np.exp(-(xq @ w[p + "self_attn.gate.weight"].T)))[..., None]
    # (10) wo_ud
    return o.reshape(B, S, Hq * D) @ w[p + "self_attn.wo_ud.weight"].T


def route(cfg, w, p, x):
    """sigmoid_with_bias router (§0.5, §10.1.7, §10.2.7): returns expert ids and weights, [T, K] each."""
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    s = 1.0 / (1.0 + np.exp(-(x @ w[p + "mlp.gate.weight"].T)))
    c = s + w[p + "mlp.gate.e_score_correction_bias"]
    n_group = cfg.get("n_group", 1) or 1
    if n_group > 1:   # grouped selection: group score = sum of top-2 biased scores, dropped groups -> -inf
        g = c.reshape(len(c), n_group, E // n_group)
        group_score = -np.sort(-g, axis=-1)[..., :min(2, E // n_group)].sum(-1)
        keep_groups = np.argsort(-group_score, axis=-1, kind="stable")[:, :cfg["topk_group"]]
        keep = np.zeros(group_score.shape, bool)
        np.put_along_axis(keep, keep_groups, True, axis=-1)
        c = np.where(np.repeat(keep, E // n_group, axis=-1), c, -np.inf)
    idx = np.argsort(-c, axis=-1, kind="stable")[:, :K]     # descending, ties to the lower id
    weight = np.take_along_axis(s, idx, axis=-1)            # unbiased scores
    if cfg.get("norm_topk_prob", True) and K > 1:
        weight = weight / (weight.sum(-1, keepdims=True) + 1e-20)
    return idx, weight * cfg.get("route_scale", 1.0)


def moe(cfg, w, p, x, valid):
    """Inkling2MoE (§1.5, §10.1.8): interleaved capped SwiGLU, routing weight before the down projection,
    invalid tokens routed but not dispatched (output 0)."""
    B, S, H = x.shape
    assert not cfg.get("n_shared_experts"), "Inkling2 has no shared experts (§10.2.7)"
    bg, bu = cfg["expert_gate_cap"], cfg["expert_up_cap"]
    gate_up, down = w[p + "mlp.experts.gate_up_proj"], w[p + "mlp.experts.down_proj"]   # [E,2I,H], [E,H,I]
    xt = x.reshape(-1, H)
    idx, weight = route(cfg, w, p, xt)
    out = np.zeros_like(xt)
    for t in np.flatnonzero(valid.reshape(-1)):
        for e, wt in zip(idx[t], weight[t]):
            gu = gate_up[e] @ xt[t]
            g, u = gu[0::2], gu[1::2]                                          # interleaved g0,u0,g1,u1,...
            a = bg * np.tanh(g / bg) / (1.0 + np.exp(-g)) * (bu * np.tanh(u / bu))   # situ_glu (§0.6, §10.1.10)
            out[t] += down[e] @ (a * wt)
    return out.reshape(B, S, H)


def decoder_layer(cfg, w, l, completed, partial, positions, valid):
    """Inkling2DecoderLayer (§1.3 pseudo-code, §10.2.6); returns the new (completed, partial)."""
    p = f"layers.{l}."
    eps, D = cfg["rms_norm_eps"], cfg["head_dim"]
    local = l in cfg["local_layer_ids"]
    src = completed + [partial]
    norm = lambda i, x: rms(x, eps, w[f"{p}attn_norms.{i}.weight"])
    if local:
        x = norm(0, residual_mix(src, w.get(p + "attn_query.weight"), eps))
        xq = xk = xv = x
    else:   # three depth queries (rows q, k, v); at layer 0 the three norms apply to the single source
        xq, xk, xv = (norm(i, residual_mix(src, w.get(f"{p}attn_query.{i}.weight"), eps)) for i in range(3))
    if l % cfg["n_layers_per_attnres_block"] == 0:   # boundary: commit the pre-attention partial
        completed, partial = completed + [partial], None
    a = static_conv_hidden(attention(cfg, w, p, xq, xk, xv, positions, valid, local),
                           w[p + "attn_sconv.weight"], D, positions, valid)
    partial = a if partial is None else partial + a
    m_in = rms(residual_mix(completed + [partial], w[p + "mlp_query.weight"], eps), eps, w[p + "mlp_norm.weight"])
    m = static_conv_hidden(moe(cfg, w, p, m_in, valid), w[p + "mlp_sconv.weight"], D, positions, valid)
    return completed, partial + m


def logits(config, weights, input_ids, positions, valid):
    """Float64 logits [B, S, vocab_size]: embed + embed_norm, the layers, output mix, norm, lm_head,
    softcap, columns >= Vu set to -inf (§1.3 'Final', §0.4, §10.1.5)."""
    cfg, w = config, weights
    input_ids, positions = np.asarray(input_ids, np.int64), np.asarray(positions, np.int64)
    valid = np.asarray(valid, bool)
    assert (positions >= 0).all(), "negative positions (§10.1.3)"
    step_ok = (positions[:, 1:] == positions[:, :-1] + 1) | (positions[:, 1:] == 0)
    assert step_ok.all(), "positions must grow by 1 or restart at 0 (§0.3)"
    eps = cfg["rms_norm_eps"]
    completed, partial = [], rms(w["embed_tokens.weight"][input_ids], eps, w["embed_norm.weight"])
    for l in range(cfg["num_hidden_layers"]):
        completed, partial = decoder_layer(cfg, w, l, completed, partial, positions, valid)
    h = rms(residual_mix(completed + [partial], w["output_query.weight"], eps), eps, w["norm.weight"])
    z = h @ w["lm_head.weight"].T
    cap = cfg.get("final_logit_softcapping")
    if cap:
        z = cap * np.tanh(z / cap)
    z[..., cfg.get("unpadded_vocab_size") or cfg["vocab_size"]:] = -np.inf
    return z
