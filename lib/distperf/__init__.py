"""distperf: performance and memory of distributed Transformer training, predicted and measured."""
__version__ = "0.1.0"
