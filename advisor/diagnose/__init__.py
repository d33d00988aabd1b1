"""Diagnose: symptoms' evidence judged by the rules -> ranked findings and gate notes, and
the code change for advice that is not a kernel swap.
"""
