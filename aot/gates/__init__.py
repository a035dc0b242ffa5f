"""What judges an artifact against the eager model.

- :mod:`~aot.gates.compare`: outputs against eager's at atol/rtol, per output and shape case;
- :mod:`~aot.gates.accuracy`: the accuracy gate (task metrics on real data), for passes that change the computation;
- :mod:`~aot.gates.eager_guard`: each pass leaves the eager model as it was.
"""
