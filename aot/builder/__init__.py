"""``aot build``: the spine, its schedule, its stages and the checks it runs.

- :mod:`~aot.builder.spine`: :func:`build` and ``_build``, the stages in the order of their data;
- :mod:`~aot.builder.steps`: each stage, a function of its section of the plan;
- :mod:`~aot.builder.schedule`: what overlaps, what is forked, when memory is freed;
- :mod:`~aot.builder.stages`: timed, reported stages; :mod:`~aot.builder.onnx_stage`: the export beside the rest;
- :mod:`~aot.builder.capture`, :mod:`~aot.builder.pipeline`: the trace and the pass pipeline;
- :mod:`~aot.builder.checks`, :mod:`~aot.builder.bisect`: the graph and each artifact against eager, and the pass at fault.

The build directory itself (staging, manifest, integrity, consent) is :mod:`aot.directory`, a layer below.
``from aot.builder import build`` imports the spine (torch) only when it is asked for.
"""

_SPINE_NAMES = ("build", "BuildReport", "default_output")


def __getattr__(name: str):
    if name in _SPINE_NAMES:
        from aot.builder import spine

        return getattr(spine, name)
    raise AttributeError(f"module 'aot.builder' has no attribute '{name}'")
