"""Measurements of runs: memory by category (:mod:`.memory`), communication (:mod:`.comm`) and this
machine's rates (:mod:`.calibrate`)."""
