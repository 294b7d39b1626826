"""Eager calls of solve / fixed_point hit a compilation cache (issue 15 item 4), and warm starts
compose with grad, jit and vmap (item 5). No timings: retraces are counted by a Python counter in
f, which runs only while f is traced.

Compile work: where the solver is not what a test is about (what the cache keys on, what it
releases, how failures are reported), the solve uses Picard, whose program compiles in about half
the time of Anderson's or the default's; checks on results are NumPy, which compiles nothing."""

import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqlab
from deqlab.backward import SHINE, BackwardWarning, Implicit, JacobianFree, Phantom, Unrolled
from deqlab.solvers import SolverError, get_solver

F32 = jnp.float32


def _problem(batch=4, width=8, seed=0):
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((width, width)))
    w = jnp.asarray(0.6 * q * np.sign(np.diag(r)), F32)
    x = jnp.asarray(rng.standard_normal((batch, width)), F32)
    return jnp.zeros((batch, width), F32), w, x


class _TraceLog:
    """Traces of the functions made by :func:`Counted`. They count through a list's bound
    ``append`` (a builtin method: keyed by identity, so the function stays cacheable); a function
    that *read* a changing counter (``Traces.n += 1`` on a class attribute) is compiled again at
    every change, as it must be (test_a_class_attribute_that_f_reads_is_never_stale)."""

    calls: list = []

    @property
    def n(self):
        return len(self.calls)


Traces = _TraceLog()


def Counted():
    """A fresh function z = tanh(W z + x) (a new cache key), counting its traces in ``Traces.n``."""
    log = Traces.calls.append

    def f(z, w, x):
        log(1)
        return jnp.tanh(z @ w.T + x)

    return f


def test_second_eager_solve_does_not_retrace():
    """A second eager solve with new array values reuses the compiled program and gives the new
    answer; another configuration compiles again. The answer is checked in NumPy: calling f itself
    would count as a trace (and made the last assertion hold whatever the solve did)."""
    z0, w, x = _problem()
    f = Counted()
    first = deqlab.solve(f, z0, w, x, batch_axis=0)
    traced = Traces.n
    assert traced >= 1
    second = deqlab.solve(f, z0, w, 1.5 * x, batch_axis=0)
    assert Traces.n == traced
    assert bool(np.all(second.converged))
    value = np.asarray(second.value)
    np.testing.assert_allclose(value, np.tanh(value @ np.asarray(w).T + 1.5 * np.asarray(x)), atol=1e-4)
    assert Traces.n == traced
    assert not np.allclose(first.value, second.value)
    # Another configuration or shape compiles again.
    deqlab.solve(f, z0, w, x, batch_axis=0, solver="picard")
    assert Traces.n > traced


def test_second_eager_fixed_point_and_gradient_do_not_retrace():
    """A second eager fixed_point, and a second eager gradient, reuse the compiled programs; a new
    function object compiles again. (Picard: the caching does not depend on the solver.)"""
    z0, w, x = _problem()
    f = Counted()

    def loss(w, x):
        return jnp.sum(deqlab.fixed_point(f, z0, w, x, batch_axis=0, solver="picard").value ** 2)

    deqlab.fixed_point(f, z0, w, x, batch_axis=0, solver="picard")
    traced = Traces.n
    deqlab.fixed_point(f, z0, w, 0.5 * x, batch_axis=0, solver="picard")
    assert Traces.n == traced
    grad = jax.grad(loss)
    g1 = grad(w, x)
    traced = Traces.n
    g2 = grad(w, 0.5 * x)
    assert Traces.n == traced  # eager grad: tracers of the outer transformation hit the cache
    assert not np.allclose(g1, g2)
    # A new function object with the same body is a new key: it compiles again (documented).
    deqlab.fixed_point(lambda z, w, x: f(z, w, x), z0, w, x, batch_axis=0, solver="picard")
    assert Traces.n > traced


