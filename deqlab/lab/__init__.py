"""The book's own code: what the pages of *Equilibrium* run, apart from the library.

* ``deqlab.lab.experiments``: the experiment drivers of every chapter, the scale setting
  (``DEQLAB_SCALE``: :func:`~deqlab.lab.experiments.config.pick`), ``glue``, tables, the interactive
  explorers and the resumable sweep runner with its checkpoints;
* :mod:`deqlab.lab.exercises`: the graders of the exercises;
* :mod:`deqlab.lab.data`: datasets (each with an offline default) and tokenizers;
* :mod:`deqlab.lab.stats`: the statistics behind the pages' verdicts.

It needs the ``lab`` extra (``pip install "deqlab[lab]"``: matplotlib, tqdm, orbax-checkpoint,
scikit-learn, pillow, sentencepiece). It imports the library (:mod:`deqlab`, :mod:`deqlab.nn`,
:mod:`deqlab.theory`); the library never imports it, and ``import deqlab`` does not load it.
"""

import importlib.util as _util

_MISSING = [package for module, package in (("matplotlib", "matplotlib"), ("tqdm", "tqdm"),
                                             ("orbax.checkpoint", "orbax-checkpoint"),
                                             ("sklearn", "scikit-learn"), ("PIL", "pillow"),
                                             ("sentencepiece", "sentencepiece"))
            if _util.find_spec(module.split(".")[0]) is None]
if _MISSING:
    raise ImportError(f"deqlab.lab (the book's code) needs the lab extra, missing here: {', '.join(_MISSING)}; "
                      'install it with pip install "deqlab[lab]"')
