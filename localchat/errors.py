"""Errors a user can fix: the CLI prints them as one line, no traceback."""


class LocalchatError(Exception):
    """Something wrong with the input or the machine, with what to do about it in the message."""


class ModelError(LocalchatError):
    """A model that cannot be found, read or loaded."""


class InvalidSettingError(LocalchatError, ValueError):
    """A sampler, context or generation setting out of range."""


class ContextOverflowError(LocalchatError):
    """A prompt that does not fit in the context window."""


class InferenceError(LocalchatError):
    """The inference library failed on a request (the sequence it was working on is reset)."""


class InsufficientMemoryError(LocalchatError):
    """The machine cannot hold the model with the requested context."""


class UnsupportedError(LocalchatError):
    """Something this model or backend cannot do (embeddings from an ONNX model), named in the message."""


class UnwritableFolderError(LocalchatError):
    """An output folder that takes no files (/proc, a read-only one)."""

    def __init__(self, folder: object, error: OSError) -> None:
        super().__init__(f"cannot write to the output folder {folder} ({error.strerror}); choose another path with -o")
