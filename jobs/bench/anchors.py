#!/usr/bin/env python3
"""Time the performance anchors (benchmarks/PERFORMANCE.md) on the GPU, on the shapes that
`bench_kernels --set bench.device=cuda --set bench.suite=anchors` uses, and write them as JSON.

  python3 jobs/bench/anchors.py --out anchors.json [--mamba-path DIR] [--repeats 20] [--warmup 5]

Anchors: PyTorch scaled_dot_product_attention with the flash (FlashAttention-2) and cuDNN backends
(forward, and forward+backward), torch.matmul (cuBLAS) for the dense GEMM, a device-to-device copy,
and, when --mamba-path names a directory holding the public mamba_ssm package sources (fetched by
the user, never part of this repository), its Triton SSD kernels (mamba_chunk_scan_combined).
With --only blocks (and train), the hybrid model's blocks at Nemotron-3-Nano sizes as a PyTorch user
would write them, and a training loop of the M*E stack (nano_blocks, blocks, train); with --only
longest, the longest M*E step that runs in the GPU's memory (one step per length of --longest-lens).
Timing: CUDA events around each call after warm-ups; median, min and max of the repeats (ms).
`jobs/post/hcp_post.py anchors --bench <bench_kernels.h5> --anchors anchors.json` makes the ratio table.
"""
import argparse
import json
import sys
import types


