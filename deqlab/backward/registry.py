"""The backward modes by name, and :func:`get_backward`."""

from __future__ import annotations

from typing import Any

from deqlab.backward.base import Backward
from deqlab.backward.implicit import Implicit
from deqlab.backward.phantom import JacobianFree, Phantom
from deqlab.backward.shine import SHINE
from deqlab.backward.unrolled import Unrolled

__all__ = ["BACKWARDS", "get_backward"]


#: The backward modes by name (each name is a shortcut for the object with its defaults).
BACKWARDS = {cls.name: cls for cls in (Implicit, Unrolled, Phantom, JacobianFree, SHINE)}


def get_backward(backward: Any) -> Backward:
    """A backward object from a name (its defaults) or an object (unchanged).

    Args:
        backward: a name of :data:`BACKWARDS` (``"implicit"``, ``"unrolled"``, ``"phantom"``,
            ``"jacobian_free"``, ``"shine"``) or an instance of a :class:`Backward` subclass.

    Returns:
        A :class:`Backward`.

    Raises:
        ValueError: an unknown name or a value that is not a backward mode (the message lists
            the names).

    Example:
        >>> from deqlab.backward import Phantom, get_backward
        >>> get_backward("phantom") == Phantom()
        True
    """
    if isinstance(backward, Backward):
        return backward
    if isinstance(backward, str) and backward in BACKWARDS:
        return BACKWARDS[backward]()
    raise ValueError(
        f"`backward` must be one of {list(BACKWARDS)} or an object such as "
        f"deqlab.backward.Implicit(solver='gmres') (an instance of a deqlab.backward.Backward "
        f"subclass), got {backward!r}."
    )

