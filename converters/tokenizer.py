"""A checkpoint's tokenizer as GGUF metadata: vocabulary, merges or scores, special tokens,
add-bos/eos flags, end-of-turn ids and the chat template.

Three kinds are read: byte-level BPE from tokenizer.json (llama.cpp's "gpt2" model),
SentencePiece from tokenizer.model, and SentencePiece-style BPE from tokenizer.json (byte fallback,
"▁" for spaces: what transformers 5 saves for Gemma, Llama 2 or Mistral without tokenizer.model);
both of the latter become llama.cpp's "llama" model. llama.cpp's own converter picks a BPE
pre-tokenizer by hashing the tokenization of a test string; here it is read from tokenizer.json's
pre-tokenizer (its split regex, or its steps), which must be one llama.cpp implements.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from gguf import GGUFWriter, SpecialVocab, TokenType

from localchat.converters.checkpoint import Checkpoint
from localchat.errors import ModelError

# tokenizer.json's Split regex -> the llama.cpp pre-tokenizer that implements it.
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# Qwen 3.5's: Qwen 2's, with combining marks (\p{M}) kept in words.
QWEN35_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Mistral's Tekken (Mistral NeMo, Ministral 3): GPT-4o's split without its contractions, digits one by one. llama.cpp's
# "tekken" (as its "gpt-4o") splits a word before a combining mark (Devanagari's vowel signs), which this keeps with its letter.
TEKKEN_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# ByteDance's Seed-Coder and Seed-OSS: Llama 3's split with digits one by one and no newlines kept after punctuation.
SEED_CODER_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
PRE_TOKENIZER_REGEXES: dict[str, str] = {
    LLAMA3_REGEX: "llama-bpe",
    QWEN2_REGEX: "qwen2",
    QWEN35_REGEX: "qwen35",
    GPT4O_REGEX: "gpt-4o",
    TEKKEN_REGEX: "tekken",
    SEED_CODER_REGEX: "seed-coder",
}
# DeepSeek V3's (and R1's, Kimi K2's with the same files): three splits one after another, digits in threes, Chinese and Japanese
# runs, then words, a letter after one punctuation mark kept with it.
DEEPSEEK3_REGEXES = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
)
# tokenizer.json's Split regexes, several applied one after another -> the llama.cpp pre-tokenizer that applies the same.
PRE_TOKENIZER_SPLITS: dict[tuple[str, ...], str] = {
    DEEPSEEK3_REGEXES: "deepseek-v3",
}
# Some tokenizer.json regexes hold carriage returns and newlines as the characters themselves (Seed-Coder's, as llama.cpp's
# source quotes it): the same regex as their escapes, which the table above spells.
REGEX_CONTROL_ESCAPES = str.maketrans({"\r": r"\r", "\n": r"\n"})
# Pre-tokenizers without a Split, by their steps' types -> llama.cpp's name, when their ByteLevel applies GPT-2's own split
# (use_regex true). Command R's splits digits one by one before it (Digits, individual_digits true): llama.cpp's "\p{N}" first.
GPT2_SPLIT_PRE_TOKENIZERS: dict[tuple[str, ...], str] = {
    ("ByteLevel",): "gpt-2",
    ("Digits", "ByteLevel"): "command-r",
}
# Normalizers that leave the text llama.cpp sees unchanged for practical purposes (Qwen2 uses NFC).
ACCEPTED_NORMALIZERS = (None, "NFC")
# JSON files gguf's SpecialVocab reads (with json.load, which would raise a traceback).
SPECIAL_VOCAB_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.json")
# gguf's SpecialVocab warns through this logger of post-processor templates and special tokens it does not map (the tiny
# BPE tokenizers' single/pair templates, Gemma's "<bos>" separator): lines on every conversion that a user cannot act on.
GGUF_VOCAB_LOGGER = "gguf.vocab"
# Gemma 4's markers of reasoning, tool calls and quoted strings: special tokens that llama.cpp's converter
# makes USER_DEFINED, so that they are always rendered and the chat parser reads them.
GEMMA4_VISIBLE_TOKENS = frozenset({"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>'})
# Tokenizer models (tokenizer.ggml.model) that merge by BPE ranks: their merges go into the GGUF.
MERGING_MODELS = ("gpt2", "gemma4")
# SentencePiece's stand-in for a space, and its byte-fallback pieces.
SPM_SPACE = "\u2581"
BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class TokenizerError(ModelError):
    """A tokenizer localchat cannot carry into GGUF."""


@dataclass(frozen=True)
class Vocabulary:
    """Tokens in id order, as llama.cpp wants them."""

    model: str  # tokenizer.ggml.model: "gpt2", "llama" or "gemma4"
    pre: str  # tokenizer.ggml.pre
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    add_space_prefix: bool | None = None


def _split_regex(step: dict[str, Any]) -> str | None:
    pattern = step.get("pattern", {})
    return pattern.get("Regex")


def bpe_pre_tokenizer(tokenizer_json: dict[str, Any]) -> str:
    """The llama.cpp pre-tokenizer name equivalent to tokenizer.json's, or a TokenizerError saying why none is."""
    # An empty Sequence (DeepSeek V3's) is no normalizer.
    normalizers = _steps(tokenizer_json.get("normalizer"))
    normalizer_type = normalizers[0].get("type") if len(normalizers) == 1 else "Sequence" if normalizers else None
    if normalizer_type not in ACCEPTED_NORMALIZERS:
        raise TokenizerError(f"tokenizer.json has a '{normalizer_type}' normalizer, which llama.cpp's BPE tokenizer does not apply")
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    byte_level = [step for step in steps if step.get("type") == "ByteLevel"]
    if not byte_level:
        raise TokenizerError(f"tokenizer.json's pre-tokenizer ({', '.join(map(str, kinds))}) is not byte-level; llama.cpp's BPE needs a ByteLevel step")
    if byte_level[0].get("add_prefix_space"):
        raise TokenizerError("tokenizer.json's ByteLevel step adds a prefix space, which llama.cpp's BPE pre-tokenizers never do")
    if any(step.get("type") == "Digits" and not step.get("individual_digits") for step in steps):
        raise TokenizerError(
            "tokenizer.json's Digits step keeps runs of digits together (individual_digits false); llama.cpp's command-r, "
            "the Digits pre-tokenizer localchat knows, splits them one by one"
        )
    use_regex = byte_level[0].get("use_regex", True)
    if use_regex and tuple(kinds) in GPT2_SPLIT_PRE_TOKENIZERS:
        return GPT2_SPLIT_PRE_TOKENIZERS[tuple(kinds)]
    splits = [step for step in steps if step.get("type") == "Split"]
    if not splits or kinds != ["Split"] * len(splits) + ["ByteLevel"] or use_regex:
        raise TokenizerError(
            f"tokenizer.json's pre-tokenizer is {' + '.join(map(str, kinds))}; llama.cpp implements regex splits "
            "followed by a byte-level step (or GPT-2's byte-level split, alone or after digits split one by one)"
        )
    regexes = [_split_regex(split) for split in splits]
    for split, regex in zip(splits, regexes):
        if split.get("behavior") != "Isolated" or split.get("invert") or regex is None:
            raise TokenizerError(f"tokenizer.json splits with behavior '{split.get('behavior')}'; llama.cpp splits 'Isolated' by a regex")
    spelled = tuple(regex.translate(REGEX_CONTROL_ESCAPES) for regex in regexes)
    pre = PRE_TOKENIZER_REGEXES.get(spelled[0]) if len(spelled) == 1 else PRE_TOKENIZER_SPLITS.get(spelled)
    if pre is None:
        known = ", ".join([*GPT2_SPLIT_PRE_TOKENIZERS.values(), *PRE_TOKENIZER_REGEXES.values(), *PRE_TOKENIZER_SPLITS.values()])
        shown = regexes[0] if len(regexes) == 1 else regexes
        raise TokenizerError(
            f"tokenizer.json's split regex {shown!r} matches none of llama.cpp's pre-tokenizers that localchat knows ({known})"
        )
    return pre


