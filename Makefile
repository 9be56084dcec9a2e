# distperf — `make book`: measure this machine, then build the HTML book into _build/html.
#            `make test`: the same set-up, pytest, then a smoke build of the book (what CI runs).
# Variables: SCALE (smoke | cpu | gpu; default cpu, or gpu with DEVICE=cuda), DEVICE (auto | cpu | cuda).
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

# The smoke book goes to its own folder, so that `make test` never touches the real one.
BOOK_OUT := $(if $(filter smoke,$(SCALE)),_build/smoke,.)
HTML := $(BOOK_OUT)/_build/html
EXECUTED := _build/executed/$(SCALE)-$(DEVICE)
NOTEBOOKS := $(wildcard notebooks/*.ipynb)
RUNS := $(patsubst notebooks/%.ipynb,$(EXECUTED)/%.ipynb,$(NOTEBOOKS))
# What an experiment's measurements depend on: the library, except what only the chapters read (the cost
# model, the analysis, the published values, the plots and book helpers).
MEASURE_SRC := $(filter-out lib/distperf/cost/% lib/distperf/analysis/% lib/distperf/published.py lib/distperf/plots.py \
  lib/distperf/book.py,$(shell find lib -name '*.py'))
INSTALLED := $(VENV)/.installed
export PATH := $(abspath $(BIN)):$(PATH)
export DISTPERF_SCALE := $(SCALE)
# Chapters write each figure as SVG and PNG (tables as CSV) here; the build publishes them as figures/.
FIGURES := $(BOOK_OUT)/_build/figures
export DISTPERF_FIGURES := $(abspath $(FIGURES))

.PHONY: book data test venv clean chromium browser-check gpu-reference convergence-reference
.DELETE_ON_ERROR:

book: $(HTML)/index.html  ## measure (papermill) and build the HTML book

venv: $(INSTALLED)  ## create .venv and install the pinned dependencies

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[book,test]'
	touch $@

data: $(RUNS)  ## run the experiment notebooks at SCALE (skips those whose inputs did not change)

# papermill writes as it goes: run into a temporary file and keep it only when the whole notebook ran.
$(EXECUTED)/%.ipynb: notebooks/%.ipynb $(MEASURE_SRC) | $(INSTALLED)
	mkdir -p $(EXECUTED)
	papermill --kernel python3 --cwd notebooks --execution-timeout 3600 \
	  -p scale $(SCALE) -p device $(DEVICE) $< $(@:.ipynb=.part.ipynb)
	mv $(@:.ipynb=.part.ipynb) $@

# The calibration writes this machine's hardware profile (data/fresh/<scale>/hardware.json), which the
# other experiments' predictions read: it runs first.
CALIBRATION := $(EXECUTED)/calibration.ipynb
$(filter-out $(CALIBRATION),$(RUNS)): | $(CALIBRATION)

# Chapters execute through jupyter-cache: unchanged code is not re-executed. What their code reads (the
# fresh and reference results and the library) is hashed too: a change of it clears that cache and
# rebuilds every page (Sphinx alone re-reads only the pages whose source changed).
$(HTML)/index.html: $(RUNS) _config.yml _toc.yml references.bib $(shell find lib -name '*.py') \
  $(wildcard chapters/* _ext/*.py _static/* data/published/*) | $(INSTALLED)
	stamp=$(BOOK_OUT)/_build/.inputs; \
	inputs=$$( { echo $(SCALE); cat $$(find data/fresh/$(SCALE) data/reference data/published lib _ext -type f \( -name '*.csv' -o -name '*.py' \) 2>/dev/null | sort); } | sha256sum); \
	all=; if [ "$$inputs" != "$$(cat $$stamp 2>/dev/null)" ] || [ ! -d $(FIGURES) ]; then rm -rf $(BOOK_OUT)/_build/.jupyter_cache; all=--all; fi; \
	jupyter-book build . --path-output $(BOOK_OUT) -nW --keep-going $$all; \
	echo "$$inputs" > $$stamp; \
	mkdir -p $(HTML)/figures $(HTML)/notebooks/chapters; \
	cp $(FIGURES)/* $(HTML)/figures/; \
	cp $(RUNS) $(HTML)/notebooks/; \
	cp $(BOOK_OUT)/_build/jupyter_execute/chapters/*.ipynb $(HTML)/notebooks/chapters/; \
	touch $@  # Jupyter Book writes index.html (a redirect) only when it is missing

test: $(INSTALLED) chromium  ## pytest, then the smoke build of the book and its check in a browser
	$(BIN)/pytest -q
	$(MAKE) book SCALE=smoke
	$(MAKE) browser-check SCALE=smoke

chromium:  ## headless Chromium and its driver for the browser check (Debian packages)
	test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver; }

# Every page of the built book in headless Chromium: images, internal links, JavaScript errors, search;
# screenshots of the landing page and one chapter (light and dark) go to _build/artifacts/screenshots.
browser-check: $(HTML)/index.html chromium | $(INSTALLED)
	DISTPERF_BOOK_HTML=$(abspath $(HTML)) $(BIN)/pytest -q tests/test_browser.py

# On a machine with a CUDA device: measure what the GPU adds (at most ~9 minutes) and write commit-ready
# reference data to data/reference/<gpu>/ (scripts/gpu_reference.py says what and why).
gpu-reference: | $(INSTALLED)
	$(BIN)/python scripts/gpu_reference.py

# The long convergence study of PipeDream-2BW (1 h 37 min on two cores, longer than a build may take):
# archived to data/reference/<machine>/twobw_convergence_long.csv (scripts/convergence_reference.py).
convergence-reference: | $(INSTALLED)
	$(BIN)/python scripts/convergence_reference.py

clean:  ## remove build outputs and fresh results (not the virtual environment)
	rm -rf _build data/fresh
