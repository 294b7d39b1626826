"""Flattening a (possibly batched) pytree into a ``(B, D)`` matrix, and the per-sample norms
every solver is judged by."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import precision as precision_module

__all__ = ["Flattener", "row_norm", "relative_residual"]


class Flattener:
    """Maps a pytree whose leaves share a batch axis to a ``(B, D)`` array and back.

    The solvers work on such rows: sample b is row b, its D numbers the entries of all its
    leaves in order. Leaves are cast to their common dtype on the way in and back to their own
    dtypes on the way out.

    Args:
        tree: the pytree whose structure, shapes and dtypes are recorded (real floating arrays).
        batch_axis: the axis of every leaf that indexes samples, or None (one sample, B = 1).
        name: the argument the pytree came from, for error messages.

    Attributes:
        batch: B, the number of samples.
        dim: D, the numbers per sample.
        dtype: the common dtype of the leaves.

    Raises:
        ValueError: an empty tree, a leaf that is not a real floating array, a ``batch_axis``
            that is not an axis of every leaf, leaves that disagree on the batch size, or no
            number per sample.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers.flatten import Flattener
        >>> tree = {"a": jnp.zeros((4, 2)), "b": jnp.ones((4, 3))}
        >>> flat = Flattener(tree, batch_axis=0)
        >>> flat.batch, flat.dim
        (4, 5)
        >>> rows = flat.flatten(tree)
        >>> rows.shape, rows[0].tolist()
        ((4, 5), [0.0, 0.0, 1.0, 1.0, 1.0])
        >>> flat.unflatten(rows)["b"].shape
        (4, 3)
    """

    def __init__(self, tree, batch_axis, name="z0"):
        leaves, self.treedef = jax.tree_util.tree_flatten(tree)
        if not leaves:
            raise ValueError(f"`{name}` must contain at least one array.")
        for leaf in leaves:
            if not hasattr(leaf, "dtype") or not hasattr(leaf, "shape"):
                raise ValueError(
                    f"`{name}` must be an array or a pytree of arrays, got a leaf of type "
                    f"{type(leaf).__name__} ({leaf!r}); convert it with jnp.asarray."
                )
            if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
                raise ValueError(
                    f"`{name}` must hold real floating-point arrays, got dtype {jnp.result_type(leaf)}."
                )
        self.dtype = jnp.result_type(*leaves)
        self.batch_axis = batch_axis
        self.shapes = [jnp.shape(leaf) for leaf in leaves]
        self.dtypes = [jnp.result_type(leaf) for leaf in leaves]
        if batch_axis is None:
            self.batch = 1
        else:
            sizes = set()
            for shape in self.shapes:
                if not -len(shape) <= batch_axis < len(shape):
                    raise ValueError(
                        f"`batch_axis` must index an axis of every leaf of {name} (ndim "
                        f"{len(shape)}, so -{len(shape)} <= batch_axis < {len(shape)}), got "
                        f"{batch_axis}."
                    )
                sizes.add(shape[batch_axis])
            if len(sizes) != 1:
                raise ValueError(
                    f"`{name}` leaves disagree on the size of batch axis {batch_axis}: {sorted(sizes)}."
                )
            self.batch = sizes.pop()
        moved = [self._moved_shape(s) for s in self.shapes]
        self.sizes = [int(np.prod(s[1:], dtype=np.int64)) for s in moved]
        self.dim = int(sum(self.sizes))
        if self.dim == 0 or self.batch == 0:
            raise ValueError(
                f"`{name}` must hold at least one number per sample, got leaves of shapes {self.shapes}"
                + ("" if batch_axis is None else f" with batch_axis={batch_axis}") + "."
            )

    def _moved_shape(self, shape):
        if self.batch_axis is None:
            return (1,) + tuple(shape)
        axis = self.batch_axis % len(shape)
        return (shape[axis],) + tuple(s for i, s in enumerate(shape) if i != axis)

    def flatten(self, tree):
        """The ``(B, D)`` rows of a pytree with the recorded structure.

        Args:
            tree: a pytree with the structure and leaf shapes of the one recorded.

        Returns:
            Shape ``(B, D)``, the common dtype; row b holds sample b's entries, leaf by leaf.
        """
        leaves = jax.tree_util.tree_leaves(tree)
        cols = []
        for leaf in leaves:
            leaf = jnp.asarray(leaf, self.dtype)
            if self.batch_axis is None:
                cols.append(leaf.reshape(1, -1))
            else:
                cols.append(jnp.moveaxis(leaf, self.batch_axis, 0).reshape(self.batch, -1))
        return jnp.concatenate(cols, axis=1)

    def unflatten(self, flat):
        """The pytree of ``(B, D)`` rows: the inverse of :meth:`flatten`.

        Args:
            flat: shape ``(B, D)``.

        Returns:
            A pytree with the recorded structure, leaf shapes and leaf dtypes.
        """
        leaves, start = [], 0
        for shape, size, dtype in zip(self.shapes, self.sizes, self.dtypes):
            block = flat[:, start : start + size]
            start += size
            moved = self._moved_shape(shape)
            block = block.reshape(moved)
            if self.batch_axis is None:
                leaf = block[0]
            else:
                leaf = jnp.moveaxis(block, 0, self.batch_axis % len(shape))
            leaves.append(leaf.astype(dtype))
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def per_sample(self, x):
        """Drop the batch axis of per-sample statistics when the problem has none.

        Args:
            x: per-sample values, batch last (shape ``(..., B)``).

        Returns:
            ``x`` without its last axis when ``batch_axis`` is None (then B = 1), else ``x``.
        """
        return x[..., 0] if self.batch_axis is None else x


def relative_residual(fz: jax.Array, z: jax.Array) -> jax.Array:
    """Relative residual of each row (the last axis) of ``(B, D)`` or ``(D,)`` arrays, the
    tolerance rule of every solver.

    ``||f(z) - z|| / (||f(z)|| + eps sqrt(D))`` per row (:mod:`deqlab.solvers`), accumulated in at
    least float32 and never differentiated (it only decides).

    Args:
        fz: ``f(z)``, shape ``(B, D)`` (or one ``(D,)`` row).
        z: the iterates, the same shape.

    Returns:
        Shape ``(B,)`` (a scalar for one row), in at least float32.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers import relative_residual
        >>> fz = jnp.array([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
        >>> z = jnp.array([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.98]])
        >>> [f"{r:.3f}" for r in relative_residual(fz, z).tolist()]   # far from f(z); near it
        ['1.000', '0.010']
    """
    fz, z = jax.lax.stop_gradient((fz, z))
    eps = jnp.finfo(z.dtype).eps
    scale = row_norm(fz) + eps * math.sqrt(z.shape[-1])
    return row_norm(fz - z) / scale



def row_norm(x: jax.Array) -> jax.Array:
    """2-norm of each row (the last axis) of an array, accumulated in at least float32: the
    per-sample norm of every solver and of the loop.

    Args:
        x: shape ``(..., D)``: ``(B, D)`` rows in the loop, one ``(D,)`` row in a solver's hooks;
            any floating dtype.

    Returns:
        Shape ``(...)`` (``(B,)`` or a scalar), in the working dtype of ``x`` (float32 for 16-bit
        inputs).

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers.flatten import row_norm
        >>> row_norm(jnp.array([[3.0, 4.0], [0.0, 1.0]], jnp.float16)).tolist()
        [5.0, 1.0]
    """
    work = precision_module.working_dtype(x.dtype)
    return jnp.sqrt(jnp.sum(jnp.square(x.astype(work)), axis=-1))


