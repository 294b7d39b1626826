"""Closed forms from the theory of equilibrium models.

Closed-form predictions (fixed-point moments of linear DEQs, free-probability spectral densities,
stability boundaries of nonlinear DEQs, kGLM-derived DEQ parameters) are filled in by later
chapters of the book, each checked against measurements made with the rest of :mod:`deqlab`.
"""

# The theory's modules, as attributes of the package loaded on first access (PEP 562), so that
# ``deqlab.theory.linear`` works after ``import deqlab`` alone, as ``deqlab.theory`` itself does.
_SUBMODULES = ("freeprob", "kglm", "linear", "meanfield")


def __getattr__(name):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"deqlab.theory.{name}")
    raise AttributeError(f"module 'deqlab.theory' has no attribute {name!r}")
