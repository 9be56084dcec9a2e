"""Measurements of runs and of this machine.

- :mod:`.memory`: memory by category of a training step (exact tensor accounting); :mod:`.comm`: communication
  by kind (bytes, time, exposed waiting); :mod:`.steps`: both, on measurement steps after a run's timed steps;
- :mod:`.calibrate`: this machine's rates (matrix products, memory bandwidth, layer and model times,
  collectives) and the hardware profile built from them; :mod:`.link_bench`: the links of an emulated cluster;
- :mod:`.profiles`: which profile and layer times a run's prediction uses; :mod:`.compare`: that prediction beside
  the run, and the signed errors.
"""
