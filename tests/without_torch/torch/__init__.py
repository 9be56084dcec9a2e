"""A stand-in for torch that cannot be imported: `make test` builds the reader's book with this folder first on
PYTHONPATH, so that a chapter (or anything it calls) importing torch fails the build, as it would in a reader's
environment, which has no torch (scripts/reader_requirements.py)."""
raise ModuleNotFoundError("No module named 'torch' (a reader's build has no torch: tests/without_torch)", name="torch")
