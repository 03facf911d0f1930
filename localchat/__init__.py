"""localchat: chat with a large language model on your own machine, CPU or GPU, with no cloud.

Importing the package loads llama.cpp's native libraries before anything loads numpy's, for every
entry point (the CLI, the server, the chat app, the benchmarks, a user's program): see localchat.native.
"""

from localchat.native import load_llama_cpp_first

load_llama_cpp_first()
