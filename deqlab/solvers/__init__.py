"""Forward fixed-point solvers for equilibrium models: damped Picard, Anderson, Broyden, and the
default that chooses among them.

A deep equilibrium model (003 §3.1, Eq. 4) outputs the fixed point z* = f(z*, x). This package
finds it. Every solver here works on a pytree ``z`` and returns a :class:`Solution` carrying the
value, a per-sample :class:`~deqlab.failures.Result`, and statistics (steps, function evaluations, the residual
trace and the best residual).

The default solver
    :class:`Adaptive` (``"adaptive"``, what :func:`solve`, :func:`deqlab.backward.fixed_point`
    and :class:`deqlab.nn.DEQ` use when no solver is named) chooses per solve, for the whole
    batch, by a written rule: Broyden from the start for an expensive map (:func:`map_work`),
    otherwise a plain warm-up, an Anderson trial, and whichever gains more decades per unit of
    work; it stops on ``stop="error"``. :func:`chosen` names its choice. A named solver is
    used as named, with its own defaults (``stop="residual"``).

Settings live on the solver object
    ``Anderson(m=5, tol=1e-6, max_steps=200, stop="error")`` holds every setting of a solve;
    :func:`solve` and :func:`deqlab.backward.fixed_point` take the object (or a name, for the
    defaults) and nothing that overrides it. ``solver.replace(tol=1e-8)`` is a copy with some
    settings changed, validated like the constructor.

Writing a solver
    The built-in solvers (:class:`Picard`, :class:`Anderson`, :class:`Broyden`) are subclasses of
    :class:`Solver`, and so can be yours: define ``init(z, fz)`` and ``propose(z, fz, state)`` for
    one sample (a flattened ``(D,)`` row), and the shared loop applies them to every sample with
    ``jax.vmap`` and gives it everything below (per-sample stopping, result codes, statistics,
    ``init_state`` warm starts, ``stop="error"``). The loop has no special case for any solver:
    what differs between them is declared by hooks on :class:`Solver` (``terminate``,
    ``rate_estimate``, ``error_bound_factor``, ``plain_step``, ``steps_past_convergence``, ``freeze_state``,
    ``couples_samples``, ``init_is_first_record``, ``stays_at_fixed_points``, ``for_map``). In the default
    loop (every step judged, not unrolled) and with ``check_every="auto"`` f(z0) is evaluated in
    the loop's first iteration, so
    f appears once in the compiled program, when the solver keeps no state or declares
    ``init_is_first_record`` (Picard, Anderson, Broyden, Adaptive); otherwise (a stateful solver of yours
    by default) before the loop. Solver objects are pytrees: their real-number settings (``tol``,
    ``damping``, ``ridge``, ``step``, ``safety``, ``divergence_factor``) are leaves, so they can be
    swept with ``jax.vmap``, differentiated, or changed without compiling again when passed as
    arrays; the settings that set shapes or the program's structure (``max_steps``, ``m``,
    ``stop``, ``check_every``) are static. With Python numbers in every setting a solver is also
    hashable (a static argument of ``jax.jit``, as before).

Tolerance rule (every named solver's, unless ``stop="error"``)
    A sample has converged when its *relative residual*

    .. math:: \\rho(z) = \\frac{\\lVert f(z) - z \\rVert_2}{\\lVert f(z) \\rVert_2 + \\epsilon\\sqrt{D}}

    satisfies ``rho <= tol``. Norms are taken per sample over all its entries (all leaves of the
    pytree, D numbers in total), accumulated in at least float32; ``epsilon`` is the machine
    epsilon of the iterate's dtype, so a fixed point at exactly zero is still reachable. With
    ``batch_axis=None`` the whole pytree is one sample.

    The rule is relative, as every practical one must be: an iteration that runs off to infinity
    by constant steps, as for f(z) = z + 1 (no fixed point), meets ``tol = 1e-2`` once ``|z| > 99``,
    while its absolute residual, which the divergence test watches, stays 1. At tolerances near
    the dtype's default such a solve runs to ``max_steps`` instead; where f may have no fixed
    point, look at ``stats.residual_trace`` and the size of the value.

    The default ``tol`` follows the dtype of ``z0`` (:func:`deqlab.precision.default_tol`:
    float64 1e-10, float32 1e-5, float16 1e-2, bfloat16 5e-2), and a tolerance below what the
    dtype can reach warns once. f is evaluated at the matmul precision the tolerance needs, which
    matters on TPUs and TF32 GPUs (:mod:`deqlab.precision`).

Error-controlled stopping (``stop="error"``)
    Users want z* to an accuracy, not a residual. With ``stop="error"`` a sample stops when the
    estimated error of the value it would return is within ``tol``:

    .. math:: s \\, \\frac{c(q)\\, \\lVert f(z) - z \\rVert_\\infty}{\\max(1, \\lVert f(z) \\rVert_\\infty)} \\le \\mathrm{tol}

    (max-abs error, absolute for states of size at most 1 and relative above; ``s`` is ``safety``,
    default 1.5). These are Banach's a-posteriori bounds for a map contracting at rate q: Picard
    returns z + damping (f(z) - z), within c(q) = damping q / (1 - q) of its step from z*; Anderson
    and Broyden return z, within c(q) = 1 / (1 - q) of the residual
    (:meth:`Solver.error_bound_factor`). The rate is estimated per sample from the solve itself
    (:attr:`Solver.rate_estimate`): for Picard the largest of the last three residual ratios
    ``||g_k|| / ||g_{k-1}||`` (g = f(z) - z); for Anderson and Broyden, whose residual ratios
    measure the acceleration rather than f, the largest secant quotient
    ``||f(z') - f(z)|| / ||z' - z||`` over all steps so far. Where the estimate is unreliable (a
    rate at or above 0.999, which a residual that grew gives Picard; a non-finite ratio; Picard's
    first three steps) the residual rule above decides, with the same ``tol``;
    ``SolveStats.error_estimate`` is then inf. The bound assumes the rate seen so far is f's; the
    factor ``safety`` covers an estimate of the rate that is somewhat low, and on rotating spectra
    the bound is conservative (it sums step lengths that cancel).

    Where f is not a contraction in this sense, the fallback decides and tol bounds only the
    residual. ``benchmarks/stopping.py`` is such a case (tanh DEQ, W orthogonal at scale 1.3,
    float32, tol 1e-5): the iteration converges, but where tanh is unsaturated f stretches by up
    to 1.3, and at the step where they stop the rate estimate is unreliable for 91 (Picard), 95
    (Anderson) and 95 (Broyden) of the 96 samples at N = 384. Every sample whose error exceeded
    tol (worst samples: Anderson 1.25e-5 at N = 384, ``benchmarks/results/stopping_quick.txt``;
    Picard 1.7e-5, Anderson 6.2e-5, Broyden 1.2e-5 at N = 32, ``--size tiny``, not stored) was
    one of these, with ``error_estimate`` inf; none with a finite estimate did
    (``benchmarks/stopping.py`` prints these counts).
    ``SolveStats.error_estimate`` says per sample which rule decided.

    What any rule could reach there: no stopping rule returns every sample within tol in fewer
    steps than the first step after which all of them are (Picard 94, its value being one step
    further, so plain iteration's 95 evaluations; Anderson 82; Broyden 73). Run for exactly those
    steps, deqlab's loop, judged every step, takes 1.13x, 1.55x and 1.86x the time of plain
    iteration, and the solvers' own steps alone, checked once at the end, 0.98x, 1.36x and 1.76x
    (the same stored run): on a map this cheap to evaluate, an accelerated solver's own work per
    step outweighs the steps it saves, whatever its stopping rule. Of deqlab's configurations that
    deliver tol there, ``Picard(stop="error", check_every="auto")`` is the fastest (1.40x;
    optimistix's ``FixedPointIteration`` takes 1.16x).

Checks every k steps (``check_every``)
    Judging a step (norms, selections, statistics) costs a fraction of an evaluation of a
    typical f on the batch. With ``check_every=k`` the loop takes k - 1 bare steps and judges the k-th: a sample
    stops at most k - 1 steps after it could have, and steps, trace rows and failures are counted
    at judged steps (a non-finite iterate inside a chunk is rejected at its end). ``unrolled``
    solves judge every step.

    ``check_every="auto"`` chooses the runs of bare steps as it goes. At each judged step every
    active sample's measure (its error estimate, or its relative residual where the residual
    rule decides) has fallen by some factor r per step since the last judged step; at that rate
    it meets ``tol`` after log(tol / measure) / log(r) more steps. f is evaluated on the whole
    batch until its slowest sample stops, so the next run is the largest of these predictions:
    the slowest sample is judged where it is predicted to meet ``tol``, and a faster one later
    than it could have been (its count of steps says so; its value, the later iterate, is no
    worse on a contraction). Samples without such a prediction (a measure that did not fall, is
    not finite, or switched between residual and error estimate) do not set the run; if no
    sample has one, the next run is 1 step. A run is at most twice the previous one (the first is
    1 step), at most ``AUTO_MAX_SPAN`` (16) steps, and never passes ``max_steps``, so a prediction
    that is too long costs at most 15 extra steps. Where the measure falls steadily (Picard on a
    contraction) a sample is judged at most 15 steps late; an accelerated solver's measure can
    rise between judged steps, and such a sample runs on until it meets ``tol`` again.
    Measured by ``benchmarks/stopping.py`` (tanh DEQ, N = 384, batch 96, float32, tol 1e-5;
    time relative to plain iteration for the fewest steps that reach the accuracy;
    ``benchmarks/results/stopping_quick.txt``): Picard's error rule, which delivers tol,
    1.52x -> 1.40x (its slowest sample takes 135 steps instead of 123); the residual rules, which
    do not deliver tol (errors 5.3e-5 and 1.7e-4), Picard's 1.01x -> 0.91x and Anderson's
    1.17x -> 1.07x; Broyden's error rule is slower with it (2.01x -> 2.38x: its slowest sample
    takes 96 steps instead of 82).

Batches
    With ``batch_axis=k`` the k-th axis of every leaf indexes independent samples. Each sample is
    judged on its own (the batch is not judged by its worst member): a sample that has converged,
    diverged or produced a non-finite value is frozen, its statistics stop, and the loop ends when
    no sample is active or ``max_steps`` is reached. ``f`` is always evaluated on the whole batch,
    so it must act on samples independently (as any batched network layer does).

Failure is reported, never hidden
    ``Result.DIVERGED`` when the absolute residual grows by ``divergence_factor`` over the best one
    seen; ``Result.NONFINITE`` when ``f`` returns NaN or inf (the non-finite iterate is never
    accepted); ``Result.MAX_STEPS_REACHED`` otherwise. A converged sample returns the iterate that
    met ``tol``; :class:`Picard` returns one step further, ``z + damping (f(z) - z)`` from that
    iterate: ``f(z)`` was evaluated to check convergence, and where the damped map contracts
    (which is when Picard converges) that step is closer to the fixed point at no cost. The
    statistics describe the iterate the step starts from. A sample that failed returns its finite
    iterate closest to convergence, the one with the smallest absolute residual
    ``||f(z) - z||`` (the relative residual would prefer a diverging iterate: for f = 2z + 1 it
    falls towards 1/2 as z runs off), with its result code.
    What a failed sample does beyond its result code is the call's ``on_failure`` policy
    (``"warn"``, ``"raise"``, ``"nan"`` or ``"ignore"``; :mod:`deqlab.failures`).
"""

