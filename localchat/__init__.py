"""localchat: chat with a large language model on your own machine, CPU or GPU, with no cloud.

Importing the package loads llama.cpp's native libraries before anything loads numpy's, for every
entry point (the CLI, the server, the chat app, the benchmarks, a user's program): see localchat.native.
It imports gguf's constants without the rest of gguf, which localchat's own header reader needs alone
(see localchat.package_parts).

numpy's OpenBLAS starts a thread per core when numpy is imported, and each spins for about 0.1 s waiting for
work that localchat never gives it (its numpy work is element-wise; llama.cpp and onnxruntime bring their own
threads): `import numpy` took 150 ms of CPU time against 90 with one BLAS thread, and `localchat run -n 1`
0.40 s against 0.33 from the shell on 2 cores (AMD EPYC), the spinning thread taking a core from the model's
load. So OpenBLAS gets one thread unless the environment says otherwise.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from localchat.native import load_llama_cpp_first
from localchat.package_parts import import_part

load_llama_cpp_first()
import_part("gguf", "constants")
