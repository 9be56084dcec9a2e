"""Sphinx extension: the book's pages run without JavaScript errors (the browser check reports any).

- sphinx-thebe registers its inline configuration script (``const THEBE_JS_URL = …``) twice with Jupyter Book
  1.0.4, and a ``const`` declared twice is an error on every page. Thebe is off here; each page keeps the first
  of identical script entries.
- pydata-sphinx-theme 0.17 writes ``data-mode = localStorage.mode || default_mode``; with no ``default_mode``
  in the page's context a first visit logs "Got invalid theme mode". It is set to ``auto`` (follow the
  system's light or dark preference) unless ``html_context`` names one.

And the landing page gathers every chapter's verdict (``distperf.analysis.findings``), which the chapters write as
they execute: Sphinx reads (and myst-nb executes) pages in the order of their names, so the root page is read on
every build and moved to the end of the reading list.
"""


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


def root_last(app, env, docnames):
    root = app.config.root_doc
    if root in docnames:
        docnames.remove(root)
        docnames.append(root)


def setup(app):
    app.connect("html-page-context", fix_page, priority=900)
    app.connect("env-get-outdated", reread_root)
    app.connect("env-before-read-docs", root_last)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