def test_cached_gradient_matches_jit_and_vmap():
    """The eager (cached) gradient equals the jitted one and the sum of vmapped per-sample ones.
    (Picard: what is compared does not depend on the solver.)"""
    z0, w, x = _problem()
    f = Counted()

    def loss(w, x):
        return jnp.sum(deqlab.fixed_point(f, z0, w, x, batch_axis=0, solver="picard").value ** 2)

    eager = jax.grad(loss)(w, x)
    jitted = jax.jit(jax.grad(loss))(w, x)
    np.testing.assert_allclose(eager, jitted, rtol=1e-5, atol=1e-6)
    per_sample = jax.vmap(lambda xi: jax.grad(
        lambda w: jnp.sum(deqlab.fixed_point(f, z0[0], w, xi, solver="picard").value ** 2))(w))(x)
    np.testing.assert_allclose(per_sample.sum(0), eager, rtol=1e-3, atol=1e-4)


def test_non_array_arguments_are_static_parts_of_the_key():
    """Python numbers are not converted to arrays: a new value compiles again and gives its own
    (right) answer; the same value hits the cache. (Picard: the keying does not depend on the
    solver; the answers are checked in NumPy, which compiles nothing.)"""
    z0 = jnp.zeros((3, 4), F32)

    log = Traces.calls.append  # a builtin method: f stays cacheable (a closed-over list would not)

    def f(z, scale, offset):
        log(1)
        return 0.5 * jnp.tanh(z) + scale * offset

    a = deqlab.solve(f, z0, 0.1, jnp.ones(4, F32), solver="picard")
    count = Traces.n
    a2 = deqlab.solve(f, z0, 0.1, 2 * jnp.ones(4, F32), solver="picard")
    assert Traces.n == count
    b = deqlab.solve(f, z0, 0.2, jnp.ones(4, F32), solver="picard")
    assert Traces.n > count

    def f_np(z, scale, offset):
        return 0.5 * np.tanh(z) + scale * offset

    np.testing.assert_allclose(a.value, f_np(np.asarray(a.value), 0.1, 1.0), atol=1e-5)
    np.testing.assert_allclose(a2.value, f_np(np.asarray(a2.value), 0.1, 2.0), atol=1e-5)
    np.testing.assert_allclose(b.value, f_np(np.asarray(b.value), 0.2, 1.0), atol=1e-5)
    g = jax.grad(lambda s: deqlab.fixed_point(lambda z, s: 0.5 * jnp.tanh(z) + s, z0, s,
                                              solver="picard").value.sum())(F32(0.1))
    assert np.isfinite(g) and g > 0


