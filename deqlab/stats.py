"""Moved in deqlab 0.6: the book's code is in :mod:`deqlab.lab` (``pip install "deqlab[lab]"``)."""

raise ImportError(
    "deqlab.stats moved to deqlab.lab.stats in deqlab 0.6 (the book's code is apart from the library): "
    "import deqlab.lab.stats, or 'from deqlab.lab import stats'; it needs the lab extra, "
    "pip install \"deqlab[lab]\"."
)
