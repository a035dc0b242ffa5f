"""Load an AOTInductor package and run it on requests, in a process of its own, with torch alone.

Run as a script (``python aoti_child.py PACKAGE DEVICE``), never imported by aot: it imports torch and
the standard library only, which is what proves the package loads where only torch is installed.
The parent is :class:`aot.export.aoti_package.AotiProcess`.

Protocol, pickles both ways: first a reply ``("ok", seconds the load took)``; then for each request
(``{input name: CPU tensor}`` on stdin) a reply on stdout, ``("ok", {output name: CPU tensor})`` or
``("error", "Type: message")``. End of stdin ends the process. Anything the package or torch prints
goes to stderr, never into the replies; so does the Python stack of a crash (``faulthandler``).
"""

import faulthandler
import pickle
import sys
import time

import torch


def _reply(stream, message):
    pickle.dump(message, stream, protocol=pickle.HIGHEST_PROTOCOL)
    stream.flush()


def main():
    faulthandler.enable()  # a crash in compiled code: its Python stack on stderr, which the parent reports
    package, device = sys.argv[1], sys.argv[2]
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing the package prints may land in the replies
    started = time.perf_counter()
    try:
        run = torch._inductor.aoti_load_package(package)
    except Exception as error:
        _reply(replies, ("error", f"loading {package}: {type(error).__name__}: {error}"))
        return 1
    _reply(replies, ("ok", time.perf_counter() - started))
    while True:
        try:
            inputs = pickle.load(requests)
        except EOFError:
            return 0
        try:
            with torch.no_grad():
                outputs = run(**{name: value.to(device) for name, value in inputs.items()})
            _reply(replies, ("ok", {name: value.cpu() for name, value in outputs.items()}))
        except Exception as error:
            _reply(replies, ("error", f"{type(error).__name__}: {error}"))


if __name__ == "__main__":
    sys.exit(main())
