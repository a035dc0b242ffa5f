"""``aot build``: the spine, its schedule, and what makes a build directory trustworthy.

- :mod:`~aot.build.spine`: :func:`build` and ``_build``, the stages in the order of their data;
- :mod:`~aot.build.steps`: each stage, a function of its section of the plan;
- :mod:`~aot.build.schedule`: what overlaps, what is forked, when memory is freed;
- :mod:`~aot.build.stages`: timed, reported stages; :mod:`~aot.build.onnx_stage`: the export beside the rest;
- :mod:`~aot.build.capture`, :mod:`~aot.build.pipeline`: the trace and the pass pipeline;
- :mod:`~aot.build.outdir`: the staging directory, swapped into place only on success;
- :mod:`~aot.build.manifest`, :mod:`~aot.build.integrity`, :mod:`~aot.build.consent`: what was built, checked
  before anything in it runs, and whether this machine may run its code.

``from aot.build import build`` imports the spine (torch) only when it is asked for: reading a
manifest (``aot.build.manifest``) stays light.
"""

_SPINE_NAMES = ("build", "BuildReport", "default_output")


def __getattr__(name: str):
    if name in _SPINE_NAMES:
        from aot.build import spine

        return getattr(spine, name)
    raise AttributeError(f"module 'aot.build' has no attribute '{name}'")
