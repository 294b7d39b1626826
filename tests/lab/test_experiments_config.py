import sys
import types

import numpy as np
import pytest

from deqlab.lab.experiments import SCALE_ENV, get_scale, pick


def test_env_var_name():
    assert SCALE_ENV == "DEQLAB_SCALE"


def test_default_is_quick(monkeypatch):
    monkeypatch.delenv(SCALE_ENV, raising=False)
    assert get_scale() == "quick"
    assert pick(quick=1, full=2) == 1


@pytest.mark.parametrize("raw", ["", "  "])
def test_empty_means_quick(monkeypatch, raw):
    monkeypatch.setenv(SCALE_ENV, raw)
    assert get_scale() == "quick"


@pytest.mark.parametrize(
    ("raw", "expected"), [("quick", "quick"), ("full", "full"), (" FULL ", "full"), ("Quick", "quick"),
                          ("medium", "medium"), (" Medium", "medium")]
)
def test_valid_values(monkeypatch, raw, expected):
    monkeypatch.setenv(SCALE_ENV, raw)
    assert get_scale() == expected


def test_pick_full(monkeypatch):
    monkeypatch.setenv(SCALE_ENV, "full")
    sentinel = object()
    assert pick(quick=None, full=sentinel) is sentinel


def test_pick_medium(monkeypatch):
    monkeypatch.setenv(SCALE_ENV, "medium")
    assert pick(quick=3, medium=16, full=8) == 16
    # without a medium size, an experiment keeps its quick one (never the full one)
    assert pick(quick=3, full=8) == 3
    assert pick(quick=3, medium=None, full=8) is None


def test_pick_is_read_at_call_time(monkeypatch):
    monkeypatch.setenv(SCALE_ENV, "quick")
    assert pick(quick="q", full="f") == "q"
    monkeypatch.setenv(SCALE_ENV, "full")
    assert pick(quick="q", full="f") == "f"


@pytest.mark.parametrize("raw", ["fast", "mediumm", "1"])  # "quick,full": tests/library/test_probe.py (scale-both)
def test_invalid_value_names_variable_and_choices(monkeypatch, raw):
    monkeypatch.setenv(SCALE_ENV, raw)
    with pytest.raises(ValueError) as err:
        get_scale()
    msg = str(err.value)
    assert "DEQLAB_SCALE" in msg and "'quick'" in msg and "'full'" in msg and repr(raw) in msg
    with pytest.raises(ValueError):
        pick(quick=1, full=2)


def test_pick_is_keyword_only():
    with pytest.raises(TypeError):
        pick(1, 2)  # type: ignore[misc]


def test_plain_number_turns_array_scalars_into_python_numbers():
    import jax.numpy as jnp
    import numpy as np

    from deqlab.lab.experiments import plain_number

    cases = [(np.float64(0.25), float, 0.25), (np.int64(7), int, 7), (np.bool_(True), bool, True),
             (np.array(1.5), float, 1.5), (jnp.asarray(2.5, jnp.float32), float, 2.5),
             (np.float32(0.5), float, 0.5)]
    for value, kind, expected in cases:
        out = plain_number(value)
        assert type(out) is kind and out == expected, (value, out)
        assert format(out, "") == format(expected, "")  # e.g. '0.25', not 'np.float64(0.25)'
    for unchanged in ("text", 3, 0.5, [np.float64(1.0)], np.zeros(3)):
        assert plain_number(unchanged) is unchanged


def _block_myst_nb(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "myst_nb" or name.startswith("myst_nb."):
            raise ImportError("No module named 'myst_nb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


def test_glue_without_myst_nb_prints_the_value_instead_of_failing(monkeypatch, capsys):
    # Colab, plain Jupyter, Kaggle: deqlab is installed without the book extra.
    from deqlab.lab.experiments import config

    monkeypatch.delenv(config.BOOK_BUILD_ENV, raising=False)
    _block_myst_nb(monkeypatch)
    config.glue("ch9p9_radius", np.float64(0.25))
    assert capsys.readouterr().out == "ch9p9_radius = 0.25\n"


def _capture_display(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kwargs: shown.append((objs, kwargs)))
    return shown


def test_glue_echo_is_silent_in_the_book_build_and_stores_the_record(monkeypatch, capsys):
    # A stand-in myst_nb module: the test runs the same with or without the book extra installed.
    from deqlab.lab.experiments import config

    monkeypatch.setitem(sys.modules, "myst_nb", types.ModuleType("myst_nb"))
    monkeypatch.setenv(config.BOOK_BUILD_ENV, "1")
    shown = _capture_display(monkeypatch)
    config.glue("ch9p9_n", np.int64(64))
    ((bundle,), kwargs), = shown
    assert bundle == {"application/papermill.record/text/plain": "64"}  # a plain int, stored, not shown
    assert kwargs == {"raw": True, "metadata": {"scrapbook": {"name": "ch9p9_n",
                                                               "mime_prefix": "application/papermill.record/"}}}
    assert capsys.readouterr().out == ""


def test_glue_record_is_the_record_myst_nb_glue_writes(monkeypatch):
    # deqlab's glue writes myst-nb's record itself (importing myst_nb.ext.glue costs every kernel 1.9 s: see
    # config._glue_record); this holds it to the installed myst-nb's, for the kinds of value the pages glue
    myst_glue = pytest.importorskip("myst_nb.ext.glue",
                                    reason="myst-nb (deqlab's book extra) is not installed; the floor environment of "
                                           ".ci/run, like Colab, has none, and CI's main test phase runs this check")
    from deqlab.lab.experiments import config

    shown = _capture_display(monkeypatch)
    monkeypatch.setattr(myst_glue, "ipy_display", lambda *objs, **kwargs: shown.append((objs, kwargs)))
    for value, display in [(0.25, False), (64, False), ("rising", False), ([1, 2.5], False), (0.5, True)]:
        config._glue_record("ch9p9_v", value, display=display)
        myst_glue.glue("ch9p9_v", value, display=display)
        assert shown[-2] == shown[-1], (value, display, shown[-2:])
    assert len(shown) == 10


def test_glue_echo_shortens_long_values(monkeypatch, capsys):
    from deqlab.lab.experiments import config

    monkeypatch.delenv(config.BOOK_BUILD_ENV, raising=False)
    _block_myst_nb(monkeypatch)
    config.glue("ch9p9_text", "word " * 100)
    out = capsys.readouterr().out.strip()
    assert out.startswith("ch9p9_text = 'word word") and out.endswith("...")
    assert len(out) < 140
