"""What the benches speak (plain everyday sentences: the batch bench's script, the load test's requests) and the clip
their voices are cloned from: numpy only, so a client-only load test loads nothing of the engine."""

import numpy as np

# About 5 s of speech each (60-75 characters).
SENTENCES = (
    "Did you hear that? Something moved in the garden just now.",
    "It's only the wind, I promise you. Go back to sleep, please.",
    "The wind doesn't open the gate and walk across the gravel.",
    "Fine, I'll take a look outside. Where did you put the torch?",
    "In the drawer by the door, right where it always is, dear.",
    "Found it, but the batteries are nearly flat again, of course.",
    "Just hurry up and look, before whatever it is gets away.",
    "It's a fox! A little red fox, and it's eating the strawberries.",
)


def reference_wave(seconds: float = 4.0, sr: int = 24000) -> np.ndarray:
    """A voiced tone with a little noise: what a random-weight model's speaker encoder needs of a reference clip."""
    rng = np.random.RandomState(0)
    t = np.arange(int(seconds * sr)) / sr
    wave = 0.3 * np.sin(2 * np.pi * 190 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.03 * rng.randn(t.size)
    return wave.astype(np.float32)
