"""Report: what a trace holds (summary), what a diagnosis or a change found (markdown/JSON
rendering, before/after comparison, plots).
"""