@dataclass(frozen=True)
class BpeModel:
    """tokenizer.json's BPE model and added tokens, checked for the shapes this module reads."""

    vocab: dict[str, int]
    merges: list[tuple[str, str]]
    added: list[tuple[int, str, bool]]  # (id, content, special)
    unk_token: str | None

    @classmethod
    def read(cls, tokenizer_json: dict[str, Any]) -> BpeModel:
        model = tokenizer_json["model"]
        vocab = model.get("vocab")
        if not isinstance(vocab, dict) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in vocab.values()):
            raise TokenizerError("tokenizer.json's model has no valid vocab (token -> id); download it again")
        merges: list[tuple[str, str]] = []
        for merge in model.get("merges") or []:
            # Two layouts: "left right" (older), ["left", "right"] (transformers 4.45 and later).
            pair = merge.split(" ", 1) if isinstance(merge, str) else merge
            if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(part, str) for part in pair):
                raise TokenizerError(f"tokenizer.json has a malformed merge {merge!r}; download it again")
            merges.append((pair[0], pair[1]))
        added = []
        for entry in tokenizer_json.get("added_tokens") or []:
            fields = entry if isinstance(entry, dict) else {}
            token_id, content = fields.get("id"), fields.get("content")
            if not isinstance(token_id, int) or token_id < 0 or not isinstance(content, str):
                raise TokenizerError(f"tokenizer.json has a malformed added token {entry!r}; download it again")
            added.append((token_id, content, bool(fields.get("special"))))
        unk = model.get("unk_token")
        return cls(vocab, merges, added, unk if isinstance(unk, str) else None)


