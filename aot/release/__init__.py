"""What a release pipeline proves about a build directory, beyond its own manifest.

A manifest proves the bytes to whoever already trusts the manifest; a release needs a proof that travels:

- :mod:`~aot.release.signing`: an OpenSSF Model Signing (OMS) signature over every file, made offline with an
  elliptic-curve key or a certificate through ``model-signing`` (``aot sign``);
- :mod:`~aot.release.verification`: the same signature checked with a public key or a certificate chain
  (``aot verify``), naming the file or the key at fault;
- :mod:`~aot.release.provenance` and :mod:`~aot.release.dsse`: SLSA v1 provenance in an in-toto Statement inside a
  DSSE envelope signed with the same key (``aot sign --provenance``), which model-signing does not write;
- :mod:`~aot.release.keys`, :mod:`~aot.release.paths`, :mod:`~aot.release.files`, :mod:`~aot.release.dependency`:
  keys read with one-line errors, where signatures go by default, files replaced only whole, the optional extra.

This layer knows files and keys, not build directories: checking a directory's manifest against what was signed
is :mod:`aot.directory.signed`, one layer up. ``model-signing`` (the ``sign`` extra) is imported only when used.
"""
