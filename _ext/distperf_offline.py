"""Sphinx extension: the book's pages run without JavaScript errors (the browser check reports any).

- sphinx-thebe registers its inline configuration script (``const THEBE_JS_URL = …``) twice with Jupyter Book
  1.0.4, and a ``const`` declared twice is an error on every page. Thebe is off here; each page keeps the first
  of identical script entries.
- pydata-sphinx-theme 0.17 writes ``data-mode = localStorage.mode || default_mode``; with no ``default_mode``
  in the page's context a first visit logs "Got invalid theme mode". It is set to ``auto`` (follow the
  system's light or dark preference) unless ``html_context`` names one.

And the landing page gathers every chapter's verdict (``distperf.analysis.findings``), which the chapters write as
they execute: Sphinx reads (and myst-nb executes) pages in the order of their names, so the root page is read on
every build and read after all others.

Pages are read (and executed) in parallel, one process per CPU (``DISTPERF_BOOK_JOBS`` overrides; 1 reads serially):
the Jupyter Book 1.x command line has no ``-j``. Three extensions do not declare whether they are safe for parallel
reading, which makes Sphinx read serially with a warning; none keeps in the environment anything from reading a page
(``UNDECLARED_BUT_SAFE``), so they are declared safe here. In a parallel read the root page is taken out of the list
and read on its own once every other page's process has finished. jupyter-cache creates its database (a folder, an
sqlite file and its tables) on first use, and two processes that start executing at once would both create it
("table settings already exists"): it is created before the processes start.
"""
import os

ROOT_PENDING = "_distperf_root_pending"  # (pages not merged yet, the list of pages Sphinx will write)
UNDECLARED_BUT_SAFE = {
    # replaces TocTreeCollector.assign_section_numbers, which runs on the merged environment after reading
    "sphinx_multitoc_numbering",
    # sets mathjax_path at set-up and copies MathJax into the output when the build has finished
    "sphinx-mathjax-offline",
    # transforms each page's own doctree (LaTeX builders aside); keeps nothing in the environment for HTML
    "sphinx_jupyterbook_latex",
}


def fix_page(app, pagename, templatename, context, doctree):
    context.setdefault("default_mode", "auto")
    scripts = context.get("script_files")
    if scripts:
        seen, unique = set(), []
        for script in scripts:
            # an inline script's filename is None or '' depending on who added it; its body is an attribute
            key = (script.filename or "", script.priority, tuple(sorted(script.attributes.items())))
            if key not in seen:
                seen.add(key)
                unique.append(script)
        context["script_files"] = unique


def reread_root(app, env, added, changed, removed):
    return [app.config.root_doc]


def jobs() -> int:
    value = os.environ.get("DISTPERF_BOOK_JOBS", "")
    if not value:
        return len(os.sched_getaffinity(0))
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"DISTPERF_BOOK_JOBS={value!r}: must be a whole number of processes, 1 or more")
    return int(value)


def parallel_reading(app, config):
    for name in UNDECLARED_BUT_SAFE & set(app.extensions):
        app.extensions[name].parallel_read_safe = True
    app.parallel = jobs()


def root_last(app, env, docnames):
    root = app.config.root_doc
    if root not in docnames:
        return
    docnames.remove(root)
    # the condition of Sphinx's Builder.read for a parallel read
    if app.parallel > 1 and len(docnames) > 5 and app.is_parallel_allowed("read"):
        setattr(app, ROOT_PENDING, (set(docnames), docnames))
    else:
        docnames.append(root)


def create_execution_cache(app, env, docnames):
    """Create myst-nb's jupyter-cache (in cache mode) in this process, before the reading processes start."""
    config = getattr(env, "mystnb_config", None)
    if config is None or config.execution_mode != "cache" or not config.execution_cache_path:
        return
    from jupyter_cache import get_cache

    get_cache(config.execution_cache_path).db  # noqa: B018 (the property creates the folder, database and tables)


def read_root_when_all_merged(app, env, docnames, other):
    """Read the root page once the last parallel process's pages are merged (before Sphinx checks it was read)."""
    pending = getattr(app, ROOT_PENDING, None)
    if pending is None:
        return
    unmerged, to_write = pending
    unmerged.difference_update(docnames)
    if unmerged:
        return
    setattr(app, ROOT_PENDING, None)
    root = app.config.root_doc
    app.emit("env-purge-doc", env, root)
    env.clear_doc(root)
    app.builder.read_doc(root)
    to_write.append(root)


def setup(app):
    app.connect("config-inited", parallel_reading)
    app.connect("html-page-context", fix_page, priority=900)
    app.connect("env-get-outdated", reread_root)
    app.connect("env-before-read-docs", root_last)
    app.connect("env-before-read-docs", create_execution_cache)
    app.connect("env-merge-info", read_root_when_all_merged, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
