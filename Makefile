# Set-up, tests and book build for deqlab / *Equilibrium*. On a fresh clone, with only Python 3.11+
# and pip:
#
#   make book   # create .venv, install deqlab[book,test], build the book (executing notebooks)
#   make test   # create .venv if needed, run the quick tier of the unit tests + every notebook under book/
#               # (make test TIER=all: every unit test, slow ones included, as CI runs it)
#   make unit   # quick unit tests (not slow: see tests/slow.json; ~2 min on 2 cores cold, 1.5 warm), no notebooks
#   make lint   # ruff check . (configuration in pyproject.toml; CI fails on findings)
#   make student-edition  # the notebooks without solutions, reader's code stubbed, into _build/student
#   make colab-edition    # the executed notebooks with MyST rendered as Markdown, into _build/colab
#   make pdf    # the whole book as one PDF, _build/pdf/equilibrium.pdf (needs TeX: TEX_APT below)
#
# Variables: PYTHON (interpreter used to create the venv, default python3), VENV (default .venv;
# point it at an existing environment with `make test VENV=/path/to/venv`), JOBS (pytest-xdist
# workers, default 2), TIER (quick or all: the unit tests `make test` runs, default quick).
# DEQLAB_SCALE (quick|medium|full, default quick) is passed through to notebooks.

PYTHON ?= python3
VENV ?= .venv
JOBS ?= 2
BIN := $(VENV)/bin
NB_TIMEOUT ?= 900

