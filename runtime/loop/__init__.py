"""The event-loop side: the scheduler and its policies, turns (load, render, run, commit), streams, reply
constraints, the context window, argument checks and the agent loop. Never imports llama.cpp or the slot
(a test over the import graph keeps it so); it reaches the model only through `runtime.backend.SlotBackend`."""
