"""The instructor's key: a model answer for each grader of :mod:`deqlab.lab.exercises`.

Not part of the documented API (the API page documents the graders only, whose docstrings show how
to call them, never an answer), and meant to stay out of the wheel that students install: the
graders' own tests (``tests/lab/test_exercises.py``, ``tests/lab/test_grade*.py``) import it from
the repository. :data:`ANSWERS` maps each graded exercise to its grader, its model answer and the
grader's other arguments; ``python -m deqlab.lab.exercises._key`` prints the answers' source with
the imports they need (:data:`IMPORTS`), the instructor's key, a file that runs on its own.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import deqlab

__all__ = ["ANSWERS", "IMPORTS", "Answer"]

IMPORTS = """import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import deqlab
"""
"""The imports the model answers use (printed at the top of the key)."""


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


# chapter 0, page 2
def my_anderson(f, z0, args, m=5, ridge=1e-4, tol=1e-5, max_steps=500):
    z, fs, gs = z0, [], []
    for step in range(max_steps):
        fz = f(z, *args)
        if bool(jnp.all(my_residual(fz, z) <= tol)):
            return z, step
        fs, gs = (fs + [np.asarray(fz, np.float64)])[-m:], (gs + [np.asarray(fz - z, np.float64)])[-m:]
        G = np.stack(gs, axis=1)  # (batch, history, D)
        H = G @ G.transpose(0, 2, 1)
        s = 1 / np.sqrt(np.einsum("bii->bi", H))  # Jacobi scaling, then the ridge
        y = s * np.linalg.solve(H * s[:, :, None] * s[:, None, :] + ridge * np.eye(len(gs)), s[..., None])[..., 0]
        z = jnp.asarray(np.einsum("bk,bkd->bd", y / y.sum(axis=1, keepdims=True), np.stack(fs, axis=1)), z0.dtype)
    raise RuntimeError("no convergence")


# chapter 0, page 3
def _iterate(step, x0, tol, max_steps):
    def cond(carry):
        x, fx, i = carry
        return (jnp.linalg.norm(fx - x) > tol * jnp.linalg.norm(fx)) & (i < max_steps)

    def body(carry):
        _, fx, i = carry
        return fx, step(fx), i + 1

    return jax.lax.while_loop(cond, body, (x0, step(x0), 0))[1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def my_fixed_point(f, params, x):
    return _iterate(lambda z: f(z, *params, x), jnp.zeros((x.shape[0], params[0].shape[0]), x.dtype), 1e-13, 3000)


def _my_fixed_point_fwd(f, params, x):
    z = my_fixed_point(f, params, x)
    return z, (z, params, x)


def _my_fixed_point_bwd(f, saved, g):
    z, params, x = saved
    _, vjp_z = jax.vjp(lambda z: f(z, *params, x), z)
    u = _iterate(lambda u: g + vjp_z(u)[0], g, 1e-13, 3000)  # the adjoint system u = g + J^T u
    return jax.vjp(lambda p, x: f(z, *p, x), params, x)[1](u)


my_fixed_point.defvjp(_my_fixed_point_fwd, _my_fixed_point_bwd)


# chapter 0, page 5
class MyCell(nnx.Module):
    def __init__(self, width, *, rngs):
        self.recurrent = nnx.Linear(width, width, use_bias=False, rngs=rngs,
                                    kernel_init=deqlab.ensembles.initializer("orthogonal", 0.5))
        self.inject = nnx.Linear(64, width, rngs=rngs)

    def __call__(self, z, x):
        return jnp.tanh(self.recurrent(z) + self.inject(x))


class MyClassifier(nnx.Module):
    def __init__(self, width, *, rngs):
        self.cell = MyCell(width, rngs=rngs)
        self.readout = nnx.Linear(width, 10, rngs=rngs)

    def __call__(self, x):
        graphdef, params = nnx.split(self.cell)
        z0 = jnp.zeros((x.shape[0], self.cell.recurrent.in_features), x.dtype)
        z = deqlab.fixed_point(lambda z, p, x: nnx.merge(graphdef, p)(z, x), z0, params, x,
                               solver=deqlab.Anderson(tol=1e-3, max_steps=40), batch_axis=0).value
        return self.readout(z)


@nnx.jit
def my_train_step(model, optimizer, x, y):
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


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


class Answer(NamedTuple):
    """One graded exercise: the grader's name, the model answer (what the reader writes), a
    function giving the grader's other arguments (built when called: a fresh model for the
    training step) and, for an answer that is a class, how the grader's instance is built."""

    grader: str
    answer: Any
    arguments: Callable[[], tuple] = tuple
    instance: Callable[[Any], Any] | None = None

    def grade(self):
        """The grader's report on the model answer."""
        from deqlab.lab import exercises

        first = self.answer if self.instance is None else self.instance(self.answer)
        return getattr(exercises, self.grader)(first, *self.arguments())


def _digits_model():
    from deqlab.lab.experiments import practice

    return (practice.DigitsClassifier(width=16, scale=0.5, tol=1e-3, max_steps=40, rngs=nnx.Rngs(0)),)


ANSWERS: dict[str, Answer] = {
    "ch0 p1 layer": Answer("check_layer", my_layer),
    "ch0 p1 weight-tied stack": Answer("check_weight_tied", my_weight_tied),
    "ch0 p1 residual": Answer("check_residual", my_residual),
    "ch0 p1 Picard": Answer("check_solver", my_picard, lambda: ("picard",)),
    "ch0 p2 Anderson": Answer("check_solver", my_anderson, lambda: ("anderson",)),
    "ch0 p3 implicit gradient": Answer("check_implicit_gradient", my_fixed_point),
    "ch0 p5 classifier": Answer("check_classifier", MyClassifier, instance=lambda cls: cls(16, rngs=nnx.Rngs(0))),
    "ch0 p5 training step": Answer("check_train_step", my_train_step, _digits_model),
    "ch1 p3 length trace": Answer("check_length_trace", my_length_trace),
    "ch2 p1 Stieltjes transform": Answer("check_stieltjes", my_stieltjes),
    "ch3 p5 mean difference": Answer("check_mean_difference", my_mean_difference),
    "ch3 p6 Jacobian penalty": Answer("check_jacobian_penalty", my_jacobian_penalty),
    "ch4 p2 linear DEQ": Answer("check_linear_deq", my_linear_deq),
    "ch5 p2 copy memory": Answer("check_copy_memory", my_copy_memory),
    "ch5 p5 semi-orthogonal": Answer("check_semi_orthogonal", my_semi_orthogonal),
    "ch5 p6 Table 1": Answer("check_table1", my_table1),
}
"""Graded exercise -> :class:`Answer` (grade one with ``ANSWERS[name].grade()``)."""
