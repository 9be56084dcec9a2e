# distperf — `make book`: measure this machine, then build the HTML book into _build/html.
#            `make test`: the same set-up, pytest, then a smoke build of the book (what CI runs).
#            `make book FROM=reference`: a reader's build, from the archived results in data/reference/ (no measuring).
#            `make reference`: measure this machine at SCALE and archive the results as the reference dataset.
# Variables: SCALE (smoke | cpu | gpu; default cpu, or gpu with DEVICE=cuda), DEVICE (auto | cpu | cuda),
#            FROM (fresh | reference; default fresh),
#            LONG (measure | archive): whether a fresh build measures the long studies (LONG_STUDIES) or reads them
#            from the archive; default archive at scale cpu (keeps `make book` under 30 minutes), else measure.
#            REPEATS (a whole number): how many times every configuration of a timed experiment runs, in place of
#            each notebook's own (3 at scale cpu and gpu); a build with it keeps its executed notebooks apart.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEVICE ?= auto
ifeq ($(DEVICE),cuda)
SCALE ?= gpu
endif
SCALE ?= cpu
FROM ?= fresh
REFERENCE ?= cpu-2c
# processes for what may run side by side in `make test` (pytest's files, the smoke study's notebooks) and for
# reading the book's pages (_ext/distperf_offline.py); never for measuring (a real build's notebooks run one by one)
JOBS ?= $(shell nproc 2>/dev/null || echo 1)

