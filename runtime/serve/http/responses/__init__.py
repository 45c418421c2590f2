"""The OpenAI Responses API, stateful: the request and input items (`schema`), their conversion to the
Runtime's turn and back (`convert`), the stored responses (`store`), the endpoints (`endpoint`) and the event
stream (`stream`)."""
