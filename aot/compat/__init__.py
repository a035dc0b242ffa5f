"""Where aot meets APIs that move between releases of the libraries it drives.

One module per library (:mod:`.transformers_cache`, :mod:`.torch_private`): every other module
asks these, so a rename upstream is fixed in one place, and the canary (``scripts/canary``)
finds it.
"""
