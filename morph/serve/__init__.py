"""An OpenAI-compatible speech server on the engine core (optional: `pip install .[serve]`, `cli.py serve`).

`app.py` holds the HTTP routes (FastAPI), `lifecycle.py` the server's state (loading, serving, draining, failed), the
door every request passes and the process's end, `protocol.py` the request's fields and the errors' shape, `voices.py`
the saved voices' folder, `audio_io.py` the audio formats a request sends and a reply takes; the requests themselves
run through morph/live_engine.py, the one continuous batch that every request joins while it runs."""
