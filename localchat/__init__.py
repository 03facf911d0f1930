"""localchat: chat with a large language model on your own machine, CPU or GPU, with no cloud.

Importing the package loads llama.cpp's native libraries before anything loads numpy's, for every
entry point (the CLI, the server, the chat app, the benchmarks, a user's program): see localchat.native.
It imports gguf's constants without the rest of gguf, which localchat's own header reader needs alone
(see localchat.package_parts).

numpy's OpenBLAS threads spin for about 0.1 s (2^28 cycles) waiting for work when they start, at numpy's
import, and after each BLAS call, taking cores from llama.cpp: `import numpy` took 150 ms of CPU time, 90 with
them sleeping at once, and `localchat run -n 1` 0.40 s against 0.33 from the shell on 2 cores (AMD EPYC), the
spinning thread taking a core from the model's load. So they wait 2^4 cycles before they sleep, unless the
environment says otherwise; they still share BLAS work (the converters' GPTQ), at the same speed.
"""

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from localchat.native import load_llama_cpp_first
from localchat.package_parts import import_part

load_llama_cpp_first()
import_part("gguf", "constants")
