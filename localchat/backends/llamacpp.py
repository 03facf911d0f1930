"""The llama.cpp backend, over llama-cpp-python's low-level (ctypes) API.

All ctypes details live here, in llamacpp_natives.py (the owners of the model, context, batch and
LoRA adapters, each freeing its object once, through the backend's ExitStack) and in
llamacpp_sampler.py. The per-token path is: a numpy view of the logits row (cached across steps),
one numpy argmax for plain greedy decoding or llama.cpp's sampler chain on a few candidates
(LlamaSampler), one cached token piece, one `llama_decode` on a preallocated batch.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

import llama_cpp
import numpy as np

from localchat.backends.base import (
    ROW_LIMIT,
    FillInMiddleTokens,
    LoraScales,
    ModelInfo,
    SamplerSettings,
    TokenGuide,
    TokenScores,
)
from localchat.backends.llamacpp_embeddings import LlamaEmbedder, open_embedder
from localchat.backends.llamacpp_natives import (
    PROMPT_BATCH,
    DryKey,
    LlamaBatch,
    LlamaLoraAdapter,
    OpenedModel,
    dry_key,
    free_when_made,
    start_dry,
)
from localchat.backends.llamacpp_sampler import DeviceSampler, LlamaSampler, device_chain, device_sampleable
from localchat.backends.logprobs import score_rows
from localchat.errors import ContextOverflowError, InferenceError

# Rows of logits read back per decode when scoring (each row is n_vocab floats).
SCORE_CHUNK = 64
# What a step of a count of rows costs on a GPU the first time over later times, in plain steps
# (first_shape_steps): on an H200 (a random 1.5B model, benchmarks/gpu/probes.py shapes) the first step
# of 2, 3, 5, 9 and 17 rows took 11.7, 7.9, 8.2, 6.2 and 8.2 ms, later ones 2.1 to 3.5, a plain step
# 1.12: 3 to 10 ms more, 2.7 to 8.6 plain steps. Near the low end: a session times its own from its
# first such step on (localchat.speculative.StepCosts).
FIRST_SHAPE_STEPS = 4.0

# llama_get_logits with its pointer as a plain address, to see cheaply whether the buffer moved.
_logits_address = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(("llama_get_logits", llama_cpp.llama_cpp._lib))


T = TypeVar("T")


class _ComputeThread:
    """The one thread that runs every llama_decode of the process, whichever thread asks.

    llama.cpp's CPU backend (built with OpenMP) keeps a thread team per thread that calls it. Once
    two teams are alive, libgomp counts more threads than cores and stops spinning at barriers, so
    each of a graph's hundreds of barriers sleeps and wakes: a server that warmed its model on one
    thread and decoded on another ran at 31 tok/s against 44 (2 cores, the default model). One
    calling thread keeps one team, as in llama-server, whose main loop does all the decoding.
    """

    def __init__(self) -> None:
        self._ident: int | None = None
        self._executor = ThreadPoolExecutor(1, "llama.cpp-compute", initializer=self._started)
        # Calls submitted from other threads that have yet to start (see `hold`).
        self._queued = 0
        self._queued_lock = threading.Lock()

    def _started(self) -> None:
        self._ident = threading.get_ident()

    def adopt_current_thread(self) -> None:
        """Make the calling thread the compute thread, for a command that decodes on no other (`localchat
        run`, `bench`): its decodes then run in place, without two thread switches each (20-40 us a token,
        a few percent of a GPU step). Only before any decode: the executor's thread would be a second team."""
        if self._ident is None:
            self._ident = threading.get_ident()

    def run(self, call: Callable[[], T]) -> T:
        """`call()` on the compute thread. A Ctrl-C while it runs takes effect once it has returned,
        as it would on the caller's own thread, so no decode is left running behind the caller."""
        if threading.get_ident() == self._ident:
            return call()
        with self._queued_lock:
            self._queued += 1
        future: Future[T] = self._executor.submit(self._started_call, call)
        interrupted = False
        while True:
            try:
                result = future.result()
                break
            except KeyboardInterrupt:
                interrupted = True
        if interrupted:
            raise KeyboardInterrupt
        return result

    def _started_call(self, call: Callable[[], T]) -> T:
        with self._queued_lock:
            self._queued -= 1
        return call()

    def hold(self, step: Callable[[], bool]) -> None:
        """`step()` on the compute thread again and again while it returns True: a loop whose decodes then
        run in place. A decode handed over from another thread waits for two thread switches: in `serve` on
        the default model (AMD EPYC, 2 cores) the time between two decodes was 1.1 ms, against 0.57 with the
        steps held here. Streamed replies came 4% faster with llama.cpp on 1 thread, leaving Python a core;
        on both cores, 0-2% (the event loop's work then runs during the decodes instead). Once a call from
        another thread waits to start, the loop hands the thread over after its step and goes on after that
        call, so that the models of one server take turns."""

        def steps() -> bool:
            """Steps until none is left (False) or another thread's call waits (True)."""
            while step():
                if self._queued > 0:
                    return True
            return False

        while self.run(steps):
            pass


