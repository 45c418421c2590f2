"""The only package that imports `llama_cpp`: the engine (model, context, decode, state copies), the sampler,
chat templating and the per-session incremental renderer, host facts and the default model. Importing the
package itself loads nothing; its modules do."""
