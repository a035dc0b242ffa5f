"""aot: an ahead-of-time build tool for PyTorch and Hugging Face models.

A recipe names a model; aot traces it to a torch.fx graph, runs a pipeline of
graph passes, validates the result against the eager model and writes
deployable artifacts with a manifest that proves what was built.
"""

__version__ = "0.1.0"


def load(directory, runtime: str = "onnx", **options):
    """A verified build directory as a model that takes text: see :mod:`aot.run.built_model`.

    ``options``: ``expect_sha256=``, ``public_key=`` (and ``signature=``: a directory signed by ``aot sign``),
    ``trust_code=``, ``threads=``.
    """
    from aot.run import load as load_build

    return load_build(directory, runtime, **options)
