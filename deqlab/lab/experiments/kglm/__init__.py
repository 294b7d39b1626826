"""Chapter 4's experiments: kGLM initialisation of DEQs (004 §4).

- :mod:`deqlab.lab.experiments.kglm.seq2seq`: Experiment 1, smooth sequence-to-sequence regression on
  Gaussian-process data (004 §4, Fig. 5): random vs naive vs informed kGLM initialisation.
- :mod:`deqlab.lab.experiments.kglm.denoising`: Experiment 2, image denoising with a convolutional DEQ
  (004 §4, Fig. 6): random initialisation over a grid of variances vs kGLM initialisation over a
  grid of ``C = ||K|| / lam``.
"""
