"""Validation: every artifact against the eager model, and the gates that judge a build that trades precision.

- :mod:`~aot.validate.artifacts`: comparisons at every shape, bisection, the files as users load them,
  ``aot validate DIR``;
- :mod:`~aot.validate.accuracy`: the accuracy gate (task metrics on real data);
- :mod:`~aot.validate.outputs`: the one naming of model outputs;
- :mod:`~aot.validate.eager_guard`: each pass leaves the eager model as it was.

The names of :mod:`~aot.validate.artifacts` (``validate_directory``, ``Comparison``...) are importable from here;
they import torch only when first asked for.
"""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    from aot.validate import artifacts

    return getattr(artifacts, name)