def test_eager_failures_warn_and_raise_from_concrete_values():
    """Eager calls report failures (warn / raise) from concrete values, on cache hits too; a
    converged call is silent; NaN inputs and a mismatched structure are named. Picard: the
    failures (2 steps) and the converged solve do not depend on the solver."""
    z0, w, x = _problem()
    f = Counted()
    short = deqlab.Picard(max_steps=2)
    for _ in range(2):  # the second call hits the cache and still reports
        with pytest.warns(BackwardWarning, match="forward solve did not converge"):
            deqlab.fixed_point(f, z0, w, x, batch_axis=0, solver=short)
        with pytest.raises(SolverError, match="forward solve failed for 4/4"):
            deqlab.fixed_point(f, z0, w, x, batch_axis=0, solver=short, on_failure="raise")
        with pytest.raises(SolverError):
            deqlab.solve(f, z0, w, x, batch_axis=0, solver=short, on_failure="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        deqlab.fixed_point(f, z0, w, x, batch_axis=0, solver="picard")  # converged: silent
    with pytest.raises(ValueError, match="NaN"):
        deqlab.fixed_point(f, z0, w, x.at[0, 0].set(jnp.nan), batch_axis=0, solver="picard")
    with pytest.raises(ValueError, match="same pytree structure"):
        deqlab.solve(lambda z, w, x: (z, z), z0, w, x)


# ---------------------------------------------------------------------------------------------
# Warm starts (item 5)

BACKWARDS = {
    "implicit": Implicit(),
    "implicit-gmres": Implicit(solver="gmres"),
    "unrolled": Unrolled(),
    "phantom": Phantom(),
    "jacobian_free": JacobianFree(),
    "shine": SHINE(),
}
TOL = 1e-5
PARTIAL = 4  # steps of the solve whose state starts the warm one
# How the warm gradient is taken: of a state computed outside the gradient (not for Unrolled,
# whose gradient through a constant start is cut), of one computed inside it, each eager and
# jitted, and under vmap over problems.
TRANSFORMS = ("grad", "jit(grad)", "grad inside", "jit(grad inside)", "vmap")


def _warm_start_cases():
    """A covering design, not the product: every (solver, backward) pair once (the state's
    structure is the solver's, what a mode does with it the mode's: both matter together), each
    with two of the transformations, rotated so that every (solver, transformation) and every
    (backward, transformation) pair occurs (SHINE, with Broyden only, takes all five). The
    product ran 5 transformations x 16 pairs and compiled 2.5x the programs."""
    cases = []
    for b_index, backward in enumerate(BACKWARDS):
        for s_index, solver in enumerate(("picard", "anderson", "broyden")):
            if backward == "shine" and solver != "broyden":
                continue
            usable = TRANSFORMS[2:] if backward == "unrolled" else TRANSFORMS
            if backward == "shine":
                chosen = usable
            else:
                start = 2 * s_index + 2 * b_index
                chosen = tuple(usable[(start + k) % len(usable)] for k in range(2))
            cases.append(pytest.param(solver, backward, chosen, id=f"{solver}-{backward}"))
    return cases


def test_the_warm_start_design_covers_every_pair():
    cases = [c.values for c in _warm_start_cases()]
    assert {(s, b) for s, b, _ in cases} == {(s, b) for s in ("picard", "anderson", "broyden") for b in BACKWARDS
                                             if b != "shine" or s == "broyden"}
    for s in ("picard", "anderson", "broyden"):
        assert {t for s2, _, ts in cases if s2 == s for t in ts} == set(TRANSFORMS)
    for b in BACKWARDS:
        usable = set(TRANSFORMS[2:] if b == "unrolled" else TRANSFORMS)
        assert {t for _, b2, ts in cases if b2 == b for t in ts} == usable


@pytest.mark.parametrize("solver,backward,transforms", _warm_start_cases())
def test_warm_start_gradient_matches_cold_start(solver, backward, transforms):
    z0, w, x = _problem(batch=3, width=6, seed=1)
    mode = BACKWARDS[backward]
    options = dict(solver=get_solver(solver, tol=TOL, max_steps=200), batch_axis=0, backward=mode)

    def f(z, w, x):
        return jnp.tanh(z @ w.T + x)

    def warm_state(w, x):
        # Unrolled differentiates through the iterations: the start must carry their gradient
        # (an unrolled partial solve); the others' gradients do not depend on the start.
        if backward != "unrolled":  # a differentiable solve's state: traced under grad
            return deqlab.fixed_point(f, z0, w, x, solver=get_solver(solver, tol=TOL, max_steps=PARTIAL), batch_axis=0,
                                      on_failure="ignore").state
        partial = deqlab.solve(f, z0, w, x, solver=get_solver(solver, tol=TOL, max_steps=PARTIAL), batch_axis=0,
                               unrolled=backward == "unrolled", on_failure="ignore")
        return partial.state

    def cold(w, x):
        sol = deqlab.fixed_point(f, z0, w, x, **options)
        return jnp.sum(sol.value ** 2), sol.stats.steps

    def warm(w, x, state):
        sol = deqlab.fixed_point(f, z0, w, x, init_state=state, **options)
        return jnp.sum(sol.value ** 2), sol.stats.steps

    def warm_inside(w, x):  # the warm start computed under the same trace as the gradient
        return warm(w, x, warm_state(w, x))

    g_cold, steps_cold = jax.grad(cold, has_aux=True)(w, x)
    scale = float(jnp.max(jnp.abs(g_cold)))
    atol = 50 * TOL * scale
    runs = {
        "grad": lambda: jax.grad(warm, has_aux=True)(w, x, warm_state(w, x)),
        "jit(grad)": lambda: jax.jit(jax.grad(warm, has_aux=True))(w, x, warm_state(w, x)),
        "grad inside": lambda: jax.grad(warm_inside, has_aux=True)(w, x),
        "jit(grad inside)": lambda: jax.jit(jax.grad(warm_inside, has_aux=True))(w, x),
    }
    for name in transforms:
        if name == "vmap":
            continue
        g_warm, steps_warm = runs[name]()
        np.testing.assert_allclose(g_warm, g_cold, atol=atol, err_msg=name)
        assert int(jnp.max(steps_warm)) < int(jnp.max(steps_cold)), name
    if "vmap" not in transforms:
        return
    # vmap over problems (each sample solved on its own, batch_axis=None inside).
    xs = jnp.stack([x, 0.5 * x])

    def one(x):
        g, steps = jax.grad(warm_inside, has_aux=True)(w, x)
        return g, steps

    g_vmapped, steps_vmapped = jax.vmap(one)(xs)
    for i in range(2):
        g_ref, steps_ref = jax.grad(cold, has_aux=True)(w, xs[i])
        np.testing.assert_allclose(g_vmapped[i], g_ref, atol=50 * TOL * float(jnp.max(jnp.abs(g_ref))))
        assert int(jnp.max(steps_vmapped[i])) < int(jnp.max(steps_ref))


def test_rebinding_a_global_array_that_f_reads_compiles_again():
    """A notebook habit: f reads a global W; W = ... again must not reuse the old W silently."""
    global _W
    _W = 0.3 * jnp.eye(4, dtype=jnp.float32)
    f = lambda z, x: jnp.tanh(z @ _W + x)  # noqa: E731
    x = jnp.ones((2, 4), jnp.float32)
    first = deqlab.solve(f, jnp.zeros((2, 4), jnp.float32), x, batch_axis=0, solver="picard").value
    _W = -0.3 * jnp.eye(4, dtype=jnp.float32)
    second = deqlab.solve(f, jnp.zeros((2, 4), jnp.float32), x, batch_axis=0, solver="picard").value
    expected = deqlab.solve(lambda z, x, w: jnp.tanh(z @ w + x), jnp.zeros((2, 4), jnp.float32), x, _W,
                            batch_axis=0, solver="picard").value
    assert not np.allclose(first, second)
    np.testing.assert_allclose(second, expected, rtol=1e-5, atol=1e-6)


class Settings:
    scale = 0.5


def test_a_class_attribute_that_f_reads_is_never_stale():
    """f reads a class attribute that changes between calls: the second call compiles again
    (0.9.0 returned the first equilibrium, 2 instead of 4)."""
    f = lambda z: Settings.scale * z + 1.0  # noqa: E731
    first = deqlab.solve(f, jnp.zeros(2), solver=deqlab.Picard(max_steps=500))
    Settings.scale = 0.75
    try:
        second = deqlab.solve(f, jnp.zeros(2), solver=deqlab.Picard(max_steps=500))
    finally:
        Settings.scale = 0.5
    np.testing.assert_allclose(first.value, 2.0, rtol=1e-4)
    np.testing.assert_allclose(second.value, 4.0, rtol=1e-4)


class _Base:
    shift = 1.0


class _Derived(_Base):
    class Inner:
        scale = 0.5

    shape = (2,)  # a tuple of plain values: keyed by value, the call stays cached


_S = 1.0


def test_inherited_nested_and_generator_reads_are_never_stale():
    """What f reads through a base class, a nested class or a generator expression is keyed too
    (the referee's three stale cases), and a tuple attribute keeps the call cached."""
    solver = deqlab.Picard(max_steps=500)
    inherited = lambda z: 0.5 * z + _Derived.shift  # noqa: E731
    nested = lambda z: _Derived.Inner.scale * z + 1.0  # noqa: E731
    generator = lambda z: 0.5 * z + sum(_S for _ in range(1))  # noqa: E731
    shaped = lambda z: 0.5 * z + jnp.ones(_Derived.shape)  # noqa: E731
    global _S
    with warnings.catch_warnings():
        warnings.simplefilter("error", deqlab.solvers.UncachedCallWarning)
        before = [float(deqlab.solve(g, jnp.zeros(2), solver=solver).value[0]) for g in (inherited, nested, generator, shaped)]
        _Base.shift, _Derived.Inner.scale, _S = 2.0, 0.75, 2.0
        try:
            after = [float(deqlab.solve(g, jnp.zeros(2), solver=solver).value[0]) for g in (inherited, nested, generator)]
        finally:
            _Base.shift, _Derived.Inner.scale, _S = 1.0, 0.5, 1.0
    np.testing.assert_allclose(before, [2.0, 2.0, 2.0, 2.0], rtol=1e-4)
    np.testing.assert_allclose(after, [4.0, 4.0, 4.0], rtol=1e-4)


def test_a_rebound_global_releases_the_program_compiled_for_it():
    """The program compiled for the old value of a global f reads holds it as a constant: the
    cache keeps the programs of the last few values per function (a loop alternating between two
    values compiles each once) and releases older ones (0.9.0's first build kept every one: 144 MB
    per rebinding of a 36 MB matrix), and all of a function's programs when it is gone."""
    import gc

    from deqlab import _eager

    global _V
    log = Traces.calls.append
    f = lambda z: (log(1), 0.5 * jnp.tanh(z @ _V) + 1.0)[1]  # noqa: E731
    values = [jnp.full((4, 4), 0.1 * (i + 1), F32) for i in range(_eager.PROGRAMS_PER_FUNCTION + 2)]
    z0 = jnp.zeros((1, 4), F32)
    for value in values:  # Picard: what is kept and released does not depend on the solver
        _V = value
        deqlab.solve(f, z0, batch_axis=0, solver="picard")
    assert len(_eager._PROGRAMS[f]) == _eager.PROGRAMS_PER_FUNCTION
    traced = Traces.n
    for value in values[-2:] * 2:  # alternating between two recent values: nothing compiles again
        _V = value
        deqlab.solve(f, z0, batch_axis=0, solver="picard")
    assert Traces.n == traced
    alive = weakref.ref(f)
    count = len(_eager._PROGRAMS)
    del f
    gc.collect()
    assert alive() is None and len(_eager._PROGRAMS) == count - 1  # the function and its programs


def test_rebinding_a_closed_over_array_compiles_again():
    """A closed-over array rebound in f's cell is part of the key: the second call sees it."""

    def make(w):
        return lambda z, x: jnp.tanh(z @ w + x)

    x = jnp.ones((2, 4), jnp.float32)
    w = 0.3 * jnp.eye(4, dtype=jnp.float32)
    f = make(w)
    first = deqlab.fixed_point(f, jnp.zeros((2, 4), jnp.float32), x, batch_axis=0, solver="picard").value
    # the same function object with its cell rebound (what a loop over `w` in a notebook does)
    f.__closure__[0].cell_contents = -w
    second = deqlab.fixed_point(f, jnp.zeros((2, 4), jnp.float32), x, batch_axis=0, solver="picard").value
    assert not np.allclose(first, second)


def test_a_callable_object_with_state_is_never_stale():
    """An nnx.Module (or any object) passed as f can change its parameters between calls (training):
    such calls run uncached, so the second solve sees the new parameters, and the first call says
    so, once (UncachedCallWarning, naming the reason); under jit nothing is said."""
    from flax import nnx

    class Cell(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(8, 8, rngs=rngs)

        def __call__(self, z, x):
            return jnp.tanh(0.3 * self.linear(z) + x)

    cell = Cell(nnx.Rngs(0))
    x = jnp.ones(8, F32)
    z0 = jnp.zeros(8, F32)
    # Picard: an uncached solve runs its operations one by one, and Picard's are the fewest
    with pytest.warns(deqlab.solvers.UncachedCallWarning, match=r"Cell runs uncached.*callable object"):
        before = deqlab.solve(cell, z0, x, solver="picard").value
    cell.linear.kernel[...] = -cell.linear.kernel[...]
    with warnings.catch_warnings():
        warnings.simplefilter("error", deqlab.solvers.UncachedCallWarning)  # once per function
        after = deqlab.solve(cell, z0, x, solver="picard")
        class Other(Cell):  # a new type, not warned about yet: traced, it is still not warned about
            pass

        other = Other(nnx.Rngs(1))
        jax.jit(lambda x: deqlab.solve(other, z0, x, solver="picard").value)(x)
    assert not np.allclose(before, after.value)
    # the map at the new parameters, in NumPy (compiles nothing)
    kernel, bias = np.asarray(cell.linear.kernel[...]), np.asarray(cell.linear.bias[...])
    z = np.asarray(after.value)
    np.testing.assert_allclose(z, np.tanh(0.3 * (z @ kernel + bias) + np.asarray(x)), atol=1e-4)


def test_a_global_read_through_a_helper_function_is_followed():
    """A global read by a function that f calls is part of the key: rebinding it compiles again."""
    global _V
    _V = 0.3 * jnp.eye(4, dtype=F32)
    x = jnp.ones(4, F32)
    f = lambda z, x: jnp.tanh(_helper(z) + x)  # noqa: E731
    first = deqlab.solve(f, jnp.zeros(4, F32), x, solver="picard").value
    _V = -0.3 * jnp.eye(4, dtype=F32)
    second = deqlab.solve(f, jnp.zeros(4, F32), x, solver="picard").value
    expected = np.tanh(np.asarray(_V) @ np.asarray(second) + np.asarray(x))  # NumPy: compiles nothing
    np.testing.assert_allclose(second, expected, atol=1e-5)
    assert not np.allclose(first, second)


def _helper(z):
    return _V @ z


class _CountingCell:
    """Built lazily (flax imported inside): a tanh cell whose __call__ counts its traces."""

    n = 0

    @classmethod
    def make(cls, width=8, features=3, seed=0):
        from flax import nnx

        class Cell(nnx.Module):
            def __init__(self, rngs):
                self.width, self.in_features = width, features
                self.recurrent = nnx.Linear(width, width, use_bias=False, rngs=rngs)
                self.recurrent.kernel.value = 0.5 * self.recurrent.kernel.value / jnp.linalg.norm(
                    self.recurrent.kernel.value, 2)
                self.inject = nnx.Linear(features, width, rngs=rngs)

            def __call__(self, z, x):
                cls.n += 1
                return jnp.tanh(self.recurrent(z) + self.inject(x))

        return Cell(nnx.Rngs(seed))


def test_second_eager_deq_call_and_gradient_do_not_retrace():
    from flax import nnx

    from deqlab.nn import DEQ

    layer = DEQ(_CountingCell.make())
    x = jax.random.normal(jax.random.key(1), (4, 3), F32)
    first = layer(x)
    traced = _CountingCell.n
    assert traced >= 1
    second = layer(x)
    assert _CountingCell.n == traced  # the same cell structure and shapes: the compiled solve is reused
    np.testing.assert_array_equal(first, second)
    # New parameter values are arguments, not constants: no retrace, and the result follows them.
    layer.cell.inject.bias.value = layer.cell.inject.bias.value + 1.0
    moved = layer(x)
    assert _CountingCell.n == traced
    assert not np.allclose(moved, first)
    cell = layer.cell  # the map at the moved parameters, in NumPy (compiles nothing)
    injected = np.asarray(x) @ np.asarray(cell.inject.kernel[...]) + np.asarray(cell.inject.bias[...])
    expected = np.tanh(np.asarray(moved) @ np.asarray(cell.recurrent.kernel[...]) + injected)
    np.testing.assert_allclose(moved, expected, atol=1e-4)

    def loss(model, x):
        return jnp.sum(model(x) ** 2)

    nnx.grad(loss)(layer, x)
    traced = _CountingCell.n
    grads = nnx.grad(loss)(layer, x)
    assert _CountingCell.n == traced
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree_util.tree_leaves(grads))