def _bpe_vocabulary(tokenizer_json: dict[str, Any], n_vocab: int) -> Vocabulary:
    model = BpeModel.read(tokenizer_json)
    pre = bpe_pre_tokenizer(tokenizer_json)
    by_id: dict[int, tuple[str, int]] = {i: (text, TokenType.NORMAL) for text, i in model.vocab.items()}
    for token_id, content, special in model.added:
        by_id[token_id] = (content, TokenType.CONTROL if special else TokenType.USER_DEFINED)
    return _in_id_order(by_id, n_vocab, model="gpt2", pre=pre)


def _steps(step: object) -> list[dict[str, Any]]:
    """A normalizer or pre-tokenizer as a list of steps (a Sequence unrolled)."""
    if not step:
        return []
    steps = (step.get("normalizers") or step.get("pretokenizers") or []) if isinstance(step, dict) and step.get("type") == "Sequence" else [step]
    if not all(isinstance(s, dict) for s in steps):
        raise TokenizerError("tokenizer.json has a malformed normalizer or pre-tokenizer; download it again")
    return steps


def spm_space_prefix(tokenizer_json: dict[str, Any]) -> bool:
    """Whether a SentencePiece-style tokenizer.json puts "▁" before the text (llama.cpp's
    add_space_prefix); a TokenizerError unless it maps spaces to "▁" as SentencePiece does."""
    normalizers = _steps(tokenizer_json.get("normalizer"))
    pre_tokenizers = _steps(tokenizer_json.get("pre_tokenizer"))
    kinds = [step.get("type") for step in (*normalizers, *pre_tokenizers)]
    # transformers writes either a normalizer (Prepend "▁", then Replace " " -> "▁") or a Metaspace
    # pre-tokenizer that does both; llama.cpp's SentencePiece tokenizer does the same, unsplit.
    replaces = any(
        step.get("type") == "Replace" and step.get("pattern", {}).get("String") == " " and step.get("content") == SPM_SPACE
        for step in normalizers
    )
    prepends = any(step.get("type") == "Prepend" and step.get("prepend") == SPM_SPACE for step in normalizers)
    # transformers 5 adds a Split on " " after that Replace: it never matches the normalized text.
    inert = [step for step in pre_tokenizers if step.get("type") == "Split" and step.get("pattern") == {"String": " "}]
    metaspace = [step for step in pre_tokenizers if step.get("type") == "Metaspace"]
    if replaces and len(normalizers) == 1 + prepends and len(inert) == len(pre_tokenizers):
        return prepends
    if metaspace and len(kinds) == 1 and metaspace[0].get("replacement") == SPM_SPACE and not metaspace[0].get("split", True):
        return metaspace[0].get("prepend_scheme", "always") != "never"
    raise TokenizerError(
        f"tokenizer.json is a byte-fallback BPE whose normalizer and pre-tokenizer ({', '.join(map(str, kinds)) or 'none'}) "
        f"do not map spaces to {SPM_SPACE!r} as SentencePiece does; llama.cpp cannot reproduce it"
    )


def merge_scores(merges: list[tuple[str, str]], vocab: dict[str, int]) -> dict[int, float]:
    """SentencePiece scores that make llama.cpp's merge order the BPE's.

    llama.cpp's SentencePiece tokenizer merges, at each step, the adjacent pair whose joined text
    is the vocabulary piece with the highest score; BPE merges the pair of lowest rank. A piece
    scores minus the rank of its first merge. llama.cpp's own converter gives every piece -1000
    here (gguf's LlamaHfVocab), which merges left to right instead. Pieces no merge makes score
    below all others: only single characters and bytes should be among them, and those are
    never the result of a merge.
    """
    scores: dict[int, float] = {}
    for rank, (left, right) in enumerate(merges):
        token_id = vocab.get(left + right)
        if token_id is not None:
            scores.setdefault(token_id, -float(rank))
    unreachable = -float(len(merges) + 1)
    return {i: scores.get(i, unreachable) for i in vocab.values()}


