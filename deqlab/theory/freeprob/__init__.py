"""Free probability for deep and equilibrium networks (chapter 2 of the book).

Sources: 002 (Pennington, Schoenholz & Ganguli 2018, "The emergence of spectral universality in
deep networks") and Appendix C of 001 (Agarwala & Schoenholz 2022).

One module per idea; every public name is re-exported here, so
``from deqlab.theory import freeprob as fp; fp.Semicircle(0.5)`` works:

- :mod:`~deqlab.theory.freeprob.transforms`: the sign convention,
  :class:`~deqlab.theory.freeprob.transforms.Spectrum` and its transforms (Stieltjes, moment
  generating function, S-transform; 002 Eq. 7-11), root following (002 Algorithm 1),
  :class:`~deqlab.theory.freeprob.transforms.ConvergenceError`;
- :mod:`~deqlab.theory.freeprob.spectra`: elementary spectra with closed forms (``Semicircle``,
  ``MarchenkoPastur``, ``Bernoulli``, ``ScaledIdentity``, ``PointMasses``);
- :mod:`~deqlab.theory.freeprob.products`: free multiplicative convolutions
  (``FreeProduct``, 002 Eq. 12; ``DWSpectrum``, 001 App. C.1);
- :mod:`~deqlab.theory.freeprob.jacobians`: Jacobian spectra of deep networks at criticality
  (slope spectra, critical point, moments, atoms, density; 002 §2-4);
- :mod:`~deqlab.theory.freeprob.double_scaling`: the double-scaling limits and their
  universality classes (002 §5);
- :mod:`~deqlab.theory.freeprob.pencils`: linear pencils and the length spectrum of equilibrium
  networks (001 App. C.2).

Statistics of spectra on grids (Kolmogorov and Wasserstein distances, edges, atoms, mass and
moments) are in :mod:`deqlab.lab.stats`; the nonlinearities in :mod:`deqlab.nonlinearities`.

Sign convention (002 Eq. 7-8, 001 Eq. 96-97): ``G(z) = int rho(t) / (z - t) dt``, so
``G(z) ~ 1/z`` and ``Im G < 0`` for ``Im z > 0``; ``rho(x) = -lim Im G(x + i eps) / pi``;
``M(z) = z G(z) - 1``; ``S(w) = (1 + w) / (w M^{-1}(w))``.

Variances and scales (papers against :mod:`deqlab.ensembles`, ``W = scale * W0``,
``scale = sqrt(V)``):

- 002 weights: ``"gaussian"`` entries ``N(0, sigma_w2 / N)``; ``"orthogonal"``
  ``W^T W = sigma_w2 I``; ``sample("gaussian" | "orthogonal", key, n, sqrt(sigma_w2))``:
  002's ``sigma_w2`` is the variance ``V``, kept under 002's name in the functions of 002.
- 001 App. C: a GOE ``W`` with off-diagonal variance ``V / N`` (semicircle of radius
  ``2 sqrt(V)``, ``V_c = 1/4``) is ``sample("goe", key, n, sqrt(V))``; a random (Ginibre)
  ``W`` with entries of variance ``V / N`` (``V_c = 1``) is ``sample("gaussian", key, n,
  sqrt(V))``; an antisymmetric one is ``sample("antisymmetric", key, n, sqrt(V))``.

Numerics are NumPy float64 / complex128 (root following is a host-side loop over small
vectorised arrays; compiling it would not pay). Every density can be validated by its mass
(atoms included), its first moments and a histogram of sampled eigenvalues (see the tests).
Arguments outside their domain (a spectral variable that is NaN or on the cut, ``lam <= 0``,
``V >= V_c``, ``kmax < 1``, ``n_nodes < 1``, ...) raise ``ValueError`` naming the argument and
its valid range.
"""

from deqlab.theory.freeprob.double_scaling import BernoulliLimit, SmoothLimit, double_scaling_q_star
from deqlab.theory.freeprob.jacobians import (
    NONLINEARITIES,
    WEIGHTS,
    JacobianDensity,
    activation,
    bernoulli_p,
    critical_point,
    gaussian_expectation,
    jacobian_atoms,
    jacobian_density,
    jacobian_moments,
    slope_moments,
    slope_spectrum,
    squared_slope_spectrum,
    weight_spectrum,
)
from deqlab.theory.freeprob.pencils import (
    Pencil,
    PencilResult,
    ginibre_length_cubic,
    ginibre_length_m2,
    goe_length_m2,
    goe_resolvent_mgf,
    goe_resolvent_pencil,
    length_pencil,
    length_spectrum_edges,
    pencil_cauchy,
    pencil_moments,
)
from deqlab.theory.freeprob.products import DWSpectrum, FreeProduct
from deqlab.theory.freeprob.spectra import (
    Bernoulli,
    MarchenkoPastur,
    PointMasses,
    ScaledIdentity,
    Semicircle,
    samples,
)
from deqlab.theory.freeprob.transforms import ConvergenceError, Spectrum, follow_roots

__all__ = [
    "NONLINEARITIES",
    "WEIGHTS",
    "ConvergenceError",
    "Spectrum",
    "PointMasses",
    "Bernoulli",
    "Semicircle",
    "MarchenkoPastur",
    "ScaledIdentity",
    "FreeProduct",
    "DWSpectrum",
    "samples",
    "follow_roots",
    "activation",
    "gaussian_expectation",
    "weight_spectrum",
    "squared_slope_spectrum",
    "slope_spectrum",
    "slope_moments",
    "bernoulli_p",
    "critical_point",
    "jacobian_moments",
    "jacobian_atoms",
    "JacobianDensity",
    "jacobian_density",
    "double_scaling_q_star",
    "BernoulliLimit",
    "SmoothLimit",
    "Pencil",
    "PencilResult",
    "pencil_cauchy",
    "pencil_moments",
    "length_pencil",
    "goe_resolvent_pencil",
    "goe_resolvent_mgf",
    "ginibre_length_cubic",
    "goe_length_m2",
    "ginibre_length_m2",
    "length_spectrum_edges",
]
