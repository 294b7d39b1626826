"""The instructor's key: a model answer for each grader of :mod:`deqlab.lab.exercises`.

Not part of the documented API (the API page documents the graders only, whose docstrings show how
to call them, never an answer), and meant to stay out of the wheel that students install: the
graders' own tests (``tests/lab/test_exercises.py``, ``tests/lab/test_grade*.py``) import it from
the repository. :data:`ANSWERS` maps a grader's name to its model answer; ``python -m
deqlab.lab.exercises._key`` prints the answers' source, the instructor's key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ANSWERS"]


# chapter 0, page 1
def my_layer(z, W, U, b, x):
    return jnp.tanh(z @ W.T + x @ U.T + b)


def my_weight_tied(f, z0, args, depth):
    states = [z0]
    for _ in range(depth):
        states.append(f(states[-1], *args))
    return jnp.stack(states)


def my_residual(fz, z):
    eps = jnp.finfo(z.dtype).eps
    return jnp.linalg.norm(fz - z, axis=-1) / (jnp.linalg.norm(fz, axis=-1) + eps * np.sqrt(z.shape[-1]))


def my_picard(f, z0, args, tol=1e-5, max_steps=500):
    z = z0
    for step in range(max_steps):
        fz = f(z, *args)
        if bool(jnp.all(my_residual(fz, z) <= tol)):
            return fz, step
        z = fz
    raise RuntimeError("no convergence")


# chapter 1, page 3
def my_length_trace(w0, V):
    sigma = np.linalg.svd(np.eye(len(w0)) - np.sqrt(V) * w0, compute_uv=False)
    return np.mean(sigma**-4.0)


# chapter 2, page 1
def my_stieltjes(eigenvalues, z):
    return np.mean(1 / (np.asarray(z)[..., None] - eigenvalues), axis=-1)


# chapter 3, page 5
def my_mean_difference(a, b):
    return a.mean() - b.mean(), np.hypot(a.std(ddof=1) / np.sqrt(a.size), b.std(ddof=1) / np.sqrt(b.size))


# chapter 3, page 6
def my_jacobian_penalty(f, z, key, n_probes):
    eps = jax.random.rademacher(key, (n_probes,) + z.shape, dtype=z.dtype)
    products = jax.vmap(lambda e: jax.jvp(f, (z,), (e,))[1])(eps)
    return jnp.mean(jnp.sum(products**2, axis=-1))


# chapter 4, page 2
def my_linear_deq(K, Y, lam, depth):
    path = [np.zeros_like(Y)]
    for _ in range(depth):
        path.append(K @ (Y - path[-1]) / lam)
    return np.stack(path)


# chapter 5, page 2
def my_copy_memory(key, batch_size, delay, memory=10, symbols=8):
    seq = jax.random.randint(key, (batch_size, memory), 1, symbols + 1)
    x = jnp.concatenate([seq, jnp.zeros((batch_size, delay - 1), seq.dtype),
                         jnp.full((batch_size, memory + 1), 9, seq.dtype)], axis=1)
    y = jnp.concatenate([jnp.zeros((batch_size, delay + memory), seq.dtype), seq], axis=1)
    return x, y


# chapter 5, page 5
def my_semi_orthogonal(key, rows, cols, scale):
    big, small = max(rows, cols), min(rows, cols)
    q, r = jnp.linalg.qr(jax.random.normal(key, (big, small)))
    q = q * jnp.where(jnp.diagonal(r) < 0, -1.0, 1.0)[None, :]
    return scale * (q if rows >= cols else q.T)


# chapter 5, page 6
def my_table1(rows):
    table = {}
    for r in rows:
        if np.isfinite(r["test_perplexity"]):
            table.setdefault((r["ensemble"], r["sqrt_v"]), []).append(r["test_perplexity"])
    return {k: (min(v), sum(v) / len(v)) for k, v in table.items()}


ANSWERS = {
    "check_layer": my_layer,
    "check_weight_tied": my_weight_tied,
    "check_residual": my_residual,
    "check_solver": my_picard,  # reference="picard"
    "check_length_trace": my_length_trace,
    "check_stieltjes": my_stieltjes,
    "check_mean_difference": my_mean_difference,
    "check_jacobian_penalty": my_jacobian_penalty,
    "check_linear_deq": my_linear_deq,
    "check_copy_memory": my_copy_memory,
    "check_semi_orthogonal": my_semi_orthogonal,
    "check_table1": my_table1,
}
"""Grader name -> model answer (chapter 0's implicit gradient, classifier and training step, and
the Anderson solver, are in ``tests/lab/test_exercises.py``)."""
