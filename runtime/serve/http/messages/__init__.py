"""The Anthropic Messages API: the request bodies and their conversion to the Runtime's turn (`convert`),
the endpoints (`endpoint`: /v1/messages and /v1/messages/count_tokens) and the event stream (`stream`)."""
