#!/usr/bin/env python3
"""Independent oracle: PyTorch (fp64) forward and autograd gradients for small cases, written as
golden files that tests/unit/test_golden.cpp compares the host kernels against.

Run on the GPU machine (it has PyTorch):  python3 tests/golden/make_golden.py OUTDIR
Writes OUTDIR/golden.h5 when h5py is importable, else OUTDIR/golden.npz; convert the latter here with
  /usr/bin/python3 tests/golden/npz_to_h5.py OUTDIR/golden.npz tests/golden/golden.h5
Inputs are drawn from a seeded generator; every tensor is stored in fp64, layouts as named below.
"""
import sys
import torch
import torch.nn.functional as F

torch.manual_seed(1234)
dev = "cuda" if torch.cuda.is_available() else "cpu"
f64 = torch.float64
out = {}


def r(*shape, lo=-1.0, hi=1.0):
    return (torch.rand(*shape, dtype=f64, device=dev) * (hi - lo) + lo).requires_grad_(True)


def put(name, t):
    out[name] = t.detach().to("cpu", f64).contiguous().numpy()


# ---- attention: SDPA, causal, GQA (8 q heads, 2 kv heads), B=2, L=37, D=16 -------------------
B, L, H, HKV, D = 2, 37, 8, 2, 16
for causal in (True, False):
    tag = "attention_causal" if causal else "attention_full"
    q, k, v = r(B, L, H, D), r(B, L, HKV, D), r(B, L, HKV, D)
    do = torch.rand(B, L, H, D, dtype=f64, device=dev)
    kk = k.repeat_interleave(H // HKV, dim=2)
    vv = v.repeat_interleave(H // HKV, dim=2)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
                                       is_causal=causal).transpose(1, 2)
    o.backward(do)
    for n, t in (("q", q), ("k", k), ("v", v), ("dout", do), ("out", o)):
        put(f"{tag}/{n}", t)  # [B,L,H,D]
    for n, t in (("dq", q), ("dk", k), ("dv", v)):
        put(f"{tag}/{n}", t.grad)

# ---- RMSNorm ----------------------------------------------------------------------------------
x, w = r(6, 24), r(24, lo=0.5, hi=1.5)
dy = torch.rand(6, 24, dtype=f64, device=dev)
y = F.rms_norm(x, (24,), w, eps=1e-5)
y.backward(dy)
for n, t in (("x", x), ("w", w), ("dy", dy), ("y", y), ("dx", x.grad), ("dw", w.grad)):
    put(f"rmsnorm/{n}", t)

# ---- causal depthwise conv1d + SiLU, width 4, [B,L,C] ------------------------------------------
Bc, Lc, C, W = 2, 19, 6, 4
x, w, b = r(Bc, Lc, C), r(C, W), r(C)
dy = torch.rand(Bc, Lc, C, dtype=f64, device=dev)
y = F.silu(F.conv1d(x.transpose(1, 2), w.unsqueeze(1), b, padding=W - 1, groups=C)[..., :Lc]).transpose(1, 2)
y.backward(dy)
for n, t in (("x", x), ("w", w), ("b", b), ("dy", dy), ("y", y), ("dx", x.grad), ("dw", w.grad), ("db", b.grad)):
    put(f"conv1d/{n}", t)

# ---- RoPE (rotate-half), [T,H,D] with explicit positions ------------------------------------
T, Hr, Dr, RD, theta = 7, 3, 8, 8, 10000.0
pos = torch.tensor([0, 1, 2, 50, 51, 900, 4097], dtype=f64, device=dev)
x = r(T, Hr, Dr)
dy = torch.rand(T, Hr, Dr, dtype=f64, device=dev)
inv = theta ** (-torch.arange(0, RD, 2, dtype=f64, device=dev) / RD)
ang = pos[:, None] * inv[None, :]
cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
x1, x2 = x[..., : RD // 2], x[..., RD // 2: RD]
y = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., RD:]], dim=-1)
y.backward(dy)
for n, t in (("x", x), ("positions", pos), ("dy", dy), ("y", y), ("dx", x.grad)):
    put(f"rope/{n}", t)

