"""Compiler flags for the project's own code (not for generated code)."""

ZF_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
]