_compute = _ComputeThread()


def decode_on_this_thread() -> None:
    """See `_ComputeThread.adopt_current_thread`."""
    _compute.adopt_current_thread()


class LlamaCppBackend:
    """A GGUF model and its context, loaded with the settings of a `Plan`."""

    name = "llama.cpp"

    def __init__(self, opened: OpenedModel) -> None:
        """A backend on `opened` (`open_model`), which it owns from then on: freed here if it cannot be made."""
        self.load = opened.load
        self._natives = opened.natives
        try:
            self._take(opened)
        except BaseException:
            self._natives.close()
            raise

    def _take(self, opened: OpenedModel) -> None:
        self._model = opened.model
        self._vocab = opened.model.vocab
        self._loras = opened.loras
        self._ctx = opened.context.pointer
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        # llama.cpp makes a multiple of 256 cells (`--ctx 16` gets 256, 300 gets 512); prompts and replies are
        # held to the context asked for, as onnxruntime's backend holds them.
        self.n_ctx = min(llama_cpp.llama_n_ctx(self._ctx), opened.load.n_ctx)
        # llama.cpp caps the batch at the context size and aborts on a larger one.
        self._n_batch = llama_cpp.llama_n_batch(self._ctx)
        self.n_seq = opened.load.n_seq
        model = opened.model.pointer
        self.rewinds = not (llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model))
        self.saved_states_rewind = self.rewinds and llama_cpp.llama_model_n_swa(model) == 0
        # The CPU kernels take longer for an odd count of rows with logits than for one more, whether
        # the rows are one sequence's draft or a batch of sequences (benchmarks/speculative.py
        # --step-cost; default model, AMD EPYC, 2 threads: 3 tokens 60 ms, 4 tokens 51; 9 tokens 108,
        # 10 tokens 103; 25 tokens 241, 26 tokens 222; 3 sequences 59 ms, 4 sequences 52; 5 sequences
        # 78, 6 sequences 67). The same with the extra buffer types off, as on AMX CPUs (3 tokens 63 ms,
        # 4 tokens 54). The 262k-row output head is most of it: with it cut to 32k rows, 3 tokens take
        # 20 ms and 4 tokens 21. Save with a recurrent state, which cannot drop a throwaway row again.
        self.even_rows = self.rewinds
        batch = LlamaBatch(max(PROMPT_BATCH, opened.load.n_seq))
        self._natives.callback(batch.close)
        self._batch = batch.batch
        self._output_index: dict[int, int] = {}
        self._first_row: dict[int, int] = {}
        self._n_outputs = 0  # rows of logits the last decode kept
        # The counts of rows evaluated in one step with every row's logits (new_shapes).
        self._shapes_seen = np.zeros(self._n_batch + 1, dtype=bool)
        self.first_shape_steps = FIRST_SHAPE_STEPS if opened.load.uses_gpu else 0.0
        self._logits_view: tuple[int, int, np.ndarray] | None = None  # (address, rows, view)
        self._piece_cache: dict[int, bytes] = {}
        self._piece_buffer = ctypes.create_string_buffer(256)
        # DRY samplers by parameters, each made once on a thread of its own: the default sampler's was
        # begun with the model (open_model).
        self._dry_samplers: dict[DryKey, Future[llama_cpp.llama_sampler_p]] = dict(opened.dry_samplers)
        self._dry_lock = threading.Lock()
        # Sampler chains attached to sequences for backend sampling (load.backend_sampling), with their settings.
        self._attached: dict[int, tuple[SamplerSettings, llama_cpp.llama_sampler_p]] = {}
        self._natives.callback(self._detach_all)
        self._embedder: LlamaEmbedder | None = None
        self._embedder_lock = threading.Lock()
        self._lora_scales: LoraScales = ()
        self.info = self._read_info(opened.path, opened.eog_ids, opened.metadata)

    # -- model facts ---------------------------------------------------------------

    def _meta(self, key: str) -> str | None:
        buffer = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self._model.pointer, key.encode(), buffer, len(buffer))
        return buffer.value.decode("utf-8", errors="replace") if n >= 0 else None

    def _read_info(self, path: Path, eog: frozenset[int], metadata: dict[str, str]) -> ModelInfo:
        n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        template = llama_cpp.llama_model_chat_template(self._model.pointer, None)
        bos = llama_cpp.llama_vocab_bos(self._vocab)
        eos = llama_cpp.llama_vocab_eos(self._vocab)
        return ModelInfo(
            path=path,
            name=self._meta("general.name") or path.stem,
            architecture=self._meta("general.architecture") or "unknown",
            n_vocab=n_vocab,
            n_ctx_train=llama_cpp.llama_model_n_ctx_train(self._model.pointer),
            n_layers=llama_cpp.llama_model_n_layer(self._model.pointer),
            bos_id=bos if bos >= 0 else None,
            eos_id=eos if eos >= 0 else None,
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(self._vocab)),
            eog_ids=eog,
            chat_template=template.decode("utf-8", errors="replace") if template else None,
            size_bytes=llama_cpp.llama_model_size(self._model.pointer),
            metadata=metadata,
            fim=self._fill_in_middle_tokens(),
        )

    def _fill_in_middle_tokens(self) -> FillInMiddleTokens | None:
        ids = (llama_cpp.llama_vocab_fim_pre(self._vocab), llama_cpp.llama_vocab_fim_suf(self._vocab),
               llama_cpp.llama_vocab_fim_mid(self._vocab))
        if min(ids) < 0:
            return None
        repository, separator = (llama_cpp.llama_vocab_fim_rep(self._vocab), llama_cpp.llama_vocab_fim_sep(self._vocab))
        return FillInMiddleTokens(*ids, repository=repository if repository >= 0 else None,
                                  file_separator=separator if separator >= 0 else None)

    # -- text ----------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_bos, special)
        if n < 0:
            capacity = -n
            tokens = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_bos, special)
        return list(tokens[:n])

    def _piece(self, token: int, *, special: bool) -> bytes:
        buffer = self._piece_buffer
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, special)
        if n < 0:
            buffer = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, special)
        return buffer.raw[:n]

    def token_bytes(self, token: int) -> bytes:
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece_cache[token] = self._piece(token, special=False)
        return piece

    def token_text(self, token: int) -> str:
        return self._piece(token, special=True).decode("utf-8", errors="replace")

    # -- KV cache ------------------------------------------------------------------

    def _decode(self, n_tokens: int, n_outputs: int) -> None:
        self._batch.n_tokens = n_tokens
        self._n_outputs = n_outputs
        status = _compute.run(lambda: llama_cpp.llama_decode(self._ctx, self._batch))
        if status == 1:
            raise ContextOverflowError(f"the context is full ({self.n_ctx} tokens); start a new chat or raise --ctx")
        if status != 0:
            raise InferenceError(f"llama.cpp failed to evaluate tokens (llama_decode status {status})")
        if n_outputs == n_tokens:
            self._shapes_seen[n_tokens] = True

    def new_shapes(self, rows: np.ndarray) -> np.ndarray:
        return ~self._shapes_seen[rows]

    def evaluate(self, seq: int, tokens: Sequence[int], start: int, *, all_logits: bool = False) -> None:
        if start + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{start + len(tokens)} tokens do not fit in the {self.n_ctx}-token context; "
                "shorten the prompt or raise --ctx"
            )
        batch = self._batch
        chunk = min(SCORE_CHUNK if all_logits else PROMPT_BATCH, self._n_batch)
        for offset in range(0, len(tokens), chunk):
            part = tokens[offset : offset + chunk]
            last = offset + len(part) == len(tokens)
            for i, token in enumerate(part):
                batch.token[i] = token
                batch.pos[i] = start + offset + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = all_logits or (last and i == len(part) - 1)
            self._decode(len(part), len(part) if all_logits else int(last))
        self._output_index = {seq: self._n_outputs - 1}

    def evaluate_batch(self, items: Sequence[tuple[int, int, int]], *, spare_cell: bool = False) -> None:
        rows = list(items)
        filler = (self.even_rows and spare_cell and len(rows) > 1 and len(rows) % 2 == 1 and len(rows) < self._n_batch
                  and rows[0][2] + 1 < self.n_ctx)
        if filler:  # the first sequence's token once more, one position on; dropped after the step
            seq, token, position = rows[0]
            rows.append((seq, token, position + 1))
        if len(rows) > self._n_batch:
            raise ValueError(f"{len(items)} sequences exceed the batch of {self._n_batch}")
        batch = self._batch
        for i, (seq, token, position) in enumerate(rows):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = True
        self._decode(len(rows), len(rows))
        self._output_index = {seq: i for i, (seq, _, _) in enumerate(items)}
        if filler:
            self.truncate(rows[-1][0], rows[-1][2])

    def evaluate_all(self, seq: int, tokens: Sequence[int], start: int) -> np.ndarray:
        """As the interface says; for a sequence sampled on the device the rows are not read back (an
        empty array: the device drew each row's token)."""
        chunk = min(ROW_LIMIT, self._n_batch)
        rows = []
        for offset in range(0, len(tokens), chunk):
            part = tokens[offset : offset + chunk]
            self.evaluate(seq, part, start + offset, all_logits=True)
            if seq in self._attached:
                rows.append(np.empty((len(part), 0), dtype=np.float32))
                continue
            view = self._logits_rows()
            # Earlier chunks' rows are overwritten by the next decode: copied.
            rows.append(view if offset + chunk >= len(tokens) else view.copy())
        # Row r of the call is output r - first of llama.cpp's last decode.
        self._first_row = {seq: len(tokens) - len(rows[-1])}
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def truncate(self, seq: int, start: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self._memory, seq, start, -1):
            # Cannot happen with swa_full; clearing the whole sequence always works.
            llama_cpp.llama_memory_seq_rm(self._memory, seq, -1, -1)
            raise InferenceError(f"llama.cpp could not drop positions {start}.. of sequence {seq}")

    # -- sampling ------------------------------------------------------------------

    def make_sampler(self, settings: SamplerSettings, guide: TokenGuide | None = None, *, seq: int | None = None,
                     raw_logits: bool = False) -> LlamaSampler | DeviceSampler:
        """A sampler for a reply on `seq`. Where the plan samples on the device (the output layer on a
        GPU) and the reply allows it (device_sampleable), llama.cpp samples inside its graph.

        A context of one sequence keeps the chain attached after the reply, for the next one; a context
        of several releases it when the reply ends, since every decode's graph carries the chain of each
        sequence that has one, active or not. On an H200 (a random 1.5B model, as shipped, one stream of
        replies that `serve`'s scheduler puts on its least recently used slot) 4 slots decoded 523 tok/s
        where 1 slot decoded 655; releasing the chains did not close that gap, so such a context draws only
        greedy replies on the device (device_sampleable)."""
        if (self.load.backend_sampling and seq is not None
                and device_sampleable(settings, guide, raw_logits, self.n_seq)):
            chain = self._attach(seq, settings)
            if chain is not None:
                release = partial(self._release, seq, chain) if self.n_seq > 1 else None
                return DeviceSampler(settings, chain, self._ctx, release)
        if seq is not None:
            self._detach(seq)  # sampling on the host needs the raw logits
        return LlamaSampler(settings, self.info.n_vocab, self.n_ctx, self._dry_sampler(settings) if settings.dry else None, guide)

    def _attach(self, seq: int, settings: SamplerSettings) -> llama_cpp.llama_sampler_p | None:
        """The device chain for `settings` attached to `seq`: the one attached if its settings are the same
        (reset: attaching another makes llama.cpp reserve its graph again), else a new one; None if llama.cpp
        cannot run it on the device."""
        attached = self._attached.get(seq)
        if attached is not None and attached[0] == settings:
            llama_cpp.llama_sampler_reset(attached[1])
            return attached[1]
        self._detach(seq)
        chain = device_chain(settings)
        if not llama_cpp.llama_set_sampler(self._ctx, seq, chain):
            llama_cpp.llama_sampler_free(chain)
            return None
        self._attached[seq] = (settings, chain)
        return chain

    def _detach(self, seq: int) -> None:
        attached = self._attached.pop(seq, None)
        if attached is not None:
            llama_cpp.llama_set_sampler(self._ctx, seq, None)
            llama_cpp.llama_sampler_free(attached[1])

    def _release(self, seq: int, chain: llama_cpp.llama_sampler_p) -> None:
        """A reply's chain off `seq`, unless another reply's chain has taken its place."""
        attached = self._attached.get(seq)
        if attached is not None and attached[1] is chain:
            self._detach(seq)

    def _detach_all(self) -> None:
        for seq in list(self._attached):
            self._detach(seq)

    def _dry_sampler(self, settings: SamplerSettings) -> llama_cpp.llama_sampler_p:
        """A DRY sampler for these parameters, made once (`start_dry`), to copy."""
        return self._dry_making(settings).result()

    def _dry_making(self, settings: SamplerSettings) -> Future[llama_cpp.llama_sampler_p]:
        key = dry_key(settings, self.n_ctx)
        with self._dry_lock:
            making = self._dry_samplers.get(key)
            if making is None:
                making = self._dry_samplers[key] = start_dry(self._vocab, key)
                self._natives.callback(free_when_made, making)  # before the vocabulary it reads
        return making

    def _index(self, seq: int, row: int) -> int:
        """The output row of `seq`'s last token, or of row `row` of `evaluate_all`."""
        if row < 0:
            return self._output_index[seq]
        index = row - self._first_row[seq]
        if index < 0:
            raise ValueError(f"row {row} of the last evaluation is no longer held (only the last {ROW_LIMIT} are)")
        return index

    def _logits_rows(self) -> np.ndarray:
        """The last decode's rows of logits, `(n_outputs, n_vocab)`: a view kept while llama.cpp keeps
        its buffer where it was (making one costs 12 us, a sixth of sampling a token)."""
        address = _logits_address(self._ctx)  # waits for the decode, as llama_get_logits does
        cached = self._logits_view
        if cached is None or cached[0] != address or cached[1] < self._n_outputs:
            pointer = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            view = np.ctypeslib.as_array(pointer, shape=(self._n_outputs, self.info.n_vocab))
            cached = self._logits_view = (address, self._n_outputs, view)
        return cached[2][: self._n_outputs]

    def sample(self, seq: int, sampler: LlamaSampler | DeviceSampler, row: int = -1) -> int:  # type: ignore[override]
        if isinstance(sampler, DeviceSampler):
            # Counted back from the last output row: llama.cpp reads a positive index as a batch position.
            return sampler.pick_output(self._index(seq, row) - self._n_outputs)
        return sampler.pick(self.logits(seq, row))

    def logits(self, seq: int, row: int = -1) -> np.ndarray:
        if seq in self._attached:
            raise ValueError(f"sequence {seq} is sampled on the device: its raw logits were not read back")
        return self._logits_rows()[self._index(seq, row)]

    def score(self, seq: int, tokens: Sequence[int]) -> TokenScores:
        self._detach(seq)
        self.truncate(seq, 0)
        logprobs = np.empty(len(tokens) - 1, dtype=np.float64)
        top1 = np.empty(len(tokens) - 1, dtype=np.int64)
        chunk = min(SCORE_CHUNK, self._n_batch)
        for offset in range(0, len(tokens), chunk):
            part = tokens[offset : offset + chunk]
            self.evaluate(seq, part, offset, all_logits=True)
            logits = self._logits_rows()
            # Row i predicts token offset + i + 1.
            rows = min(len(part), len(tokens) - 1 - offset)
            if rows <= 0:
                break
            targets = np.asarray(tokens[offset + 1 : offset + 1 + rows])
            logprobs[offset : offset + rows], top1[offset : offset + rows] = score_rows(logits[:rows], targets)
        return TokenScores(logprobs=logprobs, top1=top1)

    # -- state ---------------------------------------------------------------------

    def save_state(self, seq: int) -> bytes:
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, seq)
        return bytes(memoryview(buffer)[:written])

    def restore_state(self, seq: int, state: bytes) -> None:
        llama_cpp.llama_memory_seq_rm(self._memory, seq, -1, -1)
        source = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if llama_cpp.llama_state_seq_set_data(self._ctx, source, len(state), seq) == 0:
            raise InferenceError("llama.cpp refused a saved KV state (different model or context?)")

    # -- LoRA adapters -------------------------------------------------------------

    def load_lora(self, path: Path) -> int:
        self._loras.append(LlamaLoraAdapter(self._model.pointer, path, self.info.architecture))
        return len(self._loras) - 1

    def use_loras(self, scales: LoraScales) -> None:
        # llama.cpp re-plans its compute graph after a change: only a change is passed on.
        if scales == self._lora_scales:
            return
        n = len(scales)
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*(self._loras[i].pointer for i, _ in scales)) if n else None
        values = (ctypes.c_float * n)(*(scale for _, scale in scales)) if n else None
        llama_cpp.llama_set_adapters_lora(self._ctx, adapters, n, values)
        self._lora_scales = scales

    def hold_compute(self, step: Callable[[], bool]) -> None:
        _compute.hold(step)

    # -- embeddings and closing ----------------------------------------------------

    def embedder(self) -> LlamaEmbedder:
        """The model's embeddings context, made on first use (localchat/backends/llamacpp_embeddings.py)
        and owned as the other natives are: freed before the model it was made on."""
        with self._embedder_lock:
            if self._embedder is None:
                self._embedder = open_embedder(self._model.pointer, self._meta, self.info.architecture, self.n_ctx,
                                               self.load.n_threads, self.load.n_threads_batch, _compute.run)
                self._natives.callback(self._embedder.close)
            return self._embedder

    def close(self, *, process_ends: bool = False) -> None:
        """Free the batch, the context, the model and the DRY samplers, each once; where the process ends
        next and the model is in RAM, none of them: its end unmaps them at once, where llama.cpp's frees
        took 70 ms of the 0.95 s of `localchat run` on Gemma 3 270M and 20 ms on SmolLM2 (AMD EPYC, 2
        cores). A model on a GPU is freed as before: leaving device memory to the CUDA driver's teardown
        at exit was never tried on one."""
        natives = getattr(self, "_natives", None)
        if natives is not None:
            if process_ends and self.load.n_gpu_layers == 0:
                natives.pop_all()  # the frees, dropped uncalled
            natives.close()
            self._logits_view = None

    def __del__(self) -> None:
        self.close()
