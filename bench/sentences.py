"""Plain everyday sentences the benches speak (the batch bench's script, the load test's requests): no imports, so
a client-only load test loads nothing of the engine."""

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
