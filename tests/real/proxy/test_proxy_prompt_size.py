"""``proxy.prompt_size``: the size bound never exceeds the real token count, and is only claimed where
it holds; a prompt that cannot fit the context is refused before it is tokenized (no tokenizer call)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    from proxy_fixtures import ScriptedEngine, ServerThread, build_tiny_tokenizer, proxy_config, shared_tiny_dir
    from proxy_fixtures import start_proxy
except ImportError:
    from .proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, proxy_config,  # noqa: F401
                                 shared_tiny_dir, start_proxy)
from hypothesis_budget import examples

from gyre.real.proxy.config import Limits
from gyre.real.proxy.prompt_size import PromptSize, max_bytes_per_token
from gyre.real.proxy.tokenize import ChatTokenizer

pytestmark = pytest.mark.timeout(120)
CORPUS = ["hello world agent tool call", "한국어 텍스트 é è ü 中文 日本語", "def f(x):\n    return x + 1",
          "{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\"}}"] * 50


def _fast(tokenizer_object, **kwargs):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tokenizer_object, **kwargs)


def qwen_like():
    """Byte-level BPE behind NFC and a splitting regex, as Qwen2's tokenizer.json has it."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, show_progress=False, special_tokens=[
        "<|im_start|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return _fast(tok)


def sentencepiece_like():
    """BPE over characters with byte fallback and ``▁`` for spaces (Llama 2's shape), an unknown token."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=False))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=700, show_progress=False, special_tokens=[
        "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]))
    return _fast(tok, unk_token="<unk>")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from transformers import AutoTokenizer

    tiny = AutoTokenizer.from_pretrained(str(build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))))
    return {"tiny": tiny, "qwen-like": qwen_like(), "sentencepiece-like": sentencepiece_like()}


TEXTS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300) | st.text(
    st.sampled_from("a e\u0301\u0304\u1100\u1161\u11a8\uff21\U0001d400\ufdfa \n<|im_start|>"), max_size=300)


@pytest.mark.parametrize("name", ["tiny", "qwen-like", "sentencepiece-like"])
def test_the_bound_never_exceeds_the_token_count(tokenizers, name):
    tokenizer = tokenizers[name]
    size = PromptSize(tokenizer)
    assert size.bytes_per_token is not None, "a tokenizer the bound is meant for was refused"

    @settings(max_examples=examples(300))
    @given(TEXTS)
    def check(text):
        assert size.at_least(text) <= len(tokenizer.encode(text, add_special_tokens=False))

    check()


def longest_entry(tokenizer, keep=lambda text: True) -> str:
    """The text of the vocabulary entry of most UTF-8 bytes (among those ``keep`` accepts)."""
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    return max((t for t in texts if "\ufffd" not in t and keep(t)), key=lambda t: len(t.encode()))


@pytest.mark.parametrize("name", ["tiny", "qwen-like"])
def test_the_bound_is_exact_on_runs_of_the_longest_entry(tokenizers, name):
    """The worst case the bound is built for: each token as long as a token can be (here an added token;
    the SentencePiece-like one puts a ``▁`` before the first piece only, so a run is not one piece each)."""
    tokenizer = tokenizers[name]
    text = longest_entry(tokenizer) * 40
    tokens = len(tokenizer.encode(text, add_special_tokens=False))
    assert PromptSize(tokenizer).at_least(text) <= tokens <= 41


def test_the_bound_counts_the_normalized_text(tokenizers):
    """NFKC maps a 4-byte mathematical bold letter to a 1-byte ASCII one: the raw size would overstate."""
    tokenizer = tokenizers["sentencepiece-like"]
    words = [t[1:] for t in tokenizer.convert_ids_to_tokens(range(len(tokenizer)))
             if t[:1] == "\u2581" and t[1:].isascii() and t[1:].isalpha()]
    word = max(words, key=len)
    bold = "".join(chr(0x1D400 + ord(c) - ord("A")) if c.isupper() else chr(0x1D41A + ord(c) - ord("a"))
                   for c in word)
    text = f" {bold}" * 40  # one token per word once normalized
    assert PromptSize(tokenizer).at_least(text) <= len(tokenizer.encode(text, add_special_tokens=False))


def test_the_bound_is_tight_enough_to_matter(tokenizers):
    """Within a factor of 30 on plain text: a 10 MB prompt is refused against any context below ~300k."""
    tokenizer = tokenizers["tiny"]
    text = " ".join(["hello world agent tool call"] * 2000)
    assert len(tokenizer.encode(text, add_special_tokens=False)) <= 30 * PromptSize(tokenizer).at_least(text)


def test_no_bound_is_claimed_where_a_token_may_cover_unbounded_text():
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "a": 1, "b": 2}
    cases = {"WordPiece": Tokenizer(models.WordPiece(vocab, unk_token="<unk>")),
             "fused unknowns": Tokenizer(models.BPE(vocab, [], unk_token="<unk>", fuse_unk=True)),
             "Whitespace drops spaces": Tokenizer(models.BPE(vocab, [])),
             "Split removing its matches": Tokenizer(models.BPE(vocab, [])),
             "lstrip added token": Tokenizer(models.BPE(vocab, []))}
    cases["Whitespace drops spaces"].pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit()])
    cases["Split removing its matches"].pre_tokenizer = pre_tokenizers.Split(" ", behavior="removed")
    cases["lstrip added token"].add_special_tokens([AddedToken("<mask>", lstrip=True)])
    for name, tok in cases.items():
        assert max_bytes_per_token(_fast(tok)) is None, name
    assert PromptSize(_fast(cases["WordPiece"])).at_least("a" * 1000) == 0


class CountingChat(ChatTokenizer):
    """The proxy's tokenizer (passed as ``ProxyServer(chat=...)``), noting the size of every text it encodes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.encoded: list[int] = []

    def encode(self, text: str) -> list[int]:
        self.encoded.append(len(text))
        return super().encode(text)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    engine = ScriptedEngine(model, lambda prompt: "ok")
    engine_thread = ServerThread(engine.application).start()
    config = proxy_config(model, tmp_path_factory.mktemp("records"), {"e0": engine_thread.url},
                          limits=Limits(max_context_tokens=4096))
    chat = CountingChat(config.model_path, stop_tokens=config.stop_tokens)
    proxy_thread, server = start_proxy(config, chat=chat)
    yield {"url": proxy_thread.url, "server": server, "chat": chat}
    proxy_thread.stop()
    engine_thread.stop()


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/v1/messages", data=json.dumps(body).encode(), method="POST",
                                     headers={"x-api-key": "key-a", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_prompt_too_big_for_the_context_is_refused_without_tokenizing_it(stack):
    encoded = stack["chat"].encoded
    del encoded[:]
    huge = " ".join(["hello world agent tool call"] * 20_000)  # ~540 KB: >= 20k tokens by the bound alone
    status, body = post(stack["url"], {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": huge}]})
    assert status == 400 and body["error"]["type"] == "invalid_request_error", body
    assert "prompt is too long" in body["error"]["message"] and "at least" in body["error"]["message"]
    assert max(encoded, default=0) < 1000, "the huge prompt was tokenized before its refusal"
    assert post(stack["url"], {"model": "m", "max_tokens": 16,
                               "messages": [{"role": "user", "content": "hi"}]})[0] == 200
