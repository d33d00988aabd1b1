"""Maintainer tools that are not part of the installed package (the wheel ships advisor/ and
the kernels/, rules/ and templates/ folders, not this one)."""
