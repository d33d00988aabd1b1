"""Codegen: from a strategy and a shape to a standalone variant file (the kernel library in
`kernels/`, the analytical model that picks its knobs, the bundler that inlines it).
"""
