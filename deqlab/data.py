"""Moved in deqlab 0.6: the book's code is in :mod:`deqlab.lab` (``pip install "deqlab[lab]"``)."""

raise ImportError(
    "deqlab.data moved to deqlab.lab.data in deqlab 0.6 (the book's code is apart from the library): "
    "import deqlab.lab.data, or 'from deqlab.lab import data'; it needs the lab extra, "
    "pip install \"deqlab[lab]\"."
)
