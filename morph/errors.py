"""How an exception reads in one log line: shared by the decode policy and the kernels' fallbacks."""


def reason(e: BaseException) -> str:
    """An exception as one log-line fragment: its type and the first line of its message."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
