"""``aot build``: the spine, its schedule, its stages and the checks it runs.

- :mod:`~aot.builder.spine`: :func:`build` and ``_build``, the stages in the order of their data;
- :mod:`~aot.builder.steps`: each stage, a function of its section of the plan;
- :mod:`~aot.builder.schedule`: what overlaps, what is forked, when memory is freed;
- :mod:`~aot.builder.stages`: timed, reported stages; :mod:`~aot.builder.onnx_stage`: the export beside the rest;
- :mod:`~aot.builder.capture`, :mod:`~aot.builder.pipeline`: the trace and the pass pipeline;
- :mod:`~aot.builder.checks`, :mod:`~aot.builder.bisect`: the graph and each artifact against eager, and the pass at fault;
- :mod:`~aot.builder.cached`: :func:`build_with_cache`, a build restored from or stored in :mod:`aot.cache`.

The build directory itself (staging, manifest, integrity, consent) is :mod:`aot.directory`, a layer below.
``from aot.builder import build`` imports the spine (torch) only when it is asked for.
"""

_SPINE_NAMES = ("build", "BuildReport", "default_output")
_CACHED_NAMES = ("build_with_cache", "CachedBuild", "CacheOutcome")

__all__ = sorted(_SPINE_NAMES + _CACHED_NAMES)


def __getattr__(name: str):
    if name in _SPINE_NAMES:
        from aot.builder import spine

        return getattr(spine, name)
    if name in _CACHED_NAMES:
        from aot.builder import cached

        return getattr(cached, name)
    raise AttributeError(f"module 'aot.builder' has no attribute '{name}'")
