"""advisor: from a GPU profiler timeline to measured kernel-scheduling improvements.

Library API (what the CLI calls, and what agents can import):

    import advisor
    trace = advisor.load_trace("run.nsys-rep")     # or .sqlite, Kineto .json(.gz), rocprof
    report = advisor.diagnose(trace)               # ranked findings, gate notes
"""

__version__ = "0.1.0"

from .errors import AdvisorError, NoKernelsError, TraceError  # noqa: E402
from .model import Trace  # noqa: E402
from .traces import load_trace  # noqa: E402

__all__ = ["AdvisorError", "NoKernelsError", "Trace", "TraceError", "load_trace", "__version__"]
