"""Errors crossing from the engine's process to the server's, torch-free so that the HTTP process unpickles them."""


class EngineFailed(RuntimeError):
    """The engine cannot go on (its CUDA context failed or its thread ended): its requests and any after end with it."""


class Busy(RuntimeError):
    """More rows wait than the engine queues: try again after `retry_after` seconds."""
    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after

    def __reduce__(self):  # it crosses from the engine's process to the server's (morph/engine/process.py)
        return Busy, (str(self), self.retry_after)


def reason(e: BaseException) -> str:
    """An exception as one log-line fragment: its type and the first line of its message."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
