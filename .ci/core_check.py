"""The core install alone: `pip install deqlab` (no extras) solves and differentiates a DEQ.

Run by .ci/run in a fresh environment holding only deqlab's core dependencies. Fails if a package
of the `lab` or `book` extras was installed by the core (a dependency that leaked back into it) or
if the library needs one.
"""

import importlib.util
import sys

import jax
import jax.numpy as jnp
from flax import nnx

import deqlab
from deqlab.nn import DEQ
from deqlab.nn.cells import TanhCell

NOT_IN_CORE = ("matplotlib", "sklearn", "PIL", "sentencepiece", "tqdm", "jupyter_book", "myst_nb", "datasets")

present = [name for name in NOT_IN_CORE if importlib.util.find_spec(name) is not None]
if present:
    sys.exit(f"core_check: the core install brought packages of the extras: {present}")

key_w, key_x = jax.random.split(jax.random.key(0))
w = 0.5 * jax.random.normal(key_w, (8, 8)) / jnp.sqrt(8.0)
x = jax.random.normal(key_x, (4, 8))
f = lambda z, w, x: jnp.tanh(z @ w.T + x)
sol = deqlab.fixed_point(f, jnp.zeros((4, 8)), w, x, batch_axis=0)
assert bool(jnp.all(sol.converged)), sol.result
grad = jax.grad(lambda w: jnp.sum(deqlab.fixed_point(f, jnp.zeros((4, 8)), w, x, batch_axis=0).value ** 2))(w)
assert bool(jnp.all(jnp.isfinite(grad)))
layer = DEQ(TanhCell(8, 8, rngs=nnx.Rngs(0)))
out = layer(x)
assert out.shape == (4, 8) and bool(jnp.all(jnp.isfinite(out)))
loaded = [name for name in NOT_IN_CORE if name in sys.modules]
assert not loaded, loaded
print(f"[core] deqlab {deqlab.__version__}: solve, implicit gradient and nn.DEQ with the core install only "
      f"(none of {', '.join(NOT_IN_CORE)} installed)")
