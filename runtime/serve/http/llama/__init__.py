"""llama-server's own routes and options beside turnstile's (a drop-in for llama-server's clients)."""
