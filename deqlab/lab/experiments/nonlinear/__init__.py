"""Experiments of chapter 3, "Nonlinear DEQs: statistics, stability and training" (001 §3, §4.1).

- :mod:`~deqlab.lab.experiments.nonlinear.statistics`: the equilibrium's hidden variance and the
  Jacobian's spectral radius, simulated (001 Fig. 2-4);
- :mod:`~deqlab.lab.experiments.nonlinear.dynamics`: solver rates and NFE near the threshold, and the
  NTK of the nonlinear DEQ (001 §5.3, App. B.1);
- :mod:`~deqlab.lab.experiments.nonlinear.training`: the ensemble-initialised DEQ classifier
  (001 §4.1, Fig. 5).

The theory they are compared with is :mod:`deqlab.theory.meanfield`.
"""
