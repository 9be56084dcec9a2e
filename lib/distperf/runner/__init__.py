"""Experiments: a grid of configurations from a dictionary or a YAML file (:mod:`.grid`), run resumably in fresh
processes or in this one (:mod:`.sweep`), one CSV row each, with one resume mechanism (:mod:`.resume`)."""