# Measured on linear maps of known spectral norm (rates 0.5 ... 0.995, rotating and symmetric
# spectra), the error delivered by stop="error" was at most 1.25 times the unscaled estimate, hence
# the default safety 1.5; on rotating spectra the estimate is conservative by up to 30x. Judging a
# step costs about a fifth of a 256-wide tanh layer on the batch (the reason for check_every).
#
# The package is one module per idea: solution.py (what a solve returns), base.py (the Solver
# class and its hooks), picard.py, anderson.py, broyden.py, history.py (their shared buffers),
# flatten.py (pytrees to (B, D) rows and the per-sample norms), loop.py (the shared iteration),
# registry.py (solvers by name), budget.py (per-call traced limits), api.py (solve and the
# problem checks).

from deqlab._eager import UncachedCallWarning
from deqlab.failures import Result as Result  # noqa: F401  (importable from here too)
from deqlab.failures import SolverError as SolverError  # noqa: F401
from deqlab.failures import SolverWarning as SolverWarning  # noqa: F401
from deqlab.solvers import base as _base
from deqlab.solvers import registry as _registry
from deqlab.solvers.adaptive import Adaptive, AdaptiveState, chosen, map_work
from deqlab.solvers.anderson import Anderson
from deqlab.solvers.api import check_problem, solve
from deqlab.solvers.base import RATE_LIMIT as RATE_LIMIT  # noqa: F401
from deqlab.solvers.base import RATE_WINDOW as RATE_WINDOW  # noqa: F401
from deqlab.solvers.base import STOPPING_RULES as STOPPING_RULES  # noqa: F401
from deqlab.solvers.base import Solver
from deqlab.solvers.broyden import Broyden, BroydenState
from deqlab.solvers.budget import Budget, make_budget
from deqlab.solvers.flatten import relative_residual
from deqlab.solvers.loop import batched_hooks
from deqlab.solvers.picard import Picard
from deqlab.solvers.registry import get_solver
from deqlab.solvers.solution import Solution, SolverState, SolveStats, raise_if_failed

#: The forward solvers by name: ``"adaptive"`` (the default), ``"picard"``, ``"anderson"``,
#: ``"broyden"`` (each name is a shortcut for the solver with its defaults).
#:
#: :meta hide-value:
SOLVERS = _registry.SOLVERS
#: How ``stop="error"`` estimates the contraction rate q (see :attr:`Solver.rate_estimate`).
RATE_ESTIMATES = _base.RATE_ESTIMATES

# Result, SolverError and SolverWarning live in deqlab.failures (documented there) and are
# importable from here too; STOPPING_RULES, RATE_LIMIT and RATE_WINDOW are module constants
# (deqlab.solvers.base).
__all__ = [
    "SolveStats",
    "SolverState",
    "Solution",
    "check_problem",
    "raise_if_failed",
    "Solver",
    "batched_hooks",
    "RATE_ESTIMATES",
    "Adaptive",
    "AdaptiveState",
    "chosen",
    "map_work",
    "Picard",
    "Anderson",
    "Broyden",
    "BroydenState",
    "SOLVERS",
    "get_solver",
    "solve",
    "relative_residual",
    "Budget",
    "make_budget",
    "UncachedCallWarning",
]
