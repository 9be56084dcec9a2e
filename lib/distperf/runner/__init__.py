"""Experiments: a YAML grid of configurations (:mod:`.grid`) run resumably, one CSV row each (:mod:`.sweep`)."""
