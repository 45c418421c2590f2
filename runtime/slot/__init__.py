"""The slot, in the worker thread: the executor (prompt cache update, prefix reuse, checkpoints, prefill,
decode), the state it saves (`state`), stop strings (`stops`) and UTF-8 safe detokenizing (`detok`)."""
