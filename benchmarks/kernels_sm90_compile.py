"""Compile every Triton kernel for an H100/H200 (sm_90) on a machine without a GPU; report registers and spills.

    TRITON_INTERPRET=0 python benchmarks/kernels_sm90_compile.py

Triton can compile ahead of time for a target it cannot run; ptxas (shipped with Triton) then
reports per-kernel register use and stack (spill) bytes. The script drives the real launch code
(tile choices for a GPU) at the GPU benchmark shapes with the launches captured instead of run,
compiles each distinct configuration for sm_90 and prints `OK name constexprs warps: REG:n STACK:n`,
or FAIL with the compiler error. STACK > 0 means register spills. Exit code 1 on any failure or spill.
"""
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import trainperf.kernels as K
from trainperf.kernels import _runtime
CUOBJ = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
mods = {n: importlib.import_module("trainperf.kernels." + n) for n in ["rms_norm","layer_norm","glu","rope","softmax","cross_entropy"]}
for m in mods.values():
    if hasattr(m, "INTERPRETED"): m.INTERPRETED = False
_runtime.INTERPRETED = False
captured = []
class Cap:
    def __init__(self, name, fn): self.name, self.fn = name, fn
    def __getitem__(self, grid):
        def call(*args, **kw): captured.append((self.name, self.fn, args, kw, grid))
        return call
for mname, m in mods.items():
    for a in dir(m):
        if a.endswith("_kernel"):
            setattr(m, a, Cap(f"{mname}.{a}", getattr(m, a)))
TY = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.int64: "i64", torch.float16: "fp16"}
def sig(fn, args, kw):
    names = fn.arg_names
    s, consts = {}, {}
    for n, v in zip(names, list(args) + [None]*(len(names)-len(args))):
        if n in kw and n != "num_warps": s[n] = "constexpr"; consts[n] = kw[n]; continue
        if isinstance(v, torch.Tensor): s[n] = "*" + TY[v.dtype]
        elif isinstance(v, bool): s[n] = "i1"
        elif isinstance(v, int): s[n] = "i32" if abs(v) < 2**31 else "i64"
        elif isinstance(v, float): s[n] = "fp32"
    return s, consts
def run_calls():
    bf = torch.bfloat16
    for (M, N) in [(8192, 4096), (4096, 8192), (2048, 16384), (1024, 65536)]:
        x = torch.randn(M, N, dtype=bf); w = torch.randn(N, dtype=bf)
        y, r = torch.ops.trainperf.rms_norm_fwd(x, w, 1e-6); torch.ops.trainperf.rms_norm_bwd(x, x, w, r)
        y, mu, r = torch.ops.trainperf.layer_norm_fwd(x, w, w, 1e-5); torch.ops.trainperf.layer_norm_bwd(x, x, w, mu, r)
        torch.ops.trainperf.softmax_fwd(x); torch.ops.trainperf.softmax_bwd(x, x)
    g = torch.randn(64, 14336, dtype=bf)
    for act in (0, 1): torch.ops.trainperf.glu_fwd(g, g, act); torch.ops.trainperf.glu_bwd(g, g, g, act)
    q = torch.randn(1, 16, 32, 128, dtype=bf); k = torch.randn(1, 16, 8, 128, dtype=bf); c = torch.randn(16, 128)
    torch.ops.trainperf.rope_fwd(q, k, c, c); torch.ops.trainperf.rope_bwd(q, k, c, c)
    for V in (32000, 128256):
        lg = torch.randn(64, V, dtype=bf); t = torch.randint(0, V, (64,))
        torch.ops.trainperf.cross_entropy_fwd(lg, t, -100, 0.1, 1e-4)
        K.cross_entropy.__globals__["ce_backward_into"](lg, lg, t, torch.zeros(64), torch.ones(64), -100, 0.1, 1e-4)
run_calls()
seen = set()
bad = 0
for name, fn, args, kw, grid in captured:
    s, consts = sig(fn, args, kw)
    key = (name, tuple(sorted(consts.items())), kw.get("num_warps"))
    if key in seen: continue
    seen.add(key)
    try:
        ck = triton.compile(ASTSource(fn=fn, signature=s, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": kw.get("num_warps", 4)})
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(ck.asm["cubin"]); f.flush()
            out = subprocess.run([CUOBJ, "-res-usage", f.name], capture_output=True, text=True).stdout
        res = [l.strip() for l in out.splitlines() if "REG" in l]
        line = res[0] if res else out[-200:]
        spill = "STACK:0 " not in line
        bad += spill
        print(f"{'SPILL' if spill else 'OK  '} {name} {consts} warps={kw.get('num_warps')}: {line[:40]}")
    except Exception as e:
        bad += 1
        print(f"FAIL {name} {consts}: {type(e).__name__}: {str(e)[:300]}")
print(f"{len(seen)} kernel configurations, {bad} failed or spilled")
sys.exit(1 if bad else 0)
