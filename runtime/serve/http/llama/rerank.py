"""llama-server's reranking routes (`/rerank`, `/reranking`, `/v1/rerank`, `/v1/reranking`), on the embedding
context (`Runtime.rerank`) with `rank` pooling (`turnstile serve --reranking`):

    {"query": str, "documents": [str, ...], "top_n"?: N}   (Jina's)  -> {"model", "object": "list", "usage",
                                                                         "results": [{"index", "relevance_score"}]}
    {"query": str, "texts": [str, ...], "return_text"?: bool}  (TEI's)  -> [{"index", "score", "text"?}]

Each document's prompt is llama-server's `format_prompt_rerank`: the model's `rerank` template with `{query}` and
`{document}` put in, or BOS? query EOS? SEP? document EOS? as the tokenizer adds them. Results are sorted by
score, the first `top_n` kept. Without `--reranking` a 501 as llama-server's; a missing or non-string query,
or no documents, a 400 with its messages.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from runtime.api import Runtime
from runtime.model_info import ModelInfo
from runtime.serve.http.errors import ApiError
from runtime.serve.http.llama.completion_request import _is_int
from runtime.serve.http.state import ServeState
from runtime.serve.http.template_routes import TemplateEndpoint

__all__ = ["PATHS", "rerank_tokens", "routes"]

PATHS = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")


async def rerank_tokens(rt: Runtime, info: ModelInfo, query: str, doc: str) -> list[int]:
    """llama-server's format_prompt_rerank."""
    if info.rerank_template is not None:
        prompt = info.rerank_template.replace("{query}", query).replace("{document}", doc)
        return await rt.tokenize(prompt, add_special=False, parse_special=True)
    q = await rt.tokenize(query, add_special=False, parse_special=False)
    d = await rt.tokenize(doc, add_special=False, parse_special=False)
    eos = info.eos_id if info.eos_id >= 0 else info.sep_id
    out = [info.bos_id] if info.add_bos else []
    out += q
    out += [eos] if info.add_eos else []
    out += [info.sep_id] if info.add_sep else []
    out += d
    out += [eos] if info.add_eos else []
    return out


def routes(state: ServeState, *, max_body_bytes: int) -> list[Route]:
    async def rerank(rt: Runtime, body: dict[str, Any]) -> Any:
        if not state.llama.reranking:
            raise ApiError(
                501, "This server does not support reranking. Start it with `--reranking`", type="not_supported_error"
            )
        tei = "texts" in body
        if "query" not in body:
            raise ApiError.bad_request('"query" must be provided')
        query = body["query"]
        if not isinstance(query, str):
            raise ApiError.bad_request('"query" must be a string')
        docs = body.get("documents", body.get("texts", []))
        if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
            raise ApiError.bad_request('"documents" must be a non-empty string array')
        top_n = body.get("top_n", len(docs))
        if not _is_int(top_n):
            raise ApiError.bad_request("'top_n' must be an integer", param="top_n")
        info = rt.model_info()
        inputs = [await rerank_tokens(rt, info, query, d) for d in docs]
        scores = await rt.rerank(inputs)
        label = "score" if tei else "relevance_score"
        with_text = tei and body.get("return_text") is True
        results = [{"index": i, label: s, **({"text": docs[i]} if with_text else {})} for i, s in enumerate(scores)]
        results.sort(key=lambda r: -r[label])  # stable: ties keep the documents' order, as std::sort need not
        results = results[: max(0, min(top_n, len(results)))]
        if tei:
            return results
        n = sum(len(t) for t in inputs)
        model = body.get("model") if isinstance(body.get("model"), str) else state.model
        return {"model": model, "object": "list", "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results}

    endpoint = TemplateEndpoint(state, rerank, max_body_bytes=max_body_bytes)
    return [Route(p, endpoint, methods=["POST"]) for p in PATHS]
