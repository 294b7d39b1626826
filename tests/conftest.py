"""Shared pytest set-up for the unit tests.

* float64 is enabled for the whole test process (numerical checks of solvers, implicit gradients
  and closed forms need it). Notebooks run by nbmake execute in their own kernels and keep JAX's
  float32 default.
* Matplotlib uses the non-interactive Agg backend in this process only: the variable
  MPLBACKEND is deliberately not set, because the notebook kernels that nbmake starts inherit the
  environment, and under Agg their figures would silently not be rendered.
* Hypothesis: no per-example deadline (the first example of a jitted function pays the
  compilation); on CI (``CI`` set) examples are derandomised so runs are reproducible.
"""

import os

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

try:
    from hypothesis import settings
except ImportError:  # hypothesis is in the `test` extra; keep plain pytest usable without it
    pass
else:
    settings.register_profile("deqlab", deadline=None, print_blob=True)
    settings.register_profile("deqlab-ci", deadline=None, print_blob=True, derandomize=True)
    settings.load_profile("deqlab-ci" if os.environ.get("CI") else "deqlab")
