"""The :class:`DEQ` layer: a cell solved to its equilibrium, with an implicit backward pass."""

from __future__ import annotations

import contextvars
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from deqlab import _eager, checks
from deqlab import precision as precision_module
from deqlab.backward import fixed_point, get_backward
from deqlab.failures import check_policy
from deqlab.solvers import Solution, get_solver, make_budget, solve
from deqlab.solvers.api import _check_init_state

__all__ = ["DEQ", "SOLVER_STATS", "capture_solver_stats"]

SOLVER_STATS = "solver_stats"
"""Name under which a :class:`DEQ` sows the statistics of each call (``nnx.Intermediate``)."""

# Set while a function wrapped by capture_solver_stats runs: only then does a DEQ sow. Sowing
# outside a capture would make the model's state grow with every call (and nnx.jit retrace every
# step); flax >= 0.12 deprecates it for that reason.
_capturing = contextvars.ContextVar("deqlab_capture_solver_stats", default=False)


def _apply_cell(z, graphdef, state, x, *masks):
    """The cell as a map of (z, its state, x): the ``f`` every call of :class:`DEQ` hands to the solver.

    One module-level function, with the graph definition (a pytree without leaves: static) as an
    argument rather than captured in a closure made per call: deqlab's internal jit is cached on
    ``f`` and the static parts of its arguments (``deqlab._eager``), so an eager call of a layer
    compiles once per cell structure and shapes, not on every call.
    """
    return nnx.merge(graphdef, state)(z, x, *masks)


