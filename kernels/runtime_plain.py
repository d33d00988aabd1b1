"""kernels/runtime.py's interface for a generated variant: advisor's fast path where advisor is
installed, Triton's normal launch where it is not.

A variant written by `advisor generate` carries this module instead of runtime.py (its
~500 lines of Triton internals): the schedule's launcher calls `launch`, `call_key`,
`replay` and `Recorder` as it does in the library. With advisor importable they are
runtime.py's (fast launches and replayed calls, behind its Triton version gate); without it
every launch is `kernel[grid](...)` and no call is replayed: the same kernels and results,
more host time per call on small problems.
"""

try:  # advisor installed: its fast launches and replayed calls
    from advisor.codegen.kernel_lib import load as _load_kernels

    _runtime = _load_kernels("runtime")
    launch, replay, Recorder = _runtime.launch, _runtime.replay, _runtime.Recorder
    _OWN = object()  # in the key: this file's calls never replay launches the library (or another variant) recorded

    def call_key(tag, tensors, *extra):
        return _runtime.call_key((tag, _OWN), tensors, *extra)
except (ImportError, AttributeError):

    def launch(kernel, grid, *args, **kwargs):
        """`kernel[grid](*args, **kwargs)`."""
        return kernel[grid](*args, **kwargs)

    def call_key(tag, tensors, *extra):
        """No call is replayed here."""
        return None

    def replay(key, *tensors):
        return False

    class Recorder:
        """Launches a call's kernels; `live` holds the call's tensors as runtime.Recorder's does
        (the schedules take their scratch from it)."""

        def __init__(self, key, gather, *tensors):
            self.live = gather(*tensors)

        def drop(self):
            pass

        def launch(self, kernel, grid, *args, **kwargs):
            return kernel[grid](*args, **kwargs)

        def commit(self):
            pass
