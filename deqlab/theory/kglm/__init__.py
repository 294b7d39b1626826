"""Kernelised GLMs as deep equilibrium models (004: "Declarative nets that are equilibrium models").

- :mod:`~deqlab.theory.kglm.kernels`: the kernels ``k(A, B) -> Gram matrix`` (squared exponential,
  004's ``k_true``, the image kernel of App. E as a convolution, the conv spectral norm).
- :mod:`~deqlab.theory.kglm.families`: exponential families in canonical form (004 Eq. 10) with
  the mean map ``A'`` (the DEQ activation) and an optional log-concave prior ``q`` (004 Eq. 4).
- :mod:`~deqlab.theory.kglm.models`: the kGLM MAP solved directly (004 Eq. 5), the DEQ of
  004 Thm. 3 (Eq. 7-8) that computes it, Assumption 2 / Prop. 4, and kGLM initialisers (004 §4).
"""

from deqlab.theory.kglm import kernels
from deqlab.theory.kglm.families import (
    FAMILIES,
    Family,
    bernoulli,
    binomial,
    gaussian,
    get_family,
    poisson,
    spin,
)
from deqlab.theory.kglm.kernels import (
    K_TRUE,
    PADDINGS,
    ImageKernel,
    Kernel,
    conv2d,
    conv_matrix,
    conv_spectral_norm,
    image_coordinates,
    image_kernel,
    k_true,
    periodic,
    squared_exponential,
    white_noise,
    zero_padded_conv_norm_bound,
)
from deqlab.theory.kglm.models import (
    NAIVE_INTERVAL,
    SCHEMES,
    Assumption2,
    DEQFit,
    DEQParameters,
    KGLMFit,
    as_linear_kernel,
    assumption2,
    deq_map,
    deq_parameters,
    deq_predict,
    initializer,
    kglm_objective,
    kglm_predict,
    lam_for_spectral_norm,
    naive_coordinates,
)

__all__ = [
    "kernels",
    "K_TRUE",
    "PADDINGS",
    "ImageKernel",
    "Kernel",
    "conv2d",
    "conv_matrix",
    "conv_spectral_norm",
    "image_coordinates",
    "image_kernel",
    "k_true",
    "periodic",
    "squared_exponential",
    "white_noise",
    "zero_padded_conv_norm_bound",
    "FAMILIES",
    "Family",
    "bernoulli",
    "binomial",
    "gaussian",
    "get_family",
    "poisson",
    "spin",
    "NAIVE_INTERVAL",
    "SCHEMES",
    "Assumption2",
    "DEQFit",
    "DEQParameters",
    "KGLMFit",
    "as_linear_kernel",
    "assumption2",
    "deq_map",
    "deq_parameters",
    "deq_predict",
    "initializer",
    "kglm_objective",
    "kglm_predict",
    "lam_for_spectral_norm",
    "naive_coordinates",
]
