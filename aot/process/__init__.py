"""Process plumbing the build's schedule uses: a forked step (:mod:`~aot.process.forked`), memory figures and
release (:mod:`~aot.process.memory`), imports on a thread (:mod:`~aot.process.imports_beside`), the C library
(:mod:`~aot.process.libc`) and quiet third-party output (:mod:`~aot.process.quiet`)."""