def timed(fn, warmup, repeats):
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ms.append(a.elapsed_time(b))
    s = sorted(ms)
    return {"median_ms": s[len(s) // 2], "min_ms": s[0], "max_ms": s[-1], "all_ms": ms}


def attention(res, warmup, repeats):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    # (B, H, kv heads, L, D, backward): bench_kernels' anchor shapes; GQA as the hybrid model's
    # attention (32 query heads on 2 kv heads). Flash has no GQA: its K/V heads are repeated inside the
    # timed call, as a PyTorch user of it would; cuDNN takes enable_gqa.
    shapes = [(2, 16, 16, 8192, 128, True), (4, 32, 32, 4096, 64, True), (1, 16, 16, 32768, 128, False)]
    shapes += [(1, 32, 2, L, D, True) for D in (128, 64) for L in (8192, 32768, 131072)]
    for (B, H, G, L, D, bwd) in shapes:
        tag = f"_b{B}h{H}" + ("" if G == H else f"g{G}") + f"l{L}d{D}"
        q = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(B, G, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        do = torch.randn_like(q)
        for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            def fwd():
                if G == H:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
                if be == SDPBackend.FLASH_ATTENTION:
                    return F.scaled_dot_product_attention(q, k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1),
                                                          is_causal=True)
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            try:
                with sdpa_kernel(be):
                    res[f"attention_fwd{tag}/{name}"] = timed(fwd, warmup, repeats)
                    if bwd:
                        def fb():
                            fwd().backward(do)
                        res[f"attention_fwdbwd{tag}/{name}"] = timed(fb, warmup, repeats)
            except Exception as e:  # a backend missing on this build: say so, keep going
                res[f"attention_fwd{tag}/{name}"] = {"error": str(e)[:200]}
        del q, k, v, do
        torch.cuda.empty_cache()


def dense_and_copy(res, warmup, repeats):
    import torch
    x = torch.randn(98304, 2688, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1856, 2688, device="cuda", dtype=torch.bfloat16)
    res["dense_gemm_same_flops/torch_matmul"] = timed(lambda: x @ w.t(), warmup, repeats)
    big = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(big)
    res["device_copy/torch_copy"] = timed(lambda: dst.copy_(big), warmup, repeats)


def mamba(res, path, warmup, repeats):
    import torch
    mamba_chunk_scan_combined = load_mamba_triton(path)
    b, L, H, P, G, N = 2, 8192, 128, 64, 8, 128
    x = torch.randn(b, L, H, P, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dt = (torch.rand(b, L, H, device="cuda", dtype=torch.float32) * 3 - 4).requires_grad_()
    A = (-torch.exp(torch.rand(H, device="cuda", dtype=torch.float32))).requires_grad_()
    Bm = torch.randn(b, L, G, N, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    Cm = torch.randn(b, L, G, N, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    D = torch.randn(H, device="cuda", dtype=torch.float32, requires_grad=True)
    dtb = (torch.rand(H, device="cuda", dtype=torch.float32) - 0.5).requires_grad_()
    f = lambda: mamba_chunk_scan_combined(x, dt, A, Bm, Cm, chunk_size=128, D=D, dt_bias=dtb, dt_softplus=True)
    with torch.no_grad():
        res["ssd_fwd/mamba_ssm_triton"] = timed(f, warmup, repeats)
    dy = torch.randn(b, L, H, P, device="cuda", dtype=torch.bfloat16)
    res["ssd_fwdbwd/mamba_ssm_triton"] = timed(lambda: f().backward(dy), warmup, repeats)


def load_mamba_triton(path):
    # Load only the Triton SSD modules: a bare package object keeps the package __init__ (which needs
    # the compiled selective-scan extension) from running.
    if path not in sys.path:
        sys.path.insert(0, path)
    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.utils"):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = [path + "/" + name.replace(".", "/")]
            sys.modules[name] = m
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    return mamba_chunk_scan_combined


def nano_blocks(path, L):
    """The hybrid model's blocks as a PyTorch user would write them, at Nemotron-3-Nano sizes, bf16,
    one sequence of L tokens: each block is RMSNorm -> mixer -> residual add. Mamba2 (in_proj,
    causal depthwise conv1d + SiLU, mamba_ssm Triton SSD, gated group RMSNorm, out_proj), attention
    (GQA projections, SDPA causal, cuDNN and flash), MoE (fp32 sigmoid router with selection bias,
    top-6 renormalised and scaled, sort-permute, torch._grouped_mm experts with relu^2, weighted
    combine, shared expert), the stack M*E and the 13-block stack MEMEM*EMEMEM*. Returns the blocks
    by name, their parameters and rms()."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dev, bf = "cuda", torch.bfloat16
    C = 2688
    H, P, G, N, K, chunk = 64, 64, 8, 128, 4, 128
    DI = H * P
    QH, KVH, D = 32, 2, 128
    E, TOPK, FF, SFF, SCALE = 128, 6, 1856, 3712, 2.5
    ssd = load_mamba_triton(path) if path else None

    def W(o, i):
        return (torch.randn(o, i, device=dev, dtype=bf) / i ** 0.5).requires_grad_()

    def rms(x, w, eps=1e-5):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    norm_w = torch.ones(C, device=dev, dtype=bf, requires_grad=True)
    mp = dict(in_proj=W(2 * DI + 2 * G * N + H, C), conv_w=(torch.randn(DI + 2 * G * N, 1, K, device=dev, dtype=bf) * 0.3).requires_grad_(),
              conv_b=torch.zeros(DI + 2 * G * N, device=dev, dtype=bf, requires_grad=True),
              A_log=torch.log(torch.rand(H, device=dev) * 15 + 1).requires_grad_(), D=torch.ones(H, device=dev, requires_grad=True),
              dt_bias=(torch.rand(H, device=dev) - 0.5).requires_grad_(), gn_w=torch.ones(DI, device=dev, dtype=bf, requires_grad=True),
              out_proj=W(C, DI))

    def mamba_mixer(h):
        zxbcdt = F.linear(h, mp["in_proj"])
        z, xBC, dt = torch.split(zxbcdt, [DI, DI + 2 * G * N, H], dim=-1)
        xBC = F.silu(F.conv1d(xBC.transpose(1, 2), mp["conv_w"], mp["conv_b"], padding=K - 1, groups=DI + 2 * G * N)[..., :L]).transpose(1, 2)
        x, Bm, Cm = torch.split(xBC, [DI, G * N, G * N], dim=-1)
        y = ssd(x.reshape(1, L, H, P), dt, -torch.exp(mp["A_log"]), Bm.reshape(1, L, G, N), Cm.reshape(1, L, G, N),
                chunk_size=chunk, D=mp["D"], dt_bias=mp["dt_bias"], dt_softplus=True).reshape(1, L, DI)
        g = (y * F.silu(z)).reshape(1, L, G, DI // G)
        g = rms(g, 1.0).reshape(1, L, DI) * mp["gn_w"]
        return F.linear(g, mp["out_proj"])

    ap_ = dict(Wq=W(QH * D, C), Wk=W(KVH * D, C), Wv=W(KVH * D, C), Wo=W(C, QH * D))

    def attn_mixer(h, backend):
        q = F.linear(h, ap_["Wq"]).view(1, L, QH, D).transpose(1, 2)
        k = F.linear(h, ap_["Wk"]).view(1, L, KVH, D).transpose(1, 2)
        v = F.linear(h, ap_["Wv"]).view(1, L, KVH, D).transpose(1, 2)
        with sdpa_kernel(backend):
            if backend == SDPBackend.FLASH_ATTENTION:  # flash has no GQA: repeat K/V heads
                k, v = k.repeat_interleave(QH // KVH, 1), v.repeat_interleave(QH // KVH, 1)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.linear(o.transpose(1, 2).reshape(1, L, QH * D), ap_["Wo"])

    ep = dict(router=(torch.randn(E, C, device=dev) / C ** 0.5).requires_grad_(), e_bias=torch.zeros(E, device=dev),
              W1=(torch.randn(E, FF, C, device=dev, dtype=bf) / C ** 0.5).requires_grad_(),
              W2=(torch.randn(E, C, FF, device=dev, dtype=bf) / FF ** 0.5).requires_grad_(), sW1=W(SFF, C), sW2=W(C, SFF))

    def moe_mixer(h):
        x = h.reshape(L, C)
        scores = torch.sigmoid(F.linear(x.float(), ep["router"]))
        _, idx = torch.topk(scores + ep["e_bias"], TOPK, dim=-1)
        w = scores.gather(1, idx)
        w = (w / w.sum(-1, keepdim=True) * SCALE).to(bf)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xs = x[order // TOPK]
        h1 = torch._grouped_mm(xs, ep["W1"].transpose(1, 2), offs=offs)
        h1 = torch.relu(h1).square()
        y = torch._grouped_mm(h1, ep["W2"].transpose(1, 2), offs=offs)
        out = torch.zeros(L * TOPK, C, device=dev, dtype=bf).index_copy(0, order, y)
        out = (out.view(L, TOPK, C) * w.unsqueeze(-1)).sum(1)
        out = out + F.linear(torch.relu(F.linear(x, ep["sW1"])).square(), ep["sW2"])
        return out.view(1, L, C)

    def block(mixer):
        return lambda x: x + mixer(rms(x, norm_w))

    kinds = {"moe": block(moe_mixer), "attention_cudnn": block(lambda h: attn_mixer(h, SDPBackend.CUDNN_ATTENTION)),
             "attention_flash": block(lambda h: attn_mixer(h, SDPBackend.FLASH_ATTENTION))}
    if ssd is not None:
        kinds["mamba"] = block(mamba_mixer)
        kinds["stack_M*E"] = lambda x: kinds["moe"](kinds["attention_cudnn"](kinds["mamba"](x)))
        by_char = {"M": "mamba", "E": "moe", "*": "attention_cudnn"}

        def nano13(x):  # the first 13 blocks of Nemotron-3-Nano's pattern (weights shared between blocks)
            for ch in "MEMEM*EMEMEM*":
                x = kinds[by_char[ch]](x)
            return x
        kinds["stack_MEMEM*EMEMEM*"] = nano13
    params = [norm_w, *mp.values(), *ap_.values(), *(v for k, v in ep.items() if k != "e_bias")]
    return kinds, params, rms


def blocks(res, path, L, warmup, repeats):
    """Forward and forward+backward of each block of nano_blocks() and of the stacks; peak memory of
    the forward+backward (torch.cuda.max_memory_allocated above what was allocated before) and what
    one forward leaves allocated for its backward (saved_mib). Every forward+backward starts with the
    gradients set to None, as an optimizer step's zero_grad leaves them: the peak counts the
    gradients the step makes, as cp_hybrid's step memory does, whichever block ran before."""
    import torch
    kinds, params, _ = nano_blocks(path, L)
    x0 = torch.randn(1, L, 2688, device="cuda", dtype=torch.bfloat16)

    def drop_grads(*ts):
        for t in (*params, *ts):
            t.grad = None

    for name, f in kinds.items():
        tag = f"block_{name}_l{L}"
        try:
            with torch.no_grad():
                res[f"{tag}/fwd"] = timed(lambda: f(x0), warmup, repeats)
            xg = x0.clone().requires_grad_()
            dy = torch.randn_like(x0)

            def step():
                drop_grads(xg)
                f(xg).backward(dy)

            drop_grads(xg)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            res[f"{tag}/fwdbwd"] = timed(step, warmup, repeats)
            res[f"{tag}/fwdbwd"]["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
            # What the forward leaves for the backward (saved tensors and the output).
            drop_grads(xg)
            torch.cuda.synchronize()
            m0 = torch.cuda.memory_allocated()
            out = f(xg)
            torch.cuda.synchronize()
            res[f"{tag}/fwdbwd"]["saved_mib"] = (torch.cuda.memory_allocated() - m0) / 2 ** 20
            out.backward(dy)
            del out
        except Exception as e:
            res[f"{tag}/fwd"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        torch.cuda.empty_cache()


def longest(res, path, lens):
    """The longest sequence whose M*E step (forward + backward, gradients set to None first, as
    blocks() times it) runs in this GPU's memory: one step at each length of `lens` in ascending
    order, stopping at the first that runs out of memory. Records each length's peak memory above
    what was allocated before the step, or its error, and the longest that ran."""
    import torch
    ran = 0
    for L in sorted(lens):
        tag = f"longest_M*E_l{L}"
        try:
            kinds, params, _ = nano_blocks(path, L)
            if "stack_M*E" not in kinds:
                res[tag] = {"error": "needs --mamba-path"}
                return
            f = kinds["stack_M*E"]
            x = torch.randn(1, L, 2688, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn_like(x)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            r = timed(lambda: f(x).backward(dy), 0, 1)
            r["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
            res[tag] = r
            ran = L
        except torch.cuda.OutOfMemoryError as e:
            res[tag] = {"error": f"OutOfMemoryError: {str(e)[:200]}"}
            break
        finally:
            kinds = params = f = x = dy = None
            torch.cuda.empty_cache()
    res["longest_M*E"] = {"longest_tokens": ran, "gpu_total_mib": torch.cuda.get_device_properties(0).total_memory / 2 ** 20}


def train(res, path, L, warmup, repeats):
    """A training loop of the stack M*E as train_hybrid runs it (inputs/train_nano_width.toml):
    embedding (vocab 1024), the blocks, final RMSNorm, LM head, cross-entropy of the next token;
    bf16 parameters cast from fp32 master weights every step, fp32 gradients, global-norm clipping
    at 1.0, fused AdamW (betas 0.9 / 0.95, eps 1e-8, weight decay 0.01). Step time (CUDA events
    around the whole step), tokens/s, peak memory and the loss of each step."""
    import torch
    import torch.nn.functional as F
    kinds, params, rms = nano_blocks(path, L)
    if "stack_M*E" not in kinds:
        res[f"train_M*E_l{L}"] = {"error": "needs --mamba-path"}
        return
    V, C, dev = 1024, 2688, "cuda"
    emb = (torch.randn(V, C, device=dev) * 0.02).to(torch.bfloat16).requires_grad_()
    fnorm = torch.ones(C, device=dev, dtype=torch.bfloat16, requires_grad=True)
    head = (torch.randn(V, C, device=dev) / C ** 0.5).to(torch.bfloat16).requires_grad_()
    params = params + [emb, fnorm, head]
    master = [p.detach().float().clone() for p in params]
    opt = torch.optim.AdamW(master, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, fused=True)
    tokens = torch.randint(0, V, (1, L), device=dev)
    losses = []

    def step():
        with torch.no_grad():
            torch._foreach_copy_(params, master)
        for p in params:
            p.grad = None
        h = kinds["stack_M*E"](F.embedding(tokens, emb))
        logits = F.linear(rms(h, fnorm), head)
        loss = F.cross_entropy(logits[0, :-1].float(), tokens[0, 1:])
        loss.backward()
        for m, p in zip(master, params):
            m.grad = p.grad.float()
        torch.nn.utils.clip_grad_norm_(master, 1.0, foreach=True)
        opt.step()
        losses.append(loss.detach())

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    r = timed(step, warmup, repeats)
    r["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    r["tokens_per_s"] = L / (r["median_ms"] / 1e3)
    r["loss"] = [float(x) for x in losses]
    res[f"train_M*E_l{L}"] = r

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mamba-path", default="")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--only", default="attention,dense,ssd",
                    help="comma-separated anchor families to time: attention, dense (GEMM and copy), ssd, blocks, "
                         "train (a training loop of the M*E stack at the first block length), longest (the "
                         "longest M*E step that fits, over --longest-lens)")
    ap.add_argument("--block-lens", default="8192", help="sequence lengths of the blocks family, comma-separated")
    ap.add_argument("--longest-lens", default="131072,163840,196608,229376,262144",
                    help="sequence lengths the longest family tries in ascending order, comma-separated")
    a = ap.parse_args()
    only = {f.strip() for f in a.only.split(",") if f.strip()}
    unknown = only - {"attention", "dense", "ssd", "blocks", "train", "longest"}
    if unknown:
        print(f"anchors.py: --only: unknown family {sorted(unknown)} "
              "(allowed: attention, dense, ssd, blocks, train, longest)",
              file=sys.stderr)
        return 2
    import torch
    if not torch.cuda.is_available():
        print("anchors.py: no CUDA device", file=sys.stderr)
        return 2
    res = {"_device": torch.cuda.get_device_name(), "_torch": torch.__version__}
    if "attention" in only:
        attention(res, a.warmup, a.repeats)
    if "dense" in only:
        dense_and_copy(res, a.warmup, a.repeats)
    if "ssd" in only and a.mamba_path:
        try:
            mamba(res, a.mamba_path, a.warmup, a.repeats)
        except Exception as e:
            res["ssd_fwd/mamba_ssm_triton"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    if "blocks" in only:
        for L in (int(x) for x in a.block_lens.split(",")):
            blocks(res, a.mamba_path, L, a.warmup, a.repeats)
    if "train" in only:
        train(res, a.mamba_path, int(a.block_lens.split(",")[0]), a.warmup, a.repeats)
    if "longest" in only:
        longest(res, a.mamba_path, [int(x) for x in a.longest_lens.split(",")])
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    for k, v in res.items():
        if not k.startswith("_"):
            print(f"{k:55s} " + (f"{v['median_ms']:10.3f} ms" if "median_ms" in v else v.get("error", ""))
                  + (f"  peak {v['peak_mib']:.0f} MiB" if "peak_mib" in v else "")
                  + (f"  {v['tokens_per_s']:.0f} tokens/s" if "tokens_per_s" in v else "")
                  + (f"  longest {v['longest_tokens']} tokens" if "longest_tokens" in v else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
