"""Run: profile a program, generate, verify and time variants on the GPU (the --run loops and
the crash-proof bench under them), route a program's GEMMs to the winners, optimize end to end.
"""
