"""The content-addressed build cache: ``aot build --cache URL``, ``aot cache ls``/``prune``.

Bazel's remote cache in small: a build's files are blobs named by their sha256 (a CAS), and an entry per key
(an action cache) lists them. The layer sits below :mod:`aot.builder`, which alone uses it
(:mod:`aot.builder.cached`: key, lookup, restore or build, store).

- :mod:`~aot.cache.key`: the key, a full sha256 over the resolved recipe, its input files, the installed
  distributions, aot's source and the platform;
- :mod:`~aot.cache.store`: blobs and entries on any fsspec filesystem (a directory, ``memory://``, ``s3://``);
- :mod:`~aot.cache.entry`: an entry's JSON, checked before any path in it is used;
- :mod:`~aot.cache.save`: a miss, stored; :mod:`~aot.cache.restore`: a hit, proved and swapped into place;
- :mod:`~aot.cache.listing`, :mod:`~aot.cache.prune`: ``aot cache ls`` and ``aot cache prune``;
- :mod:`~aot.cache.errors`: why the cache was not used (the builder builds then).
"""