def _spm_bpe_vocabulary(tokenizer_json: dict[str, Any], n_vocab: int) -> Vocabulary:
    model = BpeModel.read(tokenizer_json)
    add_space_prefix = spm_space_prefix(tokenizer_json)
    scores = merge_scores(model.merges, model.vocab)
    by_id: dict[int, tuple[str, int]] = {}
    for text, token_id in model.vocab.items():
        kind = TokenType.BYTE if BYTE_PIECE.fullmatch(text) else TokenType.NORMAL
        by_id[token_id] = (text, kind)
    for token_id, content, special in model.added:
        if special:
            by_id[token_id] = (content, TokenType.CONTROL)
        else:
            # llama.cpp finds user-defined tokens in the text before spaces become "▁".
            by_id[token_id] = (content.replace(SPM_SPACE, " "), TokenType.USER_DEFINED)
    unk_id = model.vocab.get(model.unk_token) if model.unk_token else None
    if unk_id is not None:
        by_id[unk_id] = (model.unk_token, TokenType.UNKNOWN)
    vocab = _in_id_order(by_id, n_vocab, model="llama", pre="default")
    lowest = min(scores.values(), default=0.0)
    return Vocabulary(
        model=vocab.model,
        pre=vocab.pre,
        tokens=vocab.tokens,
        types=vocab.types,
        scores=[scores.get(i, lowest) for i in range(n_vocab)],
        add_space_prefix=add_space_prefix,
    )


def _gemma4_vocabulary(tokenizer_json: dict[str, Any], n_vocab: int) -> Vocabulary:
    """Gemma 4's SentencePiece-style BPE as llama.cpp's "gemma4" model, which merges by rank over "▁"-spaced
    text (its merges come from tokenizer.json); the chat markers visible."""
    vocab = _spm_bpe_vocabulary(tokenizer_json, n_vocab)
    types = [int(TokenType.USER_DEFINED) if token in GEMMA4_VISIBLE_TOKENS else kind for token, kind in zip(vocab.tokens, vocab.types)]
    return replace(vocab, model="gemma4", pre="gemma4", types=types)


def _in_id_order(by_id: dict[int, tuple[str, int]], n_vocab: int, **fields: Any) -> Vocabulary:
    if not by_id:
        raise TokenizerError("the tokenizer has no tokens; download the model's tokenizer files again")
    if max(by_id) >= n_vocab:
        raise TokenizerError(f"the tokenizer has token id {max(by_id)} but the model's embeddings have {n_vocab} rows")
    # Embedding rows past the tokenizer (padding for matrix sizes) get placeholder tokens.
    entries = [by_id.get(i, (f"[PAD{i}]", TokenType.UNUSED)) for i in range(n_vocab)]
    return Vocabulary(tokens=[t for t, _ in entries], types=[int(k) for _, k in entries], **fields)


def _sentencepiece_vocabulary(checkpoint: Checkpoint, n_vocab: int) -> Vocabulary:
    from sentencepiece import SentencePieceProcessor, sentencepiece_model_pb2

    path = checkpoint.folder / "tokenizer.model"
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
        processor = SentencePieceProcessor(model_proto=proto.SerializeToString())
    except Exception as error:  # protobuf and sentencepiece raise their own types for a bad file
        raise TokenizerError(f"{path} is not a valid SentencePiece model ({error}); download it again") from None
    kinds = {
        "is_unknown": TokenType.UNKNOWN,
        "is_control": TokenType.CONTROL,
        "is_unused": TokenType.UNUSED,
        "is_byte": TokenType.BYTE,
    }
    by_id: dict[int, tuple[str, int]] = {}
    scores: dict[int, float] = {}
    for i in range(processor.get_piece_size()):
        kind = next((k for test, k in kinds.items() if getattr(processor, test)(i)), TokenType.NORMAL)
        if proto.pieces[i].type == proto.SentencePiece.USER_DEFINED:
            kind = TokenType.USER_DEFINED
        by_id[i] = (processor.id_to_piece(i), kind)
        scores[i] = processor.get_score(i)
    # Tokens added by transformers on top of the SentencePiece model; `special` ones are control tokens.
    added = (checkpoint.json_file("tokenizer_config.json") or {}).get("added_tokens_decoder", {})
    for token_id, entry in added.items():
        kind = TokenType.CONTROL if entry.get("special") else TokenType.USER_DEFINED
        by_id[int(token_id)] = (entry["content"], kind)
        scores.setdefault(int(token_id), -1000.0)
    vocab = _in_id_order(by_id, n_vocab, model="llama", pre="default")
    return Vocabulary(
        model=vocab.model,
        pre=vocab.pre,
        tokens=vocab.tokens,
        types=vocab.types,
        scores=[scores.get(i, -1000.0) for i in range(n_vocab)],
        add_space_prefix=proto.normalizer_spec.add_dummy_prefix,
    )


