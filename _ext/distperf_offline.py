"""Sphinx extension: an offline book's pages declare each script once.

sphinx-thebe registers its inline configuration script (``const THEBE_JS_URL = …``) twice with Jupyter Book
1.0.4, and a ``const`` declared twice is a JavaScript error on every page (the browser check reports it). Thebe
is off here; the extension keeps the first of identical script entries of each page.
"""


def unique_scripts(app, pagename, templatename, context, doctree):
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


def setup(app):
    app.connect("html-page-context", unique_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
