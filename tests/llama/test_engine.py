"""The engine on real llama.cpp: tiny generated models of each memory kind, and SmolLM2."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from runtime.errors import ContextOverflow, ModelLoadError
from runtime.llama.engine import Engine, MemoryKind
from sessions import Sampling
from tests.support.tiny_models import KINDS

ARCHS = ["llama", "mamba", "jamba", "gemma3"]
PROMPT = "<|im_start|>user\nhello world, tell me a story about the sea<|im_end|>\n<|im_start|>assistant\n"


def greedy(eng: Engine, prompt: list[int], n: int) -> list[int]:
    eng.clear()
    eng.decode(prompt, 0)
    out: list[int] = []
    with eng.sampler(temperature=0.0) as s:
        for i in range(n):
            tok = s.sample()
            out.append(tok)
            eng.decode([tok], len(prompt) + i)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_loads_with_its_kind(
    arch: str, tiny_models: dict[str, Path], make_engine: Callable[..., Engine]
) -> None:
    eng = make_engine(tiny_models[arch])
    assert eng.kind == MemoryKind(KINDS[arch])
    assert eng.can_truncate is (arch == "llama")
    assert eng.n_ctx == 1024
    assert eng.n_vocab == 512
    assert len(eng.fingerprint) == 32


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_decoding_is_deterministic(
    arch: str, tiny_models: dict[str, Path], make_engine: Callable[..., Engine]
) -> None:
    eng = make_engine(tiny_models[arch])
    prompt = eng.tokenize(PROMPT)
    first = greedy(eng, prompt, 12)
    assert greedy(eng, prompt, 12) == first
    other = make_engine(tiny_models[arch])
    assert greedy(other, prompt, 12) == first


@pytest.mark.parametrize("arch", ARCHS)
def test_state_save_restore_gives_identical_logits(
    arch: str, tiny_models: dict[str, Path], make_engine: Callable[..., Engine]
) -> None:
    eng = make_engine(tiny_models[arch])
    a = eng.tokenize(PROMPT)
    cont = eng.tokenize("more about the moon", add_special=False)
    eng.clear()
    eng.decode(a, 0)
    saved = eng.state_get()
    eng.decode(cont, len(a))
    expected = eng.logits()
    # evaluate something else entirely, then restore and continue
    eng.clear()
    eng.decode(eng.tokenize("what is the idea of this test"), 0)
    assert eng.state_set(saved)
    assert eng.pos_max() == len(a) - 1
    eng.decode(cont, len(a))
    np.testing.assert_array_equal(eng.logits(), expected)


@pytest.mark.parametrize("arch", ["mamba", "jamba"])
def test_recurrent_suffix_removal_refused_checkpoint_rolls_back(
    arch: str, tiny_models: dict[str, Path], make_engine: Callable[..., Engine]
) -> None:
    eng = make_engine(tiny_models[arch])
    a = eng.tokenize(PROMPT)
    cont = eng.tokenize("the sun and the moon", add_special=False)
    eng.clear()
    eng.decode(a, 0)
    cp = eng.state_get(partial=True)
    assert 0 < len(cp) < eng.state_size() or arch == "mamba"
    eng.decode(cont, len(a))
    expected = eng.logits()
    eng.decode(eng.tokenize("a detour", add_special=False), len(a) + len(cont))
    assert eng.seq_rm(len(a), -1) is False  # a recurrent memory cannot drop a suffix
    assert eng.state_set(cp, partial=True)
    if arch == "jamba":
        assert eng.seq_rm(len(a), -1) is True  # the attention part drops the suffix
    eng.decode(cont, len(a))
    np.testing.assert_array_equal(eng.logits(), expected)


def test_transformer_truncates_a_suffix(tiny_llama: Path, make_engine: Callable[..., Engine]) -> None:
    eng = make_engine(tiny_llama)
    a = eng.tokenize(PROMPT)
    cont = eng.tokenize("the sun", add_special=False)
    eng.clear()
    eng.decode(a + cont, 0)
    expected = eng.logits()
    eng.decode(eng.tokenize("detour", add_special=False), len(a) + len(cont))
    assert eng.seq_rm(len(a), -1) is True
    assert eng.pos_max() == len(a) - 1
    eng.decode(cont, len(a))
    np.testing.assert_allclose(eng.logits(), expected, rtol=0, atol=1e-4)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match=r"nope\.gguf") as e:
        Engine(path)
    assert "no such file" in str(e.value)


def test_text_file_renamed_gguf(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("this is not a model\n")
    with pytest.raises(ModelLoadError, match=r"notes\.gguf") as e:
        Engine(path)
    assert "not a GGUF file" in str(e.value)


def test_truncated_gguf(tmp_path: Path, tiny_llama: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_llama.read_bytes()[: tiny_llama.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=r"cut\.gguf"):
        Engine(path)


def test_context_overflow_in_decode(tiny_llama: Path, make_engine: Callable[..., Engine]) -> None:
    eng = make_engine(tiny_llama)
    with pytest.raises(ContextOverflow):
        eng.decode([5] * 10, eng.n_ctx - 5)


def test_render_finds_message_starts(tiny_llama: Path, make_engine: Callable[..., Engine]) -> None:
    eng = make_engine(tiny_llama)
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "yes"},
        {"role": "user", "content": "why"},
    ]
    r = eng.render(msgs)
    assert r.text.endswith("<|im_start|>assistant\n")
    im_start = eng.tokenize("<|im_start|>", add_special=False)
    assert len(im_start) == 1
    starts = [i for i, t in enumerate(r.tokens) if t == im_start[0]]
    assert r.message_starts == starts[:4]
    assert r.user_starts == [starts[1], starts[3]]


def test_incremental_detokenizer_is_utf8_safe() -> None:
    from runtime.slot.detok import IncrementalText

    d = IncrementalText()
    data = "héllo ✓".encode()
    out = "".join(d.feed(data[i : i + 1]) for i in range(len(data)))
    assert out + d.flush() == "héllo ✓"
    d2 = IncrementalText()
    assert d2.feed("✓".encode()[:2]) == ""
    assert d2.feed("✓".encode()[2:]) == "✓"


def test_smollm2_template_matches_llama_cpp_python(smollm2_path: Path, make_engine: Callable[..., Engine]) -> None:
    import llama_cpp

    msgs = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    eng = make_engine(smollm2_path)
    rendered = eng.render(msgs)
    ours = rendered.tokens
    llm = llama_cpp.Llama(str(smollm2_path), n_ctx=512, verbose=False)
    try:
        captured: list[list[int]] = []
        original = llm.create_completion

        def spy(prompt: list[int], **kw: object) -> object:
            captured.append(list(prompt))
            raise StopIteration

        llm.create_completion = spy  # type: ignore[method-assign]
        with pytest.raises(StopIteration):
            llm.create_chat_completion(messages=msgs, max_tokens=1)  # type: ignore[arg-type]
        llm.create_completion = original  # type: ignore[method-assign]
    finally:
        llm.close()
    assert captured and captured[0] == ours
    assert rendered.text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert rendered.text.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert rendered.user_starts == [ours.index(ours[0], 1)]


def test_render_without_spans_gives_the_same_tokens(tiny_llama: Path, make_engine: Callable[..., Engine]) -> None:
    eng = make_engine(tiny_llama)
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "yes"}]
    full, bare = eng.render(msgs), eng.render(msgs, spans=False)
    assert (bare.text, bare.tokens) == (full.text, full.tokens)
    assert bare.message_starts == [] and bare.user_starts == []


def test_greedy_argmax_is_the_sampler_chain(smollm2_path: Path, make_engine: Callable[..., Engine]) -> None:
    """The greedy fast path (an argmax on the logits in place) picks what llama.cpp's chain picks, token by token,
    on SmolLM2's 49,152-token vocabulary; -1 (the chain decides) where the highest logit is not one token."""
    eng = make_engine(smollm2_path)
    prompt = eng.tokenize(PROMPT)
    eng.clear()
    eng.decode(prompt, 0)
    pos = len(prompt)
    with eng.sampler(Sampling(temperature=0.0)) as fast, eng.sampler(Sampling(temperature=0.0)) as chain:
        chain._argmax = False  # the llama.cpp chain, as before the fast path
        for _ in range(24):
            tok = fast.sample()
            assert tok == chain.sample() == int(np.argmax(eng.logits()))
            eng.decode([tok], pos)
            pos += 1
    logits = eng.logits()
    assert eng.argmax() == int(np.argmax(logits))
    assert eng.argmax(idx=10_000) == -1  # no such output: no logits


def test_argmax_ties_and_nan_go_to_the_chain(smollm2_path: Path, make_engine: Callable[..., Engine]) -> None:
    """`argmax` reads llama.cpp's logits in place (a view per buffer address): a unique highest logit anywhere
    (the last token included) is returned, a tie for the highest (before or after the first) or a NaN gives -1."""
    eng = make_engine(smollm2_path)
    eng.clear()
    eng.decode(eng.tokenize(PROMPT), 0)
    buf = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(eng.ctx, -1), shape=(eng.n_vocab,))  # writable
    top = int(np.argmax(buf))
    assert eng.argmax() == top
    high = float(buf[top]) + 1.0
    buf[eng.n_vocab - 1] = high  # a unique maximum at the very end
    assert eng.argmax() == eng.n_vocab - 1
    buf[7] = high  # tied with it, earlier
    assert eng.argmax() == -1
    buf[eng.n_vocab - 1] = 0.0
    assert eng.argmax() == 7
    buf[12_345] = high  # tied, later
    assert eng.argmax() == -1
    buf[12_345] = float("nan")
    assert eng.argmax() == -1