# Persistent JAX compilation cache shared by tests, nbmake and the book build (absolute path:
# notebooks run with their own folder as working directory).
export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/.jax_cache
# Persist every compilation, not only those over 1 s (JAX's default): most of the book's programs
# compile in well under a second and notebooks and tests compile the same small programs again and
# again. Measured (issue 17, four notebooks): all 369 compilations hit on a warm re-run against 38
# at the default, about half the time for ch0 p1; neutral on a cold run; 2.7 MB of cache.
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS ?= 0
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES ?= -1
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Python's bytecode and pytest's rewritten test modules are cached in __pycache__ (git-ignored;
# `make clean` removes them). An environment that turns writing them off (PYTHONDONTWRITEBYTECODE,
# set on the 2-core machine) makes every worker of every pass parse and rewrite the ~200 test
# modules' asserts again: the start-up and collection of `make unit`'s two passes took 13.8 + 10.2 s
# without the cache and 7.2 + 5.9 s with it (issue 39, 2-core machine, warm compilation cache).
unexport PYTHONDONTWRITEBYTECODE

STAMP := $(VENV)/.deqlab-installed
BLAS1 := OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

.PHONY: install test unit unit-all test-profile lint book pdf tex-check site-check student-edition instructor-key colab-edition clean distclean strip dry-runs power-analysis medium help

help:
	@echo "make install  create $(VENV) and install deqlab[book,test] (editable)"
	@echo "make test     the quick tier of the unit tests (not slow) + every notebook in book/ (outputs written back);"
	@echo "              make test TIER=all: every unit test, slow ones included (what CI runs)"
	@echo "make unit     quick unit tests: tests/ without the slow ones (about 2 min cold, 1.5 warm)"
	@echo "make unit-all all unit tests in tests/, slow ones included (no notebooks)"
	@echo "make test-profile  every unit test on an empty compilation cache; the programs each compiles,"
	@echo "              top 20 tests and files by compile work (tests/compile_counter.py)"
	@echo "make lint     ruff check . (rules in pyproject.toml [tool.ruff])"
	@echo "make book     build the book into _build/html (-W -n --keep-going)"
	@echo "make pdf      the whole book as one PDF, _build/pdf/equilibrium.pdf (XeLaTeX; needs: apt-get"
	@echo "              install --no-install-recommends $(TEX_APT))"
	@echo "make tex-check  say whether the TeX that make pdf needs is installed (and how to get it)"
	@echo "make site-check  open every page of _build/html in headless Chromium (needs: apt-get install"
	@echo "              chromium chromium-driver); screenshots into _build/screenshots"
	@echo "make student-edition  the notebooks for students into $(STUDENT): solutions removed, the reader's"
	@echo "              code stubbed (raise NotImplementedError), graders kept (.ci/student_edition.py)"
	@echo "make instructor-key  the graders' model answers into $(KEY) (python -m deqlab.lab.exercises.grade grades)"
	@echo "make colab-edition  after make book: the executed notebooks for Colab into $(COLAB), glue values,"
	@echo "              references and admonitions written out as Markdown (.ci/colab_edition.py)"
	@echo "make strip    remove outputs from notebooks (run before committing)"
	@echo "make dry-runs compile each full-scale training step on the CPU; rewrite book/_data/dry_runs.json"
	@echo "make medium EXPERIMENT=ch3p6  run one medium-scale experiment; store it in deqlab/lab/medium_results/"
	@echo "make power-analysis run the pages' quick experiments; seeds needed per claim -> book/_data/power_analysis.json"
	@echo "make clean    remove build outputs; make distclean also removes virtual envs"

install: $(STAMP)

# Re-install when the package metadata or the pinned documentation toolchain changes. The venv is
# only created if it does not exist. The Sphinx stack is pinned (.ci/docs-constraints.txt says why).
DOCS_CONSTRAINTS := .ci/docs-constraints.txt
$(STAMP): pyproject.toml $(DOCS_CONSTRAINTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[book,test]" -c $(DOCS_CONSTRAINTS)
	@touch $@

# The quick tier of the unit tests (those `make unit` runs: not marked slow) and nbmake over every
# notebook in book/: the README's test command (issue 39's decision). TIER=all selects every unit
# test instead, slow ones included, in the same session as the notebooks: CI runs it so, one
# target for every test (a second target for the slow tier, run after `make test`, measured no
# faster in CI: 930 + 487 s on 8cf23de against 1,480 s in one session on 7875bf0 and 1,301 s on
# fbbee20, a spread run-to-run noise covers). --overwrite writes the executed notebooks
# back, so a following `make book` renders them without executing them again. Outputs stay in the
# working tree: run `make strip` before committing (tests/book/test_notebooks_clean.py checks git).
# One BLAS thread per pytest worker: with JOBS workers on as many cores, multithreaded OpenBLAS
# oversubscribes the CPU and NumPy's QR / eigvals slow down by orders of magnitude (measured on the
# 2-core CI machine). XLA keeps its own thread pool.
# Two passes, so that no worker process switches JAX's x64 mode: the float32 tests and every
# notebook, then the tests marked float64 with x64 on from the start (tests/conftest.py). A worker
# that compiled float64 programs between float32 ones segfaulted in XLA's CPU compiler (jaxlib
# 0.7.2 twice at the same test, and once on 0.10.2); the floor phase of .ci/run runs the same way.
# The float64 pass collects no notebook, so it runs without nbmake's plugin (-p no:nbmake): loading
# it imports nbformat and jsonschema, whose optional rfc3987_syntax builds 39 grammars on import,
# 1.7 s in each worker (measured: the warm float64 pass of `make unit` 40 s -> 35 s); and it imports
# only the test files that hold float64 tests (tests/conftest.py). `make unit` and `make unit-all`
# run no notebook in either pass, so neither loads it (the warm float32 pass: 62.7 and 58.5 s ->
# 59.3 and 55.8 s, interleaved); a test that writes a notebook imports nbformat itself.
# DEQLAB_BOOK_BUILD=1: these outputs are what the site renders, so glue() does not echo its values
# (the echo is for readers of the notebook in Jupyter or Colab). Afterwards every notebook that ran
# without error is stamped with a fingerprint of its code, deqlab and the scale
# (book/_ext/executed_notebooks.py): `make book` renders stored outputs only with a matching stamp.
NOTEBOOKS = $(shell find book -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' | sort)

# The execution report of the book (book/execution.md, book/_ext/execution_report.py) is made from
# this run: pytest's JUnit XML (a time and status per notebook) and run.json (scale, start, workers,
# and the programs JAX's persistent compilation cache held at the start: a page's programs compiled
# by an earlier run are loaded, not compiled, and its glued times are shorter).
REPORTS := _build/reports
TIER ?= quick
ifeq ($(TIER),quick)
TEST_SELECTION := not slow and not float64
TEST_SELECTION_64 := float64 and not slow
else ifeq ($(TIER),all)
TEST_SELECTION := not float64
TEST_SELECTION_64 := float64
else
$(error TIER must be quick (the unit tests not marked slow, the default) or all (every unit test), got '$(TIER)')
endif
test: install
	@mkdir -p $(REPORTS)
	@printf '{"scale": "%s", "started": "%s", "workers": %s, "deqlab": "%s", "compilation_cache_entries": %s}\n' "$${DEQLAB_SCALE:-quick}" \
	  "$$(date -u +'%Y-%m-%d %H:%M UTC')" "$(JOBS)" "$$($(BIN)/python -c 'import deqlab; print(deqlab.__version__)')" \
	  "$$(find "$$JAX_COMPILATION_CACHE_DIR" -type f 2>/dev/null | wc -l)" > $(REPORTS)/run.json
	DEQLAB_BOOK_BUILD=1 $(BLAS1) $(BIN)/python -m pytest -n $(JOBS) --dist worksteal tests book -m "$(TEST_SELECTION)" --nbmake --nbmake-timeout=$(NB_TIMEOUT) --overwrite --durations=25 --junitxml=$(REPORTS)/tests.xml; \
	status=$$?; $(BIN)/python book/_ext/executed_notebooks.py stamp $(NOTEBOOKS) > /dev/null; \
	JAX_ENABLE_X64=1 $(BLAS1) $(BIN)/python -m pytest -n $(JOBS) --dist worksteal -p no:nbmake tests -m "$(TEST_SELECTION_64)" --durations=15 --junitxml=$(REPORTS)/tests-float64.xml; \
	status64=$$?; test $$status -eq 0 && test $$status64 -eq 0

# The quick inner loop: tests marked slow are deselected, those marked in their files and those
# that took 3 s or more in the last measured `make test TIER=all` or 0.4 s or more in a warm `make
# unit` (tests/slow.json, generated by .ci/test_durations.py; tests/conftest.py adds the mark).
# `make test TIER=all` (and so CI) and `make unit-all` run every test. Both run in the two passes of `make test`, so that no worker
# switches JAX's x64 mode (see above).
unit: install
	$(BLAS1) $(BIN)/python -m pytest -n $(JOBS) --dist worksteal -p no:nbmake tests -m "not slow and not float64" --durations=10; \
	status=$$?; \
	JAX_ENABLE_X64=1 $(BLAS1) $(BIN)/python -m pytest -n $(JOBS) --dist worksteal -p no:nbmake tests -m "float64 and not slow" --durations=5; \
	status64=$$?; test $$status -eq 0 && test $$status64 -eq 0

unit-all: install
	$(BLAS1) $(BIN)/python -m pytest -n $(JOBS) --dist worksteal -p no:nbmake tests -m "not float64" --durations=25; \
	status=$$?; \
	JAX_ENABLE_X64=1 $(BLAS1) $(BIN)/python -m pytest -n $(JOBS) --dist worksteal -p no:nbmake tests -m float64 --durations=15; \
	status64=$$?; test $$status -eq 0 && test $$status64 -eq 0

# Where the unit tests' compile work goes (issue 39): every unit test, both precisions, on an empty
# compilation cache (so that every program counts as compiled), each test's programs and seconds
# appended to $(REPORTS)/compiles.jsonl by tests/compile_counter.py; then the totals and the top 20
# tests and files (.ci/test_profile.py).
PROFILE_CACHE := $(CURDIR)/_build/profile-jax-cache
test-profile: install
	@mkdir -p $(REPORTS)
	rm -rf $(PROFILE_CACHE) $(REPORTS)/compiles.jsonl
	export JAX_COMPILATION_CACHE_DIR=$(PROFILE_CACHE) DEQLAB_COMPILE_REPORT=$(CURDIR)/$(REPORTS)/compiles.jsonl; \
	$(BLAS1) $(BIN)/python -m pytest -n $(JOBS) --dist worksteal -p no:nbmake tests -m "not float64" -q; \
	JAX_ENABLE_X64=1 $(BLAS1) $(BIN)/python -m pytest -n $(JOBS) --dist worksteal -p no:nbmake tests -m float64 -q; \
	$(BIN)/python .ci/test_profile.py $(REPORTS)/compiles.jsonl

lint: install
	$(BIN)/ruff check .

# `execute_notebooks: auto` + book/_ext/executed_notebooks.py: notebooks executed by `make test`
# from the current sources are not executed again, stale ones are; on a fresh clone every notebook
# is executed once.
book: install
	DEQLAB_BOOK_BUILD=1 $(BIN)/jupyter-book build . -W -n --keep-going

# The whole book as one PDF: Sphinx's LaTeX builder (XeLaTeX via sphinx-jupyterbook-latex; the
# `latex:` section and latex_* settings of _config.yml, book/_ext/latex_pdf.py), then latexmk in
# _build/latex. Like `make book` it renders the notebooks `make test` executed and executes stale
# ones. The PDF is copied to _build/pdf/equilibrium.pdf (a CI artefact). TeX comes from the OS
# packages in TEX_APT (Debian 12: a 112 MB download, 353 MB installed; .ci/run installs them);
# without them `make pdf` stops at tex-check with the apt command instead of a LaTeX traceback.
# LaTeX runs non-interactively and stops at the first error, whose lines are printed from the log.
TEX_APT := latexmk texlive-xetex texlive-latex-extra texlive-fonts-recommended fonts-freefont-otf
# what those packages provide that the build uses: programs, LaTeX packages, the FreeFont fonts
TEX_PROGRAMS := xelatex latexmk makeindex kpsewhich
TEX_STYLES := ucharclasses.sty unicode-math.sty fncychap.sty pgfplots.sty mathtools.sty mathrsfs.sty
TEX_FONTS := FreeSerif.otf FreeSans.otf FreeMono.otf

tex-check:
	@missing=""; \
	for prog in $(TEX_PROGRAMS); do command -v $$prog >/dev/null 2>&1 || missing="$$missing $$prog"; done; \
	if command -v kpsewhich >/dev/null 2>&1; then \
	  for sty in $(TEX_STYLES); do kpsewhich $$sty >/dev/null 2>&1 || missing="$$missing $$sty"; done; fi; \
	for font in $(TEX_FONTS); do \
	  { fc-list 2>/dev/null | grep -q "/$$font:"; } || [ -e /usr/share/fonts/opentype/freefont/$$font ] || missing="$$missing $$font"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make pdf needs TeX, which is not installed (missing:$$missing)."; \
	  echo "Install it with the OS packages (Debian/Ubuntu, as root; a 112 MB download):"; \
	  echo "  apt-get install -y --no-install-recommends $(TEX_APT)"; \
	  exit 1; fi; \
	echo "[pdf] TeX found: $$(xelatex --version | head -n 1)"

pdf: tex-check install
	@rm -f _build/pdf/equilibrium.pdf
	DEQLAB_BOOK_BUILD=1 LATEXOPTS="-interaction=nonstopmode -halt-on-error" \
	  $(BIN)/jupyter-book build . --builder pdflatex -W -n --keep-going \
	  || { echo "[pdf] the build failed; first LaTeX errors of _build/latex/equilibrium.log:"; \
	       grep -A 4 '^!' _build/latex/equilibrium.log 2>/dev/null | head -n 40; exit 1; }
	@mkdir -p _build/pdf && cp _build/latex/equilibrium.pdf _build/pdf/equilibrium.pdf
	@echo "[pdf] _build/pdf/equilibrium.pdf: $$(grep -ho '([0-9]* pages' _build/latex/equilibrium.log | tail -n 1 | tr -d '('), $$(du -h _build/pdf/equilibrium.pdf | cut -f1)"

# The browser test of the built site (.ci/check_site.py): run after `make book`. Uses the system
# chromium and chromedriver (Debian: apt-get install chromium chromium-driver).
site-check: install
	$(BIN)/python .ci/check_site.py _build/html --screenshots _build/screenshots

# The student edition (book/instructors.md): every notebook of book/ with its hidden solutions
# removed and the bodies of its reader-code functions replaced by `raise NotImplementedError`; the
# cells that use them are tagged raises-exception, so the notebook still runs top to bottom and the
# graders report the unfinished exercises. Standard library only: no virtual environment needed.
STUDENT ?= _build/student

student-edition:
	@case "$$(realpath -m $(STUDENT))/" in "$(CURDIR)/" | "$(CURDIR)/book/"*) \
	  echo "make student-edition: STUDENT=$(STUDENT) is the checkout or inside book/; choose another folder" >&2; exit 2;; esac
	rm -rf $(STUDENT)
	$(PYTHON) .ci/student_edition.py --out $(STUDENT)

# The instructor's key: the graders' model answers (deqlab.lab.exercises._key, which the wheel does
# not ship and the API page does not document), printed as one Python file.
KEY ?= _build/instructor_key.py

instructor-key: install
	mkdir -p $(dir $(KEY))
	$(BIN)/python -m deqlab.lab.exercises._key > $(KEY)
	@echo "the instructor's key: $(KEY)"

# The Colab edition (book/contributing.md): every notebook of _toc.yml as the executed build has it
# (_build/jupyter_execute), its MyST prose rendered as plain Markdown: glue values, links to the
# published pages, figure numbers as the site shows them, citations and a reference list,
# admonitions as blockquotes; code cells unchanged. Run after `make book`; a glue value the build
# did not store is an error. The book workflow publishes it on the branch `colab`, which the Colab
# launch buttons open (book/_ext/colab_launch.py).
COLAB ?= _build/colab

colab-edition: install
	rm -rf $(COLAB)
	$(BIN)/python .ci/colab_edition.py --out $(COLAB)

# what a full run needs (devices, memory, hours), from the compiled steps: the pages include it
dry-runs: install
	$(BIN)/python -m deqlab.lab.experiments.dry_run --write book/_data/dry_runs.json

power-analysis: install
	rm -f .power_raw.json
	OPENBLAS_NUM_THREADS=1 $(BIN)/python -m deqlab.lab.experiments.power

# one medium-scale experiment (deqlab.lab.experiments.medium), stored with provenance in deqlab/lab/medium_results/
medium: install
	@test -n "$(EXPERIMENT)" || { echo "make medium: set EXPERIMENT to one of: $$($(BIN)/python -c 'from deqlab.lab.experiments import medium; print(" ".join(sorted(medium.EXPERIMENTS)))')"; exit 2; }
	OPENBLAS_NUM_THREADS=1 $(BIN)/python -m deqlab.lab.experiments.medium $(EXPERIMENT)

strip:
	$(PYTHON) .ci/strip_notebooks.py $$(git ls-files --cached --others --exclude-standard '*.ipynb' 2>/dev/null || find book -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*')

clean:
	rm -rf _build .jax_cache .pytest_cache .hypothesis
	find . -name __pycache__ -type d -not -path './.venv*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf .venv .venv-floor *.egg-info
