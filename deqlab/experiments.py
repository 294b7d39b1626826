"""Moved in deqlab 0.6: the book's code is in :mod:`deqlab.lab` (``pip install "deqlab[lab]"``)."""

raise ImportError(
    "deqlab.experiments moved to deqlab.lab.experiments in deqlab 0.6 (the book's code is apart from the library): "
    "import deqlab.lab.experiments, or 'from deqlab.lab import experiments'; it needs the lab extra, "
    "pip install \"deqlab[lab]\"."
)
