"""localchat: chat with a large language model on your own machine, CPU or GPU, with no cloud.

Importing the package loads llama.cpp's native libraries before anything loads numpy's, for every
entry point (the CLI, the server, the chat app, the benchmarks, a user's program): see localchat.native.
It imports gguf's constants without the rest of gguf, which localchat's own header reader needs alone
(see localchat.package_parts).
"""

from localchat.native import load_llama_cpp_first
from localchat.package_parts import import_part

load_llama_cpp_first()
import_part("gguf", "constants")
