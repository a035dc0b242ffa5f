"""A build directory: what makes it trustworthy before anything in it runs.

- :mod:`~aot.directory.manifest`: what was built (``manifest.json``: files, hashes, versions);
- :mod:`~aot.directory.integrity`: every file against the manifest;
- :mod:`~aot.directory.consent`: whether this machine may run the directory's code;
- :mod:`~aot.directory.outdir`: the staging directory, swapped into place only on success;
- :mod:`~aot.directory.open`: the recipe it was built from, checked against its manifest.
"""