class DEQ(nnx.Module):
    """Deep equilibrium layer ``z* = cell(z*, x)``, differentiated implicitly (003 Eq. 11).

    The forward pass solves for the fixed point of the cell (003 §3.1); the backward pass is
    chosen by ``backward``. The cell's parameters are split from its graph (``nnx.split``) and
    passed to :func:`deqlab.backward.fixed_point` explicitly, so the custom VJP never closes over
    traced parameters.

    Args:
        cell: an ``nnx.Module`` mapping ``(z, x)`` to ``z'`` of the same shape as z, with a
            ``width`` attribute (the size of z's last axis) and, to have x's width checked, an
            ``in_features`` attribute.
        solver: forward solver: ``"adaptive"`` (the default: plain iteration, Anderson or
            Broyden, chosen per solve by :class:`deqlab.solvers.Adaptive`, ``max_steps=100``),
            ``"anderson"``, ``"broyden"``, ``"picard"``, or a configured object
            (``Anderson(m=6, tol=1e-6)``, or an instance of your own
            :class:`deqlab.solvers.Solver` subclass).
        tol: a convenience for the solver's tolerance: the layer builds its solver object once,
            here, with :func:`deqlab.solvers.get_solver` (with a name, the named solver with this
            setting; with an object, ``solver.replace(tol=...)``). None leaves the solver's own;
            a tolerance that is None in the end follows the solve's dtype (float32 1e-5, float64
            1e-10; :func:`deqlab.precision.default_tol`). ``layer.solver`` is the object every
            call uses.
        max_steps: a convenience for the solver's iteration limit, as ``tol``. It is also the
            cap of a call's budget (``layer(x, max_steps=k)``, below).
        backward: how the gradient is computed, a name (the mode with its defaults) or an object:

            * ``"implicit"`` (default) / :class:`deqlab.backward.Implicit`: solve the adjoint
              fixed point of 003 Eq. 11; ``Implicit(solver="gmres")`` (or
              ``Implicit(solver=GMRES(restart=...))``, :class:`deqlab.backward.GMRES`) solves the
              adjoint linear system by GMRES instead of the forward solver;
            * ``"unrolled"`` / :class:`deqlab.backward.Unrolled`: backpropagation through the
              forward iterations;
            * ``"phantom"`` / :class:`deqlab.backward.Phantom`: a few damped steps from ``z*``;
            * ``"jacobian_free"`` / :class:`deqlab.backward.JacobianFree`: one undamped step;
            * ``"shine"`` / :class:`deqlab.backward.SHINE`: the forward Broyden inverse-Jacobian
              estimate (needs ``solver="broyden"``);
            * an instance of your own :class:`deqlab.backward.Backward` subclass.
        on_failure: what a sample whose forward or adjoint solve failed does: ``"warn"``
            (default; eagerly a warning, under ``nnx.jit`` nothing in the program: read
            ``capture_solver_stats``), ``"raise"``, ``"nan"`` (its value becomes NaN with a zero
            gradient, so a loss on the value masked by ``converged`` trains), ``"ignore"`` or ``"callback"``
            (warn from a host callback inside compiled programs), as for
            :func:`deqlab.backward.fixed_point` (:mod:`deqlab.failures`).
        batch_axis: axis of x and z indexing independent samples (default 0; it must not be the
            feature axis). None: x is a single sample.
        precision: matmul precision of the solve (``"default"``, ``"high"``, ``"highest"``); None:
            what the tolerance needs (see :mod:`deqlab.precision`; it matters on TPUs).
        dtype: dtype of the solve (x and z are cast to it); None: x's dtype.
        param_dtype: if given, the layer holds a copy of ``cell`` with its parameters cast to
            it (e.g. float64 for a gradient check of a float32 cell); the ``cell`` passed in is
            not changed. None: the cell itself, with its own dtypes.
        correction: number ``K`` of fixed-point-correction iterates (Bai, Geng, Savani & Kolter
            2022, "Deep equilibrium optical flow estimation"); 0 (default): none.
        correction_stride: forward-solver steps between two correction iterates (>= 1).
        eval_max_steps: the iteration limit in evaluation mode (``layer.eval()``, a model's
            ``model.eval()``); it may exceed ``max_steps``. None: the training one.
        eval_tol: the tolerance in evaluation mode (> 0); None: the training one.
        deterministic: start in evaluation mode (``eval_max_steps`` / ``eval_tol``, and the
            cell's dropout switched off, as ``layer.eval()`` would); flax's ``train()`` /
            ``eval()`` switch it (as they do :class:`deqlab.nn.WeightTiedDropout`).

    Attributes:
        cell: the cell (a copy with ``param_dtype`` parameters when that was given).
        solver: the forward solver object (training mode).
        eval_max_steps, eval_tol: the evaluation-mode settings (None: the solver's);
            :attr:`eval_solver` is the solver they make.
        deterministic: whether the layer is in evaluation mode.
        backward: the backward object.
        on_failure: the failure policy.
        batch_axis: the batch axis, or None.

    Raises:
        ValueError: ``cell`` is not a callable ``nnx.Module`` with an integer ``width >= 1``, or
            ``solver``, ``backward``, ``on_failure``, ``batch_axis``, ``precision``, ``dtype``,
            ``param_dtype``, ``correction``, ``correction_stride``, ``eval_max_steps``, ``eval_tol``
            or ``deterministic`` is not valid (the message names the argument and its valid values).

    **A budget per call.** ``layer(x, max_steps=k, tol=t)`` solves with the iteration limit ``k``
    and the tolerance ``t`` for this call only. Both are traced values
    (:class:`deqlab.solvers.Budget`): inside a jitted step that takes them as arguments, new
    values do not compile again, and the result equals that of a layer built with
    ``max_steps=k, tol=t``. The layer's own ``max_steps`` (in evaluation mode ``eval_max_steps``)
    is the cap: ``k`` must lie in ``[1, cap]`` (a concrete value outside raises; a traced one is
    clipped), because the cap sizes the residual trace and an unrolled backward pass's scan,
    which runs ``cap`` steps masked past ``k``. The budget is the forward solve's: the backward
    pass's own solves keep their settings (an implicit adjoint solve, the layer's ``max_steps``
    and ``tol``, or ``backward=Implicit(max_steps=..., tol=...)``). The matmul precision follows
    the layer's static ``tol`` (``precision="highest"`` for a tighter call on a TPU).

    **Warm starts.** ``layer(x, z0)`` starts the solve at ``z0``, e.g. the previous equilibrium of
    the same samples (the last epoch's, kept in a :class:`deqlab.nn.FixedPointCache` by sample
    index, or the previous output at inference); ``init_state=sol.state`` also continues a
    solver's history (``return_solution=True`` gives ``sol``). Both are inputs without gradient
    (``stop_gradient``): the implicit gradient does not depend on the start (003 Theorem 1), and
    the unrolled one then differentiates the iterations from it.

    **Fixed-point correction.** With ``correction=K``, ``layer(x, return_iterates=True)`` also
    returns ``K`` intermediate states, stacked on a new leading axis: the forward solver's own
    iterates after ``s, 2s, ..., Ks`` steps (``s = correction_stride``; computed without gradient,
    by continuing one solve through :class:`deqlab.solvers.SolverState`), each followed by one
    differentiable step of the cell, ``z_k = cell(stop_gradient(zhat_k), x)`` (a one-step phantom
    gradient, as Bai et al. 2022 use). A loss on them, ``sum_k gamma^(K-k) L(z_k)`` as in Bai et
    al.'s sparse correction, trains the early iterates towards the answer, which makes the
    forward solve need fewer steps. They cost ``K s`` more cell evaluations without gradient and
    ``K`` with.

    **Weight-tied dropout.** A cell with a ``dropout_masks(z_shape, dtype)`` method (the cells of
    :mod:`deqlab.nn` built with ``dropout=p``) is called as ``cell(z, x, masks)``: each forward
    call draws the masks once, before the solve, and passes them into the map as an argument, so
    the solver iterates one fixed map and the implicit backward pass differentiates that same map
    (:mod:`deqlab.nn.dropout`). ``layer.eval()`` switches the masks off (the undropped map,
    exactly), ``layer.train()`` on; ``layer(x, masks=...)`` uses given masks instead of drawing.

    **Solver statistics.** Inside a function wrapped by :func:`capture_solver_stats`, each call
    sows its solver statistics into the ``nnx.Intermediate`` collection under
    :data:`SOLVER_STATS` (a dict per call: ``steps_mean``, ``steps_max``, ``converged_fraction``,
    ``residual_max``, ``nfe``); calls append, so two calls of a shared layer do not overwrite each
    other. ``return_solution=True`` also returns the whole :class:`~deqlab.solvers.Solution`.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import DEQ, TanhCell
        >>> layer = DEQ(TanhCell(8, 3, rngs=nnx.Rngs(0)), backward="implicit")
        >>> x = jnp.ones((2, 3))
        >>> z, sol = layer(x, return_solution=True)
        >>> z.shape, bool(sol.converged.all())
        ((2, 8), True)
        >>> residual = layer.cell(z, x) - z
        >>> bool(jnp.abs(residual).max() < 1e-4)
        True
    """

    def __init__(self, cell: nnx.Module, *, solver: Any = "adaptive", tol: float | None = None,
                 max_steps: int | None = None, backward: Any = "implicit", on_failure: str = "warn",
                 batch_axis: int | None = 0,
                 precision: Any = None, dtype: Any = None, param_dtype: Any = None, correction: int = 0,
                 correction_stride: int = 2, eval_max_steps: int | None = None, eval_tol: float | None = None,
                 deterministic: bool = False):
        where = "nn.DEQ"
        if not isinstance(cell, nnx.Module) or not callable(cell):
            raise checks.fail("cell", "an nnx.Module called as cell(z, x)", type(cell).__name__, where)
        if not hasattr(cell, "width"):
            raise ValueError(f"{where}: `cell` must have a `width` attribute (the size of the hidden state).")
        checks.positive_int(cell.width, "cell.width", where)
        if batch_axis is not None:
            checks.integer(batch_axis, "batch_axis", where)
        self.cell = cell
        self.solver = get_solver(solver, tol=tol, max_steps=max_steps)
        self.eval_max_steps = None if eval_max_steps is None else checks.positive_int(
            eval_max_steps, "eval_max_steps", where)
        self.eval_tol = None if eval_tol is None else checks.positive_number(eval_tol, "eval_tol", where)
        if not isinstance(deterministic, bool):
            raise checks.fail("deterministic", "True or False", deterministic, where)
        self.deterministic = deterministic
        if deterministic:
            # Evaluation mode is the whole layer's, as model.eval() would set it: the cell's
            # dropout (a WeightTiedDropout, an nnx.Dropout) stops drawing masks too.
            cell.set_attributes(deterministic=True, raise_if_not_found=False)
        self.backward = get_backward(backward)
        self.on_failure = check_policy(on_failure, where)
        self.batch_axis = batch_axis
        self.correction = checks.integer(correction, "correction", where, minimum=0)
        self.correction_stride = checks.positive_int(correction_stride, "correction_stride", where)
        self.precision = None if precision is None else precision_module.check_precision(precision, where)
        self.dtype = None if dtype is None else checks.floating_dtype(dtype, "dtype", where)
        if param_dtype is not None:
            param_dtype = checks.floating_dtype(param_dtype, "param_dtype", where)
            self.cell = cell = nnx.clone(cell)  # the caller's cell keeps its own dtypes
            params = nnx.state(cell, nnx.Param)
            nnx.update(cell, jax.tree_util.tree_map(lambda p: p.astype(param_dtype), params))

    @property
    def eval_solver(self):
        """The forward solver in evaluation mode: :attr:`solver` with ``eval_max_steps`` and
        ``eval_tol`` where they are given."""
        settings = {name: value for name, value in (("max_steps", self.eval_max_steps), ("tol", self.eval_tol))
                    if value is not None}
        return self.solver.replace(**settings)

    def _check_input(self, x, z0):
        where = "nn.DEQ"
        if not hasattr(x, "dtype") or not hasattr(x, "shape"):
            raise checks.fail("x", "an array", type(x).__name__, where)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(
                f"{where}: `x` must be a real floating-point array, got dtype {x.dtype}; "
                "convert it with x.astype(jnp.float32)."
            )
        if self.batch_axis is not None:
            axis = self.batch_axis
            if x.ndim < 2 or not -x.ndim <= axis < x.ndim or axis % x.ndim == x.ndim - 1:
                raise ValueError(
                    f"{where}: `x` has shape {tuple(x.shape)}, but with batch_axis={axis} it must have a "
                    f"batch axis {axis} besides its feature axis (ndim >= 2). For one sample pass "
                    "x[None] or build the layer with batch_axis=None."
                )
        elif x.ndim < 1:
            raise checks.fail("x", "an array with a feature axis (ndim >= 1)", f"shape {tuple(x.shape)}", where)
        if not checks.is_traced(x):
            # A concrete x can be closed over inside jit, where jnp ops would trace: evaluate now.
            with jax.ensure_compile_time_eval():
                finite = bool(jnp.all(jnp.isfinite(x)))
            if not finite:
                raise ValueError(f"{where}: `x` contains NaN or inf; inputs must be finite.")
        in_features = getattr(self.cell, "in_features", None)
        if in_features is not None and x.shape[-1] != in_features:
            raise ValueError(
                f"{where}: `x` must have {in_features} features on its last axis (the cell's "
                f"in_features), got shape {tuple(x.shape)}."
            )
        expected = tuple(x.shape[:-1]) + (self.cell.width,)
        if z0 is not None and tuple(jnp.shape(z0)) != expected:
            raise ValueError(f"{where}: `z0` must have shape {expected} (x's batch, the cell's width), "
                             f"got {tuple(jnp.shape(z0))}.")

    def __call__(self, x: jax.Array, z0: jax.Array | None = None, *, max_steps: Any = None,
                 tol: Any = None, init_state: Any = None, masks: Any = None,
                 return_solution: bool = False, return_iterates: bool = False):
        """The equilibrium ``z*`` of the cell for the input ``x``.

        Args:
            x: the input, a real floating array whose last axis is the cell's ``in_features`` (with a
                batch axis ``batch_axis`` when the layer has one); it must be finite.
            z0: the starting point, of shape ``x.shape[:-1] + (cell.width,)``; None: zeros. A warm
                start (an earlier equilibrium), taken without gradient.
            max_steps: this call's iteration limit, an integer in ``[1, cap]`` (the cap: the
                layer's ``max_steps``, in evaluation mode ``eval_max_steps``) or an integer scalar
                array (traced: no recompilation for new values); None: the cap.
            tol: this call's tolerance, a number > 0 or a floating scalar array (traced); None:
                the layer's (in evaluation mode ``eval_tol``).
            init_state: ``sol.state`` of an earlier call on the same samples (with
                ``return_solution=True``) to continue its solver history; taken without gradient.
            masks: weight-tied dropout masks for the whole solve (``cell.dropout_masks(z0.shape)``
                gives their form); None: a cell with dropout draws fresh ones now (none in
                evaluation mode), a cell without it runs undropped. Given masks are used whatever
                the mode (they are the caller's choice), and receive no gradient.
            return_solution: also return the :class:`~deqlab.solvers.Solution`.
            return_iterates: also return the fixed-point-correction iterates (class docstring),
                shape ``(correction,) + z.shape``.

        Returns:
            ``z*``; with ``return_solution`` also the solution, with ``return_iterates`` also the
            iterates, in that order (a tuple when more than ``z*``).

        Raises:
            ValueError: ``x`` is not a finite real floating array of the expected shape, ``z0`` has
                the wrong shape, ``max_steps`` or ``tol`` is out of range (named, with the range),
                ``init_state`` is not a solver state, ``masks`` are given to a cell without
                dropout, or ``return_iterates`` is asked of a layer without ``correction``.
        """
        if return_iterates and self.correction == 0:
            raise ValueError("nn.DEQ: `return_iterates=True` needs a layer built with correction >= 1 "
                             f"(the number of correction iterates), got correction={self.correction}.")
        self._check_input(x, z0)
        _check_init_state(init_state, "nn.DEQ")
        dtype = self.dtype or x.dtype
        x = x.astype(dtype)
        # a warm start is a constant of the solve: no gradient flows to it (the implicit gradient
        # ignores it anyway; an unrolled one would otherwise reach into the previous step's graph)
        z0 = (jnp.zeros(x.shape[:-1] + (self.cell.width,), dtype) if z0 is None
              else jax.lax.stop_gradient(jnp.asarray(z0, dtype)))
        init_state = jax.lax.stop_gradient(init_state)
        solver = self.eval_solver if self.deterministic else self.solver
        # Always a budget (the mode's own settings when none is given): a call with and one
        # without max_steps / tol share one compiled computation.
        budget = make_budget(solver, dtype, max_steps=max_steps, tol=tol, where="nn.DEQ")
        draw_masks = getattr(self.cell, "dropout_masks", None)
        if masks is None and draw_masks is not None:
            # once per forward call, outside the solver: every iteration sees the same masks
            masks = draw_masks(z0.shape, dtype)
        elif masks is not None and draw_masks is None:
            raise ValueError("nn.DEQ: `masks` were given, but the cell has no weight-tied dropout (no "
                             "`dropout_masks` method); build the cell with dropout=p.")
        # split after drawing: the state carries the advanced mask stream out of this call
        graphdef, state = nnx.split(self.cell)
        # named here, in the layer's terms ("cell['recurrent']['kernel']"), before fixed_point would
        # name the same leaf by its position among its arguments
        _eager.check_finite([("cell", nnx.state(self.cell, nnx.Param)), ("x", x)], "nn.DEQ")
        # masks are constants of the map, not parameters: no gradient flows to them
        extra = () if masks is None else (jax.lax.stop_gradient(masks),)

        sol: Solution = fixed_point(
            _apply_cell, z0, graphdef, state, x, *extra, solver=solver, backward=self.backward,
            on_failure=self.on_failure, batch_axis=self.batch_axis, precision=self.precision,
            init_state=init_state, budget=budget,
        )
        if _capturing.get():
            self._sow_stats(sol)
        out = (sol.value, sol) if return_solution else (sol.value,)
        if return_iterates:
            def cell_map(z, state, x, *masks):
                return _apply_cell(z, graphdef, state, x, *masks)

            out = out + (self._correction_iterates(cell_map, z0, state, x, extra),)
        return out if len(out) > 1 else out[0]

    def _correction_iterates(self, cell_map, z0, state, x, extra=()):
        """The solver's iterates every ``correction_stride`` steps, each with one differentiable
        step of the cell (Bai et al. 2022); ``extra``: the forward call's dropout masks."""
        frozen = jax.lax.stop_gradient((state, x) + tuple(extra))
        path = None
        iterates = []
        for _ in range(self.correction):
            partial = solve(cell_map, jax.lax.stop_gradient(z0), *frozen,
                            solver=self.solver.replace(max_steps=self.correction_stride),
                            batch_axis=self.batch_axis,
                            precision=self.precision, init_state=path, on_failure="ignore")
            path = partial.state
            iterates.append(cell_map(jax.lax.stop_gradient(partial.value), state, x, *extra))
        return jnp.stack(iterates)

    def _sow_stats(self, sol):
        steps = jax.lax.stop_gradient(sol.stats.steps).astype(jnp.float32)
        self.sow(nnx.Intermediate, SOLVER_STATS, {
            "steps_mean": jnp.mean(steps),
            "steps_max": jnp.max(steps),
            "converged_fraction": jnp.mean(sol.converged.astype(jnp.float32)),
            "residual_max": jnp.max(jax.lax.stop_gradient(sol.stats.best_residual)).astype(jnp.float32),
            "nfe": sol.stats.nfe.astype(jnp.float32),
        })


