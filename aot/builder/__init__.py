"""``aot build``: the spine, its schedule, and what makes a build directory trustworthy.

- :mod:`~aot.builder.spine`: :func:`build` and ``_build``, the stages in the order of their data;
- :mod:`~aot.builder.steps`: each stage, a function of its section of the plan;
- :mod:`~aot.builder.schedule`: what overlaps, what is forked, when memory is freed;
- :mod:`~aot.builder.stages`: timed, reported stages; :mod:`~aot.builder.onnx_stage`: the export beside the rest;
- :mod:`~aot.builder.capture`, :mod:`~aot.builder.pipeline`: the trace and the pass pipeline;
- :mod:`~aot.builder.outdir`: the staging directory, swapped into place only on success;
- :mod:`~aot.builder.manifest`, :mod:`~aot.builder.integrity`, :mod:`~aot.builder.consent`: what was built, checked
  before anything in it runs, and whether this machine may run its code.

``from aot.builder import build`` imports the spine (torch) only when it is asked for: reading a
manifest (``aot.builder.manifest``) stays light.
"""

_SPINE_NAMES = ("build", "BuildReport", "default_output")


def __getattr__(name: str):
    if name in _SPINE_NAMES:
        from aot.builder import spine

        return getattr(spine, name)
    raise AttributeError(f"module 'aot.builder' has no attribute '{name}'")
