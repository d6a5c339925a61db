#!/usr/bin/env python3
"""Time the performance anchors (benchmarks/PERFORMANCE.md) on the GPU, on the shapes that
`bench_kernels --set bench.device=cuda --set bench.suite=anchors` uses, and write them as JSON.

  python3 jobs/bench/anchors.py --out anchors.json [--mamba-path DIR] [--repeats 20] [--warmup 5]

Anchors: PyTorch scaled_dot_product_attention with the flash (FlashAttention-2) and cuDNN backends
(forward, and forward+backward), torch.matmul (cuBLAS) for the dense GEMM, a device-to-device copy,
and, when --mamba-path names a directory holding the public mamba_ssm package sources (fetched by
the user, never part of this repository), its Triton SSD kernels (mamba_chunk_scan_combined).
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
    for (B, H, L, D, bwd) in [(2, 16, 8192, 128, True), (4, 32, 4096, 64, True), (1, 16, 32768, 128, False)]:
        tag = f"_b{B}h{H}l{L}d{D}"
        q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)
        for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    res[f"attention_fwd{tag}/{name}"] = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                                             warmup, repeats)
                    if bwd:
                        def fb():
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                            o.backward(do)
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
    # Load only the Triton SSD modules: a bare package object keeps the package __init__ (which needs
    # the compiled selective-scan extension) from running.
    sys.path.insert(0, path)
    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.utils"):
        m = types.ModuleType(name)
        m.__path__ = [path + "/" + name.replace(".", "/")]
        sys.modules[name] = m
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mamba-path", default="")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--only", default="attention,dense,ssd",
                    help="comma-separated anchor families to time: attention, dense (GEMM and copy), ssd")
    a = ap.parse_args()
    only = {f.strip() for f in a.only.split(",") if f.strip()}
    unknown = only - {"attention", "dense", "ssd"}
    if unknown:
        print(f"anchors.py: --only: unknown family {sorted(unknown)} (allowed: attention, dense, ssd)", file=sys.stderr)
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
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    for k, v in res.items():
        if not k.startswith("_"):
            print(f"{k:55s} " + (f"{v['median_ms']:10.3f} ms" if "median_ms" in v else v.get("error", "")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
