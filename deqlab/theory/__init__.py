"""Closed forms from the theory of equilibrium models.

Closed-form predictions (fixed-point moments of linear DEQs, free-probability spectral densities,
stability boundaries of nonlinear DEQs, kGLM-derived DEQ parameters) are filled in by later
chapters of the book, each checked against measurements made with the rest of :mod:`deqlab`.
"""
