"""An OpenAI-compatible speech server on the engine core (optional: `pip install .[serve]`, `cli.py serve`).

`app.py` holds the HTTP routes (FastAPI), `voices.py` the saved voices' folder, `audio_io.py` the audio formats a
request sends and a reply takes; the requests themselves run through morph/live_engine.py, the one continuous batch
that every request joins while it runs."""
