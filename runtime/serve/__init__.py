"""turnstile over HTTP and across processes. `runtime.serve.http` is the OpenAI-compatible HTTP API
(Starlette + uvicorn, the `serve` extra): `runtime.serve.http.app(rt)` is the ASGI app, `runtime.serve.http.
server.serve(...)` runs it (the `turnstile serve` command). `runtime.serve.cluster` runs replicas on Ray
Serve with an affinity router (the `cluster` extra). Importing this package loads neither."""
