"""How jax_cpu.* were made: a tiny jitted SGD step on JAX's CPU device, 4 steps profiled.

Run in a scratch venv (pip install 'jax[cpu]'; jax/jaxlib 0.10.2 made these files), never in trainperf's:
    python make_jax_cpu_trace.py OUT_DIR
jax.profiler writes OUT_DIR/plugins/profile/<time>/<host>.xplane.pb, <host>.trace.json.gz and
perfetto_trace.json.gz (create_perfetto_trace=True); the host name was renamed to jax_cpu.
"""

import sys

import jax
import jax.numpy as jnp


@jax.jit
def loss(w, x):
    h = jnp.tanh(x @ w)
    return (h * h).sum()


@jax.jit
def update(w, x):
    return w - 0.1 * jax.grad(loss)(w, x)


w = jnp.ones((64, 64)) * 0.01
x = jnp.ones((32, 64))
w = update(w, x).block_until_ready()  # compile before profiling
with jax.profiler.trace(sys.argv[1], create_perfetto_trace=True):
    for i in range(4):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            w = update(w, x)
            w.block_until_ready()
