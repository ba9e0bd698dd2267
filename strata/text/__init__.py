"""Text in and out of the model: tokenizer.py (text <-> ids, built from the GGUF's vocabulary by
tokenizer_build.py), chat_template.py (a conversation -> the prompt text, defaults in templates/),
detok.py (ids -> text as a stream, never splitting a character) and stops.py (stop strings over that
stream)."""
