"""Moved in deqlab 0.6: the book's code is in :mod:`deqlab.lab` (``pip install "deqlab[lab]"``)."""

raise ImportError(
    "deqlab.exercises moved to deqlab.lab.exercises in deqlab 0.6 (the book's code is apart from the library): "
    "import deqlab.lab.exercises, or 'from deqlab.lab import exercises'; it needs the lab extra, "
    "pip install \"deqlab[lab]\"."
)