# ---- MoE router: sigmoid, correction bias for selection, top-2 of 8, renormalised, x2.5 -------
Tm, E, K = 9, 8, 2
logits = torch.randn(Tm, E, dtype=f64, device=dev).mul(2.0).requires_grad_(True)
bias = torch.rand(E, dtype=f64, device=dev) * 0.2
dw = torch.rand(Tm, K, dtype=f64, device=dev)
scores = torch.sigmoid(logits)
idx = torch.topk(scores + bias, K, dim=-1).indices
wsel = scores.gather(1, idx)
wsel = wsel / wsel.sum(-1, keepdim=True) * 2.5
wsel.backward(dw)
for n, t in (("logits", logits), ("bias", bias), ("dw", dw), ("scores", scores), ("topk_idx", idx.to(f64)),
             ("topk_w", wsel), ("dlogits", logits.grad)):
    put(f"router/{n}", t)

# ---- cross-entropy, sum over label tokens, ignore -100 -----------------------------------------
Tc, V = 10, 13
logits = r(Tc, V, lo=-3, hi=3)
labels = torch.randint(0, V, (Tc,), device=dev)
labels[3] = -100
labels[7] = -100
loss = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
loss.backward()
for n, t in (("logits", logits), ("labels", labels.to(f64)), ("loss", loss.reshape(1)), ("dlogits", logits.grad)):
    put(f"cross_entropy/{n}", t)

# ---- Mamba2 SSD: plain recurrence in torch, autograd for every gradient ------------------------
b_, L_, H_, P_, G_, N_ = 1, 11, 4, 3, 2, 5
x, dt, A_log = r(b_, L_, H_, P_), r(b_, L_, H_, lo=-2, hi=0.5), r(H_, lo=-0.5, hi=0.8)
Bm, Cm, Dp, dtb = r(b_, L_, G_, N_), r(b_, L_, G_, N_), r(H_), r(H_, lo=-0.5, hi=0.5)
dy = torch.rand(b_, L_, H_, P_, dtype=f64, device=dev)
dte = F.softplus(dt + dtb)
A = -torch.exp(A_log)
Bh = Bm.repeat_interleave(H_ // G_, dim=2)
Ch = Cm.repeat_interleave(H_ // G_, dim=2)
S = torch.zeros(b_, H_, P_, N_, dtype=f64, device=dev)
ys = []
for t in range(L_):
    a = torch.exp(dte[:, t] * A)  # [b,H]
    S = a[..., None, None] * S + (dte[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
    ys.append((S * Ch[:, t, :, None, :]).sum(-1) + Dp[None, :, None] * x[:, t])
y = torch.stack(ys, dim=1)
y.backward(dy)
for n, t in (("x", x), ("dt", dt), ("A_log", A_log), ("B", Bm), ("C", Cm), ("D", Dp), ("dt_bias", dtb), ("dy", dy),
             ("y", y), ("dx", x.grad), ("ddt", dt.grad), ("dA_log", A_log.grad), ("dB", Bm.grad), ("dC", Cm.grad),
             ("dD", Dp.grad), ("ddt_bias", dtb.grad)):
    put(f"ssd/{n}", t)

outdir = sys.argv[1] if len(sys.argv) > 1 else "."
try:
    import h5py
    with h5py.File(f"{outdir}/golden.h5", "w") as f:
        f.attrs["generator"] = f"tests/golden/make_golden.py, torch {torch.__version__}, device {dev}"
        for k_, v_ in out.items():
            f.create_dataset(k_, data=v_)
    print(f"wrote {outdir}/golden.h5 ({len(out)} datasets)")
except ImportError:
    import numpy as np
    np.savez(f"{outdir}/golden.npz", __generator__=np.array(f"torch {torch.__version__}, device {dev}"),
             **{k_.replace("/", "__"): v_ for k_, v_ in out.items()})
    print(f"wrote {outdir}/golden.npz ({len(out)} arrays); convert with npz_to_h5.py")
