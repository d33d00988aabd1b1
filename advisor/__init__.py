"""advisor: from a GPU profiler timeline to measured kernel-scheduling improvements.

Library API (what the CLI calls, and what agents can import):

    import advisor
    trace = advisor.load_trace("run.nsys-rep")     # or .sqlite, Kineto .json(.gz), rocprof
    from advisor.diagnose.diagnosis import diagnose
    report = diagnose(trace)                       # ranked findings, gate notes
    with advisor.use("advisor-run") as routed:     # GEMMs on the verified variants
        train()
    from advisor.report.compare import compare     # what a change did to the step
"""

__version__ = "0.1.0"

from .errors import AdvisorError, NoKernelsError, TraceError  # noqa: E402
from .model import Trace  # noqa: E402
from .traces import load_trace  # noqa: E402
from .run.use import use  # noqa: E402  (the function; its module is advisor.run.use)


__all__ = ["AdvisorError", "NoKernelsError", "Trace", "TraceError", "load_trace", "use", "__version__"]