def capture_solver_stats(fn: Callable[..., Any]) -> Callable[..., tuple[Any, dict[str, list]]]:
    """Wrap ``fn(model, *args)`` to also return the solver statistics of every :class:`DEQ` in it.

    Works inside ``nnx.jit`` and ``nnx.grad``, with ``nnx.capture`` where flax has it (>= 0.12)
    and with sow-then-pop before::

        loss_and_stats = capture_solver_stats(lambda m, x: loss(m(x)))
        (loss, stats), grads = nnx.value_and_grad(loss_and_stats, has_aux=True)(model, x)
        stats["deq"][0]["converged_fraction"]

    Args:
        fn: a function ``fn(model, *args, **kwargs)`` of an ``nnx.Module``.

    Returns:
        ``run(model, *args, **kwargs) -> (fn's result, stats)``, where ``stats`` maps the path of
        each :class:`DEQ` in ``model`` (``"/"``-joined attribute names; ``""`` for ``model``
        itself) to the list of its calls' statistics, in call order.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import DEQ, TanhCell, capture_solver_stats
        >>> layer = DEQ(TanhCell(4, 2, rngs=nnx.Rngs(0)))
        >>> run = capture_solver_stats(lambda model, x: model(x).sum())
        >>> total, stats = run(layer, jnp.ones((3, 2)))
        >>> list(stats), sorted(stats[""][0])
        ([''], ['converged_fraction', 'nfe', 'residual_max', 'steps_max', 'steps_mean'])
    """

    def run(model, *args, **kwargs):
        token = _capturing.set(True)
        try:
            if hasattr(nnx, "capture"):
                out, state = nnx.capture(fn, nnx.Intermediate)(model, *args, **kwargs)
            else:
                out = fn(model, *args, **kwargs)
                state = nnx.pop(model, nnx.Intermediate)
        finally:
            _capturing.reset(token)
        return out, _solver_stats(state)

    return run


def _solver_stats(state) -> dict[str, list[dict[str, jax.Array]]]:
    is_variable = lambda v: isinstance(v, nnx.Variable)  # noqa: E731
    stats = {}
    for path, variable in jax.tree_util.tree_leaves_with_path(state, is_leaf=is_variable):
        keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
        if keys and keys[-1] == SOLVER_STATS:
            value = variable.get_value() if hasattr(variable, "get_value") else variable.value
            stats["/".join(keys[:-1])] = list(value)
    return stats
