"""Benchmark harness of deqlab against its peers (issue "[2/8] Performance").

Each module is a script, run from the repository root::

    python -m benchmarks.forward   [--size tiny|quick|full]   # time to accuracy of the forward solve
    python -m benchmarks.gradient  [--size ...]               # forward + implicit gradient
    python -m benchmarks.memory    [--size ...]               # compiled memory of a training step
    python -m benchmarks.scaling   [--size ...]               # wall time and NFE against N and batch

Each prints its tables and a final ``HEADLINE ...`` line. The peers (jaxopt, optimistix, lineax)
are optional: ``pip install -e ".[peers]"``; a missing one is skipped with a printed note.
See ``benchmarks/README.md`` for the methodology.
"""
