"""advisor: from a GPU profiler timeline to measured kernel-scheduling improvements.

Library API (what the CLI calls, and what agents can import):

    import advisor
    trace = advisor.load_trace("run.nsys-rep")     # or .sqlite, Kineto .json(.gz), rocprof
    report = advisor.diagnose(trace)               # ranked findings, gate notes
    with advisor.use("advisor-run") as routed:     # GEMMs on the verified variants
        train()
    from advisor.compare import compare            # what a change did to the step
"""

__version__ = "0.1.0"

from .errors import AdvisorError, NoKernelsError, TraceError  # noqa: E402
from .model import Trace  # noqa: E402
from .traces import load_trace  # noqa: E402
from .use import use  # noqa: E402  (the function shadows the submodule: import names from advisor.use)


__all__ = ["AdvisorError", "NoKernelsError", "Trace", "TraceError", "load_trace", "use", "__version__"]
