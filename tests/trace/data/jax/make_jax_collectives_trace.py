"""How jax_collectives.* were made: one jitted step of each XLA collective over 4 JAX CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=4), 2 steps profiled.

Run in a scratch venv (pip install 'jax[cpu]'; jax/jaxlib 0.10.2 made these files), never in trainperf's:
    python make_jax_collectives_trace.py OUT_DIR
Writes OUT_DIR/plugins/profile/<time>/<host>.xplane.pb (renamed jax_collectives.xplane.pb) and
OUT_DIR/step.hlo.txt, the compiled module's HLO text (the hand counts in tests/trace/test_hlo.py).
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

mesh = Mesh(jax.devices()[:4], ("x",))


def body(a, b):
    s = jax.lax.psum(a, "x")                                   # all-reduce f32[256,64] per device
    g = jax.lax.all_gather(b, "x", tiled=True)                 # all-gather bf16[32,64] -> bf16[128,64]
    r = jax.lax.psum_scatter(a, "x", tiled=True)               # reduce-scatter f32[256,64] -> f32[64,64]
    t = jax.lax.all_to_all(a, "x", 0, 0, tiled=True)           # all-to-all f32[256,64]
    p = jax.lax.ppermute(b, "x", [(i, (i + 1) % 4) for i in range(4)])  # collective-permute bf16[32,64]
    return s + t, g, r, p


step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=(P("x"), P("x"), P("x"),
                                                                                     P("x"))))
a = jnp.ones((1024, 64), jnp.float32)
b = jnp.ones((128, 64), jnp.bfloat16)
out = step(a, b)
jax.block_until_ready(out)
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], "step.hlo.txt"), "w") as f:
    f.write(step.lower(a, b).compile().as_text())
with jax.profiler.trace(sys.argv[1]):
    for i in range(2):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            jax.block_until_ready(step(a, b))
