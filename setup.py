"""localchat's C extensions, compiled on install as llama.cpp is: the sampler's one pass over a logits row, and
llama.cpp's log callback. Everything else is in pyproject.toml (whose own table for extensions setuptools still
calls experimental)."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("localchat.backends._logits_scan", ["localchat/backends/_logits_scan.c"]),
    Extension("localchat.backends._llama_log", ["localchat/backends/_llama_log.c"]),
])
