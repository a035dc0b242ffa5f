"""``aot validate DIR``: a build directory checked again, files first, then every artifact against eager.

- :mod:`~aot.validate.directory`: :func:`validate_directory` and its :class:`DirectoryReport`.

What it is built from lives below: the comparison rule and the gates in :mod:`aot.gates`, each artifact's checks
in :mod:`aot.builder.checks`, the directory's manifest, integrity and consent in :mod:`aot.directory`.
``from aot.validate import validate_directory`` imports torch only when first asked for.
"""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    from aot.validate import directory

    return getattr(directory, name)