# The smoke book and the reader's book go to folders of their own, so that `make test` never touches the real one.
BOOK_OUT := $(if $(filter reference,$(FROM)),_build/reader,$(if $(filter smoke,$(SCALE)),_build/smoke,.))
HTML := $(BOOK_OUT)/_build/html
REPEATS ?=
ifneq ($(REPEATS),)
ifneq ($(shell [[ "$(REPEATS)" =~ ^[1-9][0-9]*$$ ]] && echo ok),ok)
$(error REPEATS must be a whole number of at least 1, got '$(REPEATS)')
endif
endif
EXECUTED := _build/executed/$(SCALE)-$(DEVICE)$(if $(REPEATS),-repeats$(REPEATS))
NOTEBOOKS := $(wildcard notebooks/*.ipynb)
RUNS := $(patsubst notebooks/%.ipynb,$(EXECUTED)/%.ipynb,$(NOTEBOOKS))
# The long studies (distperf.results.LONG_STUDIES; a test keeps the two lists equal): a fresh build at scale cpu
# reads them from the archive unless LONG=measure.
LONG_STUDIES := dp_zero network planner time_breakdown twobw
LONG ?= $(if $(and $(filter cpu,$(SCALE)),$(filter fresh,$(FROM))),archive,measure)
LONG_RUNS := $(LONG_STUDIES:%=$(EXECUTED)/%.ipynb)
BUILD_RUNS := $(if $(filter archive,$(LONG)),$(filter-out $(LONG_RUNS),$(RUNS)),$(RUNS))
# what the book is built from: the notebooks' runs, or none in a reader's build
BOOK_RUNS := $(if $(filter reference,$(FROM)),,$(BUILD_RUNS))
# What an experiment's measurements depend on: the library, except what only the chapters read (the cost
# model, the analysis, the published values, the plots and book helpers).
MEASURE_SRC := $(filter-out lib/distperf/cost/% lib/distperf/analysis/% lib/distperf/published.py lib/distperf/plots.py \
  lib/distperf/book.py,$(shell find lib -name '*.py'))
INSTALLED := $(VENV)/.installed
READER_ENV := $(VENV)/.installed-reader
# what a build needs installed: a reader's build, the lighter environment
BOOK_ENV := $(if $(filter reference,$(FROM)),$(READER_ENV),$(INSTALLED))
export PATH := $(abspath $(BIN)):$(PATH)
export DISTPERF_SCALE := $(SCALE)
export DISTPERF_FROM := $(FROM)
export DISTPERF_LONG := $(LONG)
export DISTPERF_REPEATS := $(REPEATS)
export DISTPERF_REFERENCE := $(REFERENCE)
export DISTPERF_BOOK_JOBS := $(JOBS)
# Chapters write each figure as SVG and PNG (tables as CSV) here; the build publishes them as figures/.
FIGURES := $(BOOK_OUT)/_build/figures
export DISTPERF_FIGURES := $(abspath $(FIGURES))

.PHONY: book data test smoke-check reader-check venv clean chromium browser-check gpu-reference convergence-reference reference reference-verdicts \
  reference-needs-every-study
.DELETE_ON_ERROR:

book: $(HTML)/index.html  ## measure (papermill) and build the HTML book

venv: $(INSTALLED)  ## create .venv and install the pinned dependencies

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[book,test]'
	touch $@

# A reader's build needs no torch (the chapters import none): without it the environment installs in a fraction of
# the time (scripts/reader_requirements.py). Where the full environment is installed, it serves.
$(READER_ENV): pyproject.toml scripts/reader_requirements.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if [ ! $(INSTALLED) -nt pyproject.toml ]; then \
	  $(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e . && \
	  $(BIN)/pip install --quiet --disable-pip-version-check $$($(PYTHON) scripts/reader_requirements.py); fi
	touch $@

# the long studies first: notebooks that run side by side (make test's smoke study) then end close together
data: $(filter $(LONG_RUNS),$(BUILD_RUNS)) $(filter-out $(LONG_RUNS),$(BUILD_RUNS))  ## run the experiment notebooks at SCALE (skips those whose inputs did not change)

# papermill writes as it goes: run into a temporary file and keep it only when the whole notebook ran.
$(EXECUTED)/%.ipynb: notebooks/%.ipynb $(MEASURE_SRC) | $(INSTALLED)
	mkdir -p $(EXECUTED)
	papermill --engine distperf --kernel python3 --cwd notebooks --execution-timeout 3600 \
	  -p scale $(SCALE) -p device $(DEVICE) $< $(@:.ipynb=.part.ipynb)
	mv $(@:.ipynb=.part.ipynb) $@

# The calibration writes this machine's hardware profile (data/fresh/<scale>/hardware.json), which the
# other experiments' predictions read: it runs first.
CALIBRATION := $(EXECUTED)/calibration.ipynb
$(filter-out $(CALIBRATION),$(RUNS)): | $(CALIBRATION)

# Chapters execute through jupyter-cache: unchanged code is not re-executed. What their code reads (the
# fresh and reference results and the library) is hashed too: a change of it clears that cache and
# rebuilds every page (Sphinx alone re-reads only the pages whose source changed).
$(HTML)/index.html: $(BOOK_RUNS) _config.yml _toc.yml references.bib $(shell find lib -name '*.py') \
  $(wildcard chapters/* _ext/*.py _static/* data/published/*) $(shell find data/reference -type f 2>/dev/null) \
  | $(BOOK_ENV) chromium
	stamp=$(BOOK_OUT)/_build/.inputs; \
	inputs=$$( { echo $(SCALE) $(FROM) $(LONG); cat $$(find data/fresh/$(SCALE) data/reference data/published lib _ext -type f \( -name '*.csv' -o -name '*.csv.gz' -o -name '*.json' -o -name '*.py' \) 2>/dev/null | sort); } | sha256sum); \
	all=; if [ "$$inputs" != "$$(cat $$stamp 2>/dev/null)" ] || [ ! -d $(FIGURES) ]; then rm -rf $(BOOK_OUT)/_build/.jupyter_cache; all=--all; fi; \
	jupyter-book build . --path-output $(BOOK_OUT) -nW --keep-going $$all; \
	jupyter-book build . --builder singlehtml --path-output $(BOOK_OUT) -nW --keep-going; \
	$(BIN)/python -m distperf.browser pdf $(BOOK_OUT)/_build/singlehtml chapters/intro.html $(HTML)/distperf.pdf; \
	echo "$$inputs" > $$stamp; \
	mkdir -p $(HTML)/figures $(HTML)/notebooks/chapters; \
	cp $(FIGURES)/* $(HTML)/figures/; \
	cp $(or $(BOOK_RUNS),data/reference/$(REFERENCE)/notebooks/*.ipynb) $(HTML)/notebooks/; \
	$(if $(and $(BOOK_RUNS),$(filter archive,$(LONG))),cp $(LONG_STUDIES:%=data/reference/$(REFERENCE)/notebooks/%.ipynb) $(HTML)/notebooks/;) \
	cp $(BOOK_OUT)/_build/jupyter_execute/chapters/*.ipynb $(HTML)/notebooks/chapters/; \
	touch $@  # Jupyter Book writes index.html (a redirect) only when it is missing

test: $(INSTALLED) chromium  ## pytest, then the smoke study with its book, beside a reader's build, each checked in a browser
	$(BIN)/pytest -q -n $(JOBS) --dist loadfile --durations=25  # the slowest tests, printed: where the time goes
	$(MAKE) -j2 --output-sync=line smoke-check reader-check  # side by side: a book's writing, PDF and browser are serial

# The smoke study checks that the notebooks run, not what they measure: JOBS of them at a time.
smoke-check: $(INSTALLED) chromium
	$(MAKE) -j$(JOBS) data SCALE=smoke
	$(MAKE) book SCALE=smoke
	$(MAKE) browser-check SCALE=smoke

# A reader's build as a reader's environment has it: a torch that cannot be imported comes first on the path.
reader-check: $(INSTALLED) chromium
	PYTHONPATH=$(abspath tests/without_torch) $(MAKE) book FROM=reference
	$(MAKE) browser-check FROM=reference

chromium:  ## headless Chromium and its driver (the PDF, the browser check), poppler's tools (its check)
	test -x /usr/bin/chromium -a -x /usr/bin/chromedriver -a -x /usr/bin/pdfinfo || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver \
	  poppler-utils; }

# Every page of the built book in headless Chromium: images, internal links, JavaScript errors, search;
# screenshots of the landing page and one chapter (light and dark) go to the book's _build/artifacts/screenshots.
browser-check: $(HTML)/index.html chromium | $(INSTALLED)
	DISTPERF_BOOK_HTML=$(abspath $(HTML)) DISTPERF_ARTIFACTS=$(abspath $(BOOK_OUT)/_build/artifacts) \
	  $(BIN)/pytest -q tests/test_browser.py

# On a machine with a CUDA device: measure what the GPU adds (at most ~9 minutes) and write commit-ready
# reference data to data/reference/<gpu>/ (scripts/gpu_reference.py says what and why).
gpu-reference: | $(INSTALLED)
	$(BIN)/python scripts/gpu_reference.py

# The long convergence study of PipeDream-2BW (1 h 37 min on two cores, longer than a build may take):
# archived to data/reference/<machine>/twobw_convergence_long.csv (scripts/convergence_reference.py).
convergence-reference: | $(INSTALLED)
	$(BIN)/python scripts/convergence_reference.py

# The reference dataset: this machine's results at SCALE (measured and built first, as `make book` does), archived
# to data/reference/<machine>/ with a manifest (commit, date, torch, machine, a content hash per table) and the
# chapters' verdicts. `make reference-verdicts`: only the verdicts, recomputed from the archive by a reader's build
# (after a change to an analysis).
reference: reference-needs-every-study $(HTML)/index.html | $(INSTALLED)
	$(BIN)/python -m distperf.reference --scale $(SCALE) --executed $(EXECUTED) --verdicts $(FIGURES)

reference-needs-every-study:
	@test "$(LONG)" = measure -a "$(FROM)" = fresh || { echo "make reference: LONG=measure FROM=fresh needed (an archive \
	holds every study, measured in one build; got LONG=$(LONG) FROM=$(FROM))" >&2; exit 2; }

reference-verdicts: | $(INSTALLED)
	$(MAKE) book FROM=reference
	$(BIN)/python -m distperf.reference --scale $(SCALE) --verdicts _build/reader/_build/figures --verdicts-only

clean:  ## remove build outputs and fresh results (not the virtual environment)
	rm -rf _build data/fresh
