"""The OpenAI-compatible routes: completions and chat for text generators (``generates: text``),
embeddings for encoders (``generates: embeddings``), the models list. ``protocol`` holds the
request and response documents, ``text`` what a generator receives and the platform's stop
strings, ``completions`` and ``embeddings`` one serving object each, ``routes`` the thin routes."""