def read_vocabulary(checkpoint: Checkpoint, n_vocab: int, model_name: str | None = None) -> Vocabulary:
    """The checkpoint's tokenizer: tokenizer.model if present (as llama.cpp prefers), else tokenizer.json;
    as llama.cpp's tokenizer model `model_name` where the architecture has its own (Gemma 4's)."""
    folder = checkpoint.folder
    if model_name == "gemma4":
        tokenizer_json = checkpoint.json_file("tokenizer.json") or {}
        model = tokenizer_json.get("model")
        if not isinstance(model, dict) or model.get("type") != "BPE" or not model.get("byte_fallback"):
            raise TokenizerError(f"{folder} has no Gemma 4 tokenizer.json (a BPE with byte fallback); download the model's tokenizer files")
        return _gemma4_vocabulary(tokenizer_json, n_vocab)
    if (folder / "tokenizer.model").is_file():
        return _sentencepiece_vocabulary(checkpoint, n_vocab)
    tokenizer_json = checkpoint.json_file("tokenizer.json")
    if tokenizer_json is None:
        raise TokenizerError(f"{folder} has no tokenizer.json or tokenizer.model; download the model's tokenizer files")
    model = tokenizer_json.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if kind != "BPE":
        raise TokenizerError(f"tokenizer.json holds a {kind} model; localchat converts BPE (tokenizer.json) and SentencePiece (tokenizer.model)")
    # Byte fallback marks a SentencePiece-style BPE ("▁" for spaces, <0xXX> pieces).
    return (_spm_bpe_vocabulary if model.get("byte_fallback") else _bpe_vocabulary)(tokenizer_json, n_vocab)


def _end_of_turn_ids(checkpoint: Checkpoint, eos_id: int | None, n_vocab: int) -> list[int]:
    """generation_config's other stop ids (Gemma's <end_of_turn>, Llama 3's <|eot_id|>)."""
    generation = checkpoint.json_file("generation_config.json") or {}
    ids = generation.get("eos_token_id")
    ids = ids if isinstance(ids, list) else [ids]
    return [i for i in ids if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_vocab and i != eos_id]


@contextmanager
def _gguf_vocab_warnings_silenced() -> Iterator[None]:
    logger = logging.getLogger(GGUF_VOCAB_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def add_tokenizer(writer: GGUFWriter, checkpoint: Checkpoint, n_vocab: int, model_name: str | None = None,
                  space_prefix_from_tokenizer_config: bool = False) -> Vocabulary:
    """Write the tokenizer keys (as llama.cpp's tokenizer model `model_name`, if given); returns the vocabulary written.
    `space_prefix_from_tokenizer_config`: tokenizer_config.json's add_prefix_space, where given, says whether a space goes
    before the text, as llama.cpp's converter takes it for ERNIE 4.5."""
    vocab = read_vocabulary(checkpoint, n_vocab, model_name)
    prefix = (checkpoint.json_file("tokenizer_config.json") or {}).get("add_prefix_space") if space_prefix_from_tokenizer_config else None
    if isinstance(prefix, bool):
        vocab = replace(vocab, add_space_prefix=prefix)
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    for name in SPECIAL_VOCAB_FILES:
        checkpoint.json_file(name)  # a corrupt one is a ModelError naming it, before gguf reads it
    with _gguf_vocab_warnings_silenced():
        try:
            special = SpecialVocab(checkpoint.folder, load_merges=vocab.model in MERGING_MODELS, n_vocab=n_vocab)
        except (ValueError, TypeError, AttributeError, KeyError) as error:  # gguf's ad-hoc parsing of these files
            raise TokenizerError(
                f"{checkpoint.folder}'s tokenizer files have a malformed entry ({error}); download tokenizer_config.json and tokenizer.json again"
            ) from None
        if vocab.model in MERGING_MODELS and not special.merges:
            raise TokenizerError(f"{checkpoint.folder}/tokenizer.json has no BPE merges; download the model's tokenizer again")
        special.add_to_gguf(writer, quiet=True)
    eot = _end_of_turn_ids(checkpoint, special.special_token_ids.get("eos"), n_vocab)
    if eot and "eot" not in special.special_token_ids:
        writer.add_eot_token_id(eot[0])
    return vocab
