"""aot: an ahead-of-time build tool for PyTorch and Hugging Face models.

A recipe names a model; aot traces it to a torch.fx graph, runs a pipeline of
graph passes, validates the result against the eager model and writes
deployable artifacts with a manifest that proves what was built.
"""

__version__ = "0.1.0"
