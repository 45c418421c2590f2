"""OpenAI chat completions (POST /v1/chat/completions): the request and reply bodies (`schema`), their
conversion to and from the Runtime's turn (`convert`), the endpoint (`endpoint`) and its stream (`stream`)."""
