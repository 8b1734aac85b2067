"""The codec off the critical path: rows that have ended are decoded to audio on a worker thread, on a CUDA stream
of its own, while the batch goes on decoding frames (morph/decode/slots.py).

The frame loop is launch-bound (one CUDA graph a frame, small kernels), so the codec's wide convolutions fill the
GPU beside it; the thread holds the GIL only while it launches a piece's kernels, and waits for the piece's audio
with the GIL released. Rows go to the codec in pieces of bounded size (morph/codec.py), all rows that have ended
since the last piece together. A failure on the thread is raised in the caller at its next `ready` or `close`.
"""

from __future__ import annotations

import contextlib
import queue
import threading

import numpy as np
import torch

from .codec import decode_rows


class CodecWorker:
    def __init__(self, tokenizer, stream: "torch.cuda.Stream | None"):
        """stream: the CUDA stream to decode on (None on the CPU)."""
        self.tokenizer = tokenizer
        self.stream = stream
        self._inbox: queue.Queue = queue.Queue()
        self._outbox: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="morph-codec", daemon=True)
        self._thread.start()

    def submit(self, name, codes: torch.Tensor, ref: torch.Tensor | None) -> None:
        """Decode `codes` [frames, 16] (made on the caller's current stream) with an ICL voice's reference codes."""
        event = None
        if self.stream is not None:
            event = torch.cuda.Event()
            event.record()  # the codes are ready once the caller's stream gets here
        self._inbox.put((name, codes, ref, event))

    def ready(self) -> list[tuple[object, np.ndarray]]:
        """The rows decoded so far and not yet returned, as (name, float32 24 kHz audio)."""
        self._raise()
        out = []
        while not self._outbox.empty():
            out.append(self._outbox.get_nowait())
        return out

    def close(self, wait: bool = True) -> list[tuple[object, np.ndarray]]:
        """Decode what is left (wait) or drop it, stop the thread, and return what `ready` would."""
        if not wait:
            while not self._inbox.empty():
                self._inbox.get_nowait()
        self._inbox.put(None)
        self._thread.join()
        return self.ready() if wait else []

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _work(self) -> None:
        stop = False
        while not stop:
            items = [self._inbox.get()]
            while not self._inbox.empty():  # everything that ended meanwhile goes in the same pieces
                items.append(self._inbox.get_nowait())
            if items[-1] is None:
                stop = True
                items.pop()
            if not items or self._error is not None:
                continue
            try:
                stream = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
                with stream, torch.inference_mode():
                    for _, _, _, event in items:
                        if event is not None:
                            self.stream.wait_event(event)
                    audio = decode_rows(self.tokenizer, [codes for _, codes, _, _ in items],
                                        [ref for _, _, ref, _ in items])
                for (name, *_), wav in zip(items, audio):
                    self._outbox.put((name, wav))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread, raised there
                self._error = e
